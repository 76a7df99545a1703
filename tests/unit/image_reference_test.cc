#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"
#include "image/digest.h"
#include "image/reference.h"
#include "image/registries.h"

namespace openshell::image {
namespace {

RegistryConfig with_default(std::string registry, std::string prefix = "") {
  RegistryConfig c;
  c.default_registry = std::move(registry);
  c.default_source = "test";
  c.one_component_prefix = std::move(prefix);
  return c;
}

std::string refusal(const std::string& text, const RegistryConfig& config) {
  try {
    parse_reference(text, config);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ImageReference, ShortNamesTakeTheConfiguredRegistryAndPrefix) {
  const RegistryConfig c = with_default("registry.example", "library");
  Reference r = parse_reference("busybox", c);
  EXPECT_TRUE(r.short_name);
  EXPECT_EQ(r.domain, "registry.example");
  EXPECT_EQ(r.repository, "library/busybox");
  EXPECT_EQ(r.tag, "latest");
  EXPECT_EQ(r.canonical(), "registry.example/library/busybox:latest");
  EXPECT_EQ(r.familiar(c), "busybox:latest");
  EXPECT_EQ(r.registry_host(c), "registry.example");
  EXPECT_FALSE(r.is_local_registry());
  // A path of two components takes no prefix.
  EXPECT_EQ(parse_reference("org/tool:1.2", c).canonical(), "registry.example/org/tool:1.2");
  EXPECT_EQ(parse_reference("org/tool:1.2", c).familiar(c), "org/tool:1.2");
  // Without a configured prefix, none is added.
  const RegistryConfig bare = with_default("mirror.test:5000");
  EXPECT_EQ(parse_reference("busybox", bare).canonical(), "mirror.test:5000/busybox:latest");
  EXPECT_EQ(parse_reference("busybox", bare).familiar(bare), "busybox:latest");
  // Another registry's names stay whole.
  EXPECT_EQ(parse_reference("other.example/library/x", c).familiar(c),
            "other.example/library/x:latest");
}

TEST(ImageReference, ShortNamesWithoutADefaultAreRefusedWithBothFixes) {
  const RegistryConfig none;
  std::string why = refusal("busybox:1", none);
  EXPECT_NE(why.find("'busybox:1'"), std::string::npos) << why;
  EXPECT_NE(why.find("names no registry"), std::string::npos) << why;
  EXPECT_NE(why.find("REGISTRY/NAME[:TAG]"), std::string::npos) << why;
  EXPECT_NE(why.find("OPENSHELL_DEFAULT_REGISTRY"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
  EXPECT_NE(refusal("org/tool", none), "(accepted)");
  // Qualified and local names need no default.
  EXPECT_EQ(parse_reference("registry.example/o/r:2", none).canonical(), "registry.example/o/r:2");
  EXPECT_EQ(parse_reference("localhost/app", none).canonical(), "localhost/app:latest");
  EXPECT_EQ(parse_reference("registry.example/o/r:2", none).familiar(none),
            "registry.example/o/r:2");
  // The text as written keeps a short name without a domain.
  Reference text = parse_reference_text("busybox");
  EXPECT_TRUE(text.short_name);
  EXPECT_EQ(text.domain, "");
  EXPECT_EQ(text.repository, "busybox");
}

class RegistriesConf : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/osh-registries-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    conf_ = dir_ + "/registries.conf";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(conf_) << text; }
  RegistryConfig load(std::map<std::string, std::string> env = {}) {
    env["OPENSHELL_REGISTRIES_CONF"] = conf_;
    return load_registry_config([&env](const char* name) -> const char* {
      auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    });
  }
  std::string dir_, conf_;
};

TEST_F(RegistriesConf, FirstSearchRegistryIsTheDefaultAndLocationsMap) {
  write(R"(unqualified-search-registries = ["one.example", "two.example"]

[[registry]]
prefix = "one.example"
location = "api.one.example:8443"

[[registry]]
prefix = "paths.example/team"
location = "elsewhere.example/team"
)");
  RegistryConfig c = load();
  EXPECT_EQ(c.default_registry, "one.example");
  EXPECT_NE(c.default_source.find(conf_), std::string::npos);
  Reference r = parse_reference("tool", c);
  EXPECT_EQ(r.canonical(), "one.example/tool:latest");
  // The name keeps the registry's; only the API's address is mapped.
  EXPECT_EQ(r.registry_host(c), "api.one.example:8443");
  EXPECT_EQ(parse_reference("two.example/x", c).registry_host(c), "two.example");
  // A mapping of paths is not a whole registry's: not used.
  EXPECT_EQ(parse_reference("paths.example/team/x", c).registry_host(c), "paths.example");
}

TEST_F(RegistriesConf, TheVariablesWinAndAMissingFileGivesNothing) {
  write("unqualified-search-registries = [\"one.example\"]\n");
  RegistryConfig c = load({{"OPENSHELL_DEFAULT_REGISTRY", "registry.test"},
                           {"OPENSHELL_ONE_COMPONENT_PREFIX", "library"}});
  EXPECT_EQ(c.default_registry, "registry.test");
  EXPECT_EQ(c.default_source, "OPENSHELL_DEFAULT_REGISTRY");
  EXPECT_EQ(parse_reference("busybox", c).canonical(), "registry.test/library/busybox:latest");
  std::filesystem::remove(conf_);
  c = load();
  EXPECT_EQ(c.default_registry, "");
  EXPECT_NE(refusal("busybox", c), "(accepted)");
  EXPECT_THROW(load({{"OPENSHELL_DEFAULT_REGISTRY", "https://registry.test/"}}), Error);
}

TEST_F(RegistriesConf, AFileAtFaultNamesItsLine) {
  write("unqualified-search-registries = \"one.example\"\n");
  try {
    load();
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(conf_ + ":1"), std::string::npos) << e.what();
  }
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
  EXPECT_EQ(parse_reference("cr.example/vendor/base/ubuntu:24.04").repository,
            "vendor/base/ubuntu");
  const std::string d = "sha256:" + std::string(64, 'a');
  Reference pinned = parse_reference("registry.example/o/r@" + d);
  EXPECT_EQ(pinned.tag, "");
  EXPECT_EQ(pinned.digest, d);
  EXPECT_EQ(pinned.manifest_key(), d);
  EXPECT_EQ(pinned.canonical(), "registry.example/o/r@" + d);
  EXPECT_EQ(parse_reference("r:t@" + d, with_default("registry.example", "library")).canonical(),
            "registry.example/library/r:t@" + d);
}

TEST(ImageReference, BadReferencesNameTheirFault) {
  auto message = [](const std::string& text) {
    try {
      parse_reference(text, with_default("registry.example"));
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
