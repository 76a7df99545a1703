#include <gtest/gtest.h>

#include "base/error.h"
#include "image/digest.h"
#include "image/reference.h"

namespace openshell::image {
namespace {

TEST(ImageReference, DockerHubNamesGetTheirDomainAndLibrary) {
  Reference r = parse_reference("busybox");
  EXPECT_EQ(r.domain, "docker.io");
  EXPECT_EQ(r.repository, "library/busybox");
  EXPECT_EQ(r.tag, "latest");
  EXPECT_EQ(r.canonical(), "docker.io/library/busybox:latest");
  EXPECT_EQ(r.familiar(), "busybox:latest");
  EXPECT_EQ(r.registry_host(), "registry-1.docker.io");
  EXPECT_FALSE(r.is_local_registry());
  EXPECT_EQ(parse_reference("org/tool:1.2").canonical(), "docker.io/org/tool:1.2");
  EXPECT_EQ(parse_reference("index.docker.io/library/debian:12").familiar(), "debian:12");
}

TEST(ImageReference, DomainsPortsTagsAndDigests) {
  Reference r = parse_reference("localhost:5000/tools/x:v1");
  EXPECT_EQ(r.domain, "localhost:5000");
  EXPECT_EQ(r.repository, "tools/x");
  EXPECT_EQ(r.tag, "v1");
  EXPECT_TRUE(r.is_local_registry());
  EXPECT_EQ(r.familiar(), "localhost:5000/tools/x:v1");
  EXPECT_TRUE(parse_reference("127.0.0.1:5000/x").is_local_registry());
  EXPECT_TRUE(parse_reference("[::1]:5000/x").is_local_registry());
  EXPECT_EQ(parse_reference("nvcr.io/nvidia/base/ubuntu:24.04").repository, "nvidia/base/ubuntu");
  const std::string d = "sha256:" + std::string(64, 'a');
  Reference pinned = parse_reference("ghcr.io/o/r@" + d);
  EXPECT_EQ(pinned.tag, "");
  EXPECT_EQ(pinned.digest, d);
  EXPECT_EQ(pinned.manifest_key(), d);
  EXPECT_EQ(pinned.canonical(), "ghcr.io/o/r@" + d);
  EXPECT_EQ(parse_reference("r:t@" + d).canonical(), "docker.io/library/r:t@" + d);
}

TEST(ImageReference, BadReferencesNameTheirFault) {
  auto message = [](const std::string& text) {
    try {
      parse_reference(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message("").find("empty"), std::string::npos);
  EXPECT_NE(message("Busybox").find("'Busybox'"), std::string::npos);
  EXPECT_NE(message("a//b").find("empty path component"), std::string::npos);
  EXPECT_NE(message("/nothere").find("image reference"), std::string::npos);
  EXPECT_NE(message("x:bad/tag").find("x:bad/tag"), std::string::npos);
  EXPECT_NE(message("x:-tag").find("the tag"), std::string::npos);
  EXPECT_NE(message("x@sha256:12").find("digest"), std::string::npos);
  EXPECT_NE(message("x@md5:" + std::string(32, '0')).find("digest"), std::string::npos);
  EXPECT_NE(message("host:99999999/x").find("registry host"), std::string::npos);
  EXPECT_NE(message("../x").find("'..'"), std::string::npos);
  EXPECT_EQ(message("a__b/c.d-e_f:T_a.g-1"), "(accepted)");
}

TEST(ImageDigest, Sha256MatchesKnownValues) {
  EXPECT_EQ(sha256_digest(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.update("ab");
  h.update("c");
  EXPECT_EQ(h.bytes(), 3u);
  EXPECT_EQ(h.digest(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(is_digest(sha256_digest("x")));
  EXPECT_FALSE(is_digest("sha256:" + std::string(64, 'A')));
  EXPECT_THROW(digest_hex("sha512:00", "config"), Error);
}

}  // namespace
}  // namespace openshell::image
