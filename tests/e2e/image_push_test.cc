// image push end to end: a store image sent to a real registry (Debian's
// docker-registry on loopback) comes back the same through a pull into
// another store and through skopeo; a second repository of the same
// registry gets the layers by a cross-repository mount, not an upload; and
// what cannot be pushed says so in one line. As root and rootless.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "image_helpers.h"

using testing::HasSubstr;
using testing::Not;
using json = nlohmann::json;

namespace e2e {
namespace {

using image_helpers::busybox_layout;
using image_helpers::LoggingRegistry;
using image_helpers::q;
using image_helpers::sh;

class ImagePush : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    if (busybox_layout().empty()) GTEST_SKIP() << "the busybox image could not be built";
    static int counter = 0;
    const std::string tag = mode_name(mode()) + "-" + std::to_string(++counter);
    home_ = make_dir(mode(), "push-" + tag, 0700);
    other_ = make_dir(mode(), "push-other-" + tag, 0700);
  }
  void TearDown() override {
    for (const auto& home : {home_, other_})
      if (!home.empty()) {
        os(home, {"gateway", "stop"});
        EXPECT_EQ(file_contents_of_dir(home + "/images/tmp"), "") << "work left in the store";
      }
    ModeTest::TearDown();
  }
  Result os(const std::string& home, const std::vector<std::string>& args) {
    Options o;
    o.env.push_back("OPENSHELL_HOME=" + home);
    o.timeout_s = 120;
    return openshell(mode(), args, o);
  }
  json inspect(const std::string& home, const std::string& name) {
    Result r = os(home, {"image", "inspect", name});
    EXPECT_EQ(r.status, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    return j.is_array() && !j.empty() ? j[0] : j;
  }
  std::vector<std::string> diff_ids(const json& record) {
    std::vector<std::string> out;
    if (record.contains("layers"))
      for (const auto& l : record["layers"]) out.push_back(l.value("diff_id", ""));
    return out;
  }
  void import_busybox() {
    Result r = os(home_, {"image", "import", busybox_layout(), "bb"});
    ASSERT_EQ(r.status, 0) << r.err;
  }
  std::string repo(const std::string& name) {
    std::string m = mode_name(mode());
    for (auto& ch : m) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return "push-" + m + "/" + name;
  }

  std::string home_, other_;
};

TEST_P(ImagePush, APushedImagePullsBackTheSame) {
  LoggingRegistry registry;
  if (!registry.ok()) GTEST_SKIP() << "docker-registry did not start (package docker-registry)";
  import_busybox();
  const std::string ref = registry.host() + "/" + repo("bb") + ":1";
  Result pushed = os(home_, {"image", "push", "bb", ref, "-o", "json"});
  ASSERT_EQ(pushed.status, 0) << pushed.err;
  json result = json::parse(pushed.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << pushed.out;
  const json mine = inspect(home_, "bb");
  EXPECT_EQ(result.value("digest", ""), mine.value("digest", ""));
  ASSERT_EQ(result["layers"].size(), 1u);
  EXPECT_EQ(result["layers"][0].value("action", ""), "uploaded");
  EXPECT_THAT(registry.log(), HasSubstr("PATCH /v2/" + repo("bb") + "/blobs/uploads/"));

  // Into another store: the same manifest, config and layers.
  Result pulled = os(other_, {"image", "pull", ref});
  ASSERT_EQ(pulled.status, 0) << pulled.err;
  const json theirs = inspect(other_, ref);
  EXPECT_EQ(theirs.value("digest", "x"), mine.value("digest", "y"));
  EXPECT_EQ(theirs.value("id", "x"), mine.value("id", "y"));
  EXPECT_EQ(diff_ids(theirs), diff_ids(mine));
  EXPECT_FALSE(diff_ids(mine).empty());

  // And another client reads it as the same image.
  image_helpers::Shell skopeo =
      sh("skopeo inspect --tls-verify=false docker://" + q(ref) + " 2>&1");
  if (skopeo.status == 127) GTEST_SKIP() << "skopeo is not installed";
  ASSERT_EQ(skopeo.status, 0) << skopeo.out;
  EXPECT_EQ(image_helpers::field_of(skopeo.out, "Digest"), mine.value("digest", ""));

  // A second push of the same image sends nothing: every blob is there.
  Result again = os(home_, {"image", "push", "bb", ref, "-o", "json"});
  ASSERT_EQ(again.status, 0) << again.err;
  json second = json::parse(again.out, nullptr, false);
  EXPECT_EQ(second["layers"][0].value("action", ""), "exists");
  EXPECT_EQ(second["config"].value("action", ""), "exists");
}

TEST_P(ImagePush, ASecondRepositoryMountsTheLayersInsteadOfUploading) {
  LoggingRegistry registry;
  if (!registry.ok()) GTEST_SKIP() << "docker-registry did not start (package docker-registry)";
  import_busybox();
  ASSERT_EQ(os(home_, {"image", "push", "bb", registry.host() + "/" + repo("first") + ":1"}).status,
            0);
  const std::string before = registry.log();
  Result second = os(
      home_, {"image", "push", "bb", registry.host() + "/" + repo("second") + ":1", "-o", "json"});
  ASSERT_EQ(second.status, 0) << second.err;
  json result = json::parse(second.out, nullptr, false);
  EXPECT_EQ(result["layers"][0].value("action", ""), "mounted");
  // What the registry saw: a mount from the first repository, no layer upload.
  const std::string seen = registry.log().substr(before.size());
  EXPECT_THAT(seen, HasSubstr("POST /v2/" + repo("second") + "/blobs/uploads/?mount=sha256"));
  EXPECT_THAT(seen, HasSubstr("from=" + repo("first").replace(repo("first").find('/'), 1, "%2F")));
  const std::string layer = result["layers"][0].value("digest", "");
  EXPECT_THAT(seen, Not(HasSubstr("digest=" + layer.substr(0, 6) + "%3A" + layer.substr(7))));
  // And the second repository serves the image whole.
  Result pulled = os(other_, {"image", "pull", registry.host() + "/" + repo("second") + ":1"});
  EXPECT_EQ(pulled.status, 0) << pulled.err;
}

TEST_P(ImagePush, WhatCannotBePushedSaysSoInOneLine) {
  import_busybox();
  auto one_line = [](const Result& r) {
    EXPECT_EQ(r.status, 125) << r.out << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  Result missing = os(home_, {"image", "push", "no-such-image", "127.0.0.1:5/x:1"});
  one_line(missing);
  EXPECT_THAT(missing.err, HasSubstr("no-such-image: not in the store"));

  Result bad = os(home_, {"image", "push", "bb", "127.0.0.1:5/Bad Name:1"});
  one_line(bad);
  EXPECT_THAT(bad.err, HasSubstr("Bad Name"));

  Result digest =
      os(home_, {"image", "push", "bb", "127.0.0.1:5/x@sha256:" + std::string(64, 'a')});
  one_line(digest);
  EXPECT_THAT(digest.err, HasSubstr("give a tag, not a digest"));

  // Nothing listens on this port: the line names the registry and the blob.
  const uint16_t port = image_helpers::free_port();
  Result unreachable =
      os(home_, {"image", "push", "-q", "bb", "127.0.0.1:" + std::to_string(port) + "/x/y:1"});
  one_line(unreachable);
  EXPECT_THAT(unreachable.err, HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(unreachable.err, HasSubstr("blob sha256:"));

  // A record whose layer blob is gone (stored before blobs were kept).
  const json mine = inspect(home_, "bb");
  std::string manifest =
      file_contents(home_ + "/images/blobs/sha256/" + mine.value("digest", "").substr(7));
  json m = json::parse(manifest, nullptr, false);
  ASSERT_TRUE(m.is_object()) << manifest;
  const std::string layer = m["layers"][0].value("digest", "");
  ASSERT_EQ(::unlink((home_ + "/images/blobs/sha256/" + layer.substr(7)).c_str()), 0);
  Result old = os(home_, {"image", "push", "bb", "127.0.0.1:5/x:1"});
  one_line(old);
  EXPECT_THAT(old.err, HasSubstr("layer blob " + layer + " is not in the store"));
  EXPECT_THAT(old.err, HasSubstr("pull or import it again"));
}

E2E_ALL_MODES(ImagePush);

}  // namespace
}  // namespace e2e
