#include "auth/secrets.h"

#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "auth/launch.h"
#include "base/files.h"
#include "base/random.h"
#include "gateway/store.h"
#include "test_util.h"

namespace openshell::auth {
namespace {

using openshell::testing::error_of;
using openshell::testing::read_file;
using openshell::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

SecretBox box_of(char fill) { return SecretBox(std::string(32, fill)); }

TEST(SecretBox, RoundTrip) {
  SecretBox box = box_of('k');
  std::string sealed = box.seal("s3cr3t", "sandbox-a");
  EXPECT_THAT(sealed, StartsWith("v1:"));
  EXPECT_THAT(sealed, Not(HasSubstr("s3cr3t")));
  EXPECT_EQ(box.open(sealed, "sandbox-a"), "s3cr3t");
  EXPECT_EQ(box.open(box.seal("", "x"), "x"), "");
}

TEST(SecretBox, EachSealHasAFreshNonce) {
  SecretBox box = box_of('k');
  EXPECT_NE(box.seal("same", "a"), box.seal("same", "a"));
}

TEST(SecretBox, TamperedValueDoesNotOpen) {
  SecretBox box = box_of('k');
  const std::string sealed = box.seal("s3cr3t-value", "a");
  // Every byte of the ciphertext, nonce and tag is covered.
  for (size_t i = 3; i < sealed.size() - 2; i += 3) {
    std::string changed = sealed;
    changed[i] = changed[i] == 'A' ? 'B' : 'A';
    EXPECT_THAT(error_of([&] { box.open(changed, "a"); }), HasSubstr("does not open")) << i;
  }
  EXPECT_THAT(error_of([&] { box.open(sealed.substr(0, sealed.size() - 4), "a"); }),
              HasSubstr("does not open"));
  EXPECT_THAT(error_of([&] { box.open("v1:AAAA", "a"); }), HasSubstr("malformed"));
  EXPECT_THAT(error_of([&] { box.open("plain", "a"); }), HasSubstr("unknown format"));
}

TEST(SecretBox, WrongAadOrKeyDoesNotOpen) {
  const std::string sealed = box_of('k').seal("s3cr3t", "sandbox-a");
  EXPECT_THAT(error_of([&] { box_of('k').open(sealed, "sandbox-b"); }), HasSubstr("does not open"));
  EXPECT_THAT(error_of([&] { box_of('j').open(sealed, "sandbox-a"); }), HasSubstr("does not open"));
}

TEST(SecretBox, GatewayKeyIsDerivedFromTheSigningKey) {
  TempDir dir;
  const std::string sealed =
      SecretBox::for_gateway(SigningKey::load_or_create(dir / "gateway.key")).seal("v", "a");
  // The same key file after a restart opens it; another gateway's does not.
  EXPECT_EQ(
      SecretBox::for_gateway(SigningKey::load_or_create(dir / "gateway.key")).open(sealed, "a"),
      "v");
  SecretBox other = SecretBox::for_gateway(SigningKey::load_or_create(dir / "other.key"));
  EXPECT_THAT(error_of([&] { other.open(sealed, "a"); }), HasSubstr("does not open"));
}

TEST(SpecEnv, SealedAtRestAndOpenedBack) {
  SecretBox box = box_of('k');
  const std::string spec =
      R"({"command":["sh"],"env":["SECRET_TOKEN=s3cr3t","A=b"],"from":"host"})";
  const std::string at_rest = seal_spec_env(box, "id1", spec);
  EXPECT_THAT(at_rest, Not(HasSubstr("s3cr3t")));
  EXPECT_THAT(at_rest, Not(HasSubstr("SECRET_TOKEN")));
  EXPECT_THAT(at_rest, HasSubstr("\"env_sealed\":\"v1:"));
  EXPECT_FALSE(spec_env_in_plain(at_rest));
  EXPECT_TRUE(spec_env_in_plain(spec));
  EXPECT_EQ(open_spec_env(box, "id1", at_rest), spec);
  // Bound to its sandbox: copied into another row, it does not open.
  EXPECT_THAT(error_of([&] { open_spec_env(box, "id2", at_rest); }), HasSubstr("does not open"));
  // A spec written before sealing (or without env) reads as it is.
  EXPECT_EQ(open_spec_env(box, "id1", spec), spec);
  const std::string no_env = R"({"env":[],"from":"host"})";
  EXPECT_EQ(seal_spec_env(box, "id1", no_env), no_env);
}

TEST(SpecEnv, LaunchFileCarriesTheDigestOnly) {
  const std::string spec = R"({"command":["sh"],"env":["SECRET_TOKEN=s3cr3t"],"from":"host"})";
  const std::string launch = spec_for_launch_file(spec);
  EXPECT_THAT(launch, Not(HasSubstr("s3cr3t")));
  EXPECT_THAT(launch, HasSubstr("\"env\":[]"));
  EXPECT_EQ(launch_env_digest(launch), env_digest({"SECRET_TOKEN=s3cr3t"}));
  EXPECT_NE(env_digest({"SECRET_TOKEN=s3cr3t"}), env_digest({"SECRET_TOKEN=other"}));
  // Entries are delimited: ["AB"] and ["A", "B"] differ.
  EXPECT_NE(env_digest({"A=1B=2"}), env_digest({"A=1", "B=2"}));
  EXPECT_EQ(launch_env_digest(spec), "");
}

TEST(SpecEnv, OldLaunchFileIsResignedWithoutValues) {
  TempDir dir;
  SigningKey key = SigningKey::load_or_create(dir / "gateway.key");
  LaunchSpec launch;
  launch.sandbox_id = "0123456789ab";
  launch.sandbox_name = "old";
  launch.generation = 3;
  launch.nonce = random_hex(32);
  launch.gateway_id = key.id();
  launch.gateway_socket = "/run/x.sock";
  launch.spec = R"({"env":["SECRET_TOKEN=s3cr3t"],"from":"host"})";
  const std::string path = dir / "launch.cred";
  files::write_atomically(path, encode(launch, key));
  EXPECT_TRUE(strip_launch_file_env(path, key));
  const std::string bytes = read_file(path);
  EXPECT_THAT(bytes, Not(HasSubstr("s3cr3t")));
  LaunchSpec again = decode_verified(bytes, key);
  EXPECT_EQ(again.generation, 3);
  EXPECT_EQ(again.nonce, launch.nonce);
  EXPECT_EQ(launch_env_digest(again.spec), env_digest({"SECRET_TOKEN=s3cr3t"}));
  EXPECT_FALSE(strip_launch_file_env(path, key));          // nothing more to do
  EXPECT_FALSE(strip_launch_file_env(dir / "none", key));  // missing: left alone
}

// Rows written in plain text (by an older gateway) are sealed when the store
// gets its codec, and no file of the database keeps the plain text.
TEST(SpecEnv, StoreSealsOldRowsAndKeepsNoPlainText) {
  TempDir dir;
  const std::string db = dir / "gateway.db";
  const std::string secret = "s3cr3t-4f9a1c";
  gateway::SandboxRecord record;
  record.id = "0123456789ab";
  record.name = "old";
  record.generation = 1;
  record.spec = R"({"env":["SECRET_TOKEN=)" + secret + R"("],"from":"host"})";
  {
    auto store = gateway::Store::open(db);
    store->insert(record);
  }
  auto contains_secret = [&] {
    bool found = false;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      found = found || read_file(e.path()).find(secret) != std::string::npos;
    return found;
  };
  ASSERT_TRUE(contains_secret());  // the test can see plain text where it is
  SecretBox box = box_of('k');
  auto store = gateway::Store::open(db);
  store->set_spec_codec(
      {[&](const std::string& id, const std::string& s) { return seal_spec_env(box, id, s); },
       [&](const std::string& id, const std::string& s) { return open_spec_env(box, id, s); },
       spec_env_in_plain});
  EXPECT_EQ(store->reseal_specs(), 1u);
  EXPECT_FALSE(contains_secret());
  EXPECT_EQ(store->find_by_id(record.id)->spec, record.spec);
  EXPECT_EQ(store->reseal_specs(), 0u);
  // New rows never rest in plain text.
  record.id = "ba9876543210";
  record.name = "new";
  store->insert(record);
  record.generation = 2;
  store->update(record);
  EXPECT_FALSE(contains_secret());
  EXPECT_EQ(store->list().back().spec, record.spec);
}

}  // namespace
}  // namespace openshell::auth
