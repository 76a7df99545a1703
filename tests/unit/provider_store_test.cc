// Providers in gateway.db: their credential values rest sealed, never in
// plain text in the database's files, and come back as they were given.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "auth/secrets.h"
#include "base/error.h"
#include "base/files.h"
#include "gateway/store.h"
#include "test_util.h"

namespace openshell::gateway {
namespace {

using openshell::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr const char* kSecret = "ghp_SeCrEtVaLuE0123456789abcdef";

ProviderRecord sample() {
  ProviderRecord r;
  r.name = "gh";
  r.type = "github";
  r.credentials = {{"GITHUB_TOKEN", kSecret}, {"EMPTY", ""}};
  r.endpoints = {"api.github.com:443", "github.com:443"};
  r.created_ms = 1700000000000;
  r.updated_ms = 1700000000500;
  return r;
}

class ProviderStoreTest : public ::testing::Test {
 protected:
  std::string path() const { return tmp_ / "gateway.db"; }
  std::unique_ptr<Store> open() {
    auto store = Store::open(path());
    store->set_secret_box(&box_);
    return store;
  }
  // Every byte of the database's files, the write-ahead log included.
  std::string all_bytes() const {
    std::string bytes;
    for (const char* suffix : {"", "-wal", "-shm"}) {
      std::optional<std::string> file = files::try_read(path() + suffix);
      if (file) bytes += *file;
    }
    return bytes;
  }
  TempDir tmp_;
  auth::SecretBox box_{std::string(32, 'k')};
};

TEST_F(ProviderStoreTest, RoundTripsSealedAndSurvivesReopen) {
  {
    auto store = open();
    store->insert_provider(sample());
    EXPECT_EQ(store->find_provider("gh"), sample());
  }
  auto store = open();
  EXPECT_EQ(store->find_provider("gh"), sample());
  EXPECT_THAT(store->providers(), ElementsAre(sample()));
  EXPECT_EQ(store->find_provider("nope"), std::nullopt);
}

TEST_F(ProviderStoreTest, NoValueInTheDatabaseFiles) {
  auto store = open();
  store->insert_provider(sample());
  ProviderRecord rotated = sample();
  rotated.credentials["GITHUB_TOKEN"] = "rotated_ZyXwVuT9876543210";
  store->update_provider(rotated);
  EXPECT_EQ(store->find_provider("gh"), rotated);
  std::string bytes = all_bytes();
  ASSERT_THAT(bytes, HasSubstr("GITHUB_TOKEN"));  // the key names are not secret
  EXPECT_EQ(bytes.find(kSecret), std::string::npos);
  EXPECT_EQ(bytes.find("rotated_ZyXwVuT9876543210"), std::string::npos);
}

TEST_F(ProviderStoreTest, AnotherKeyDoesNotOpenIt) {
  open()->insert_provider(sample());
  auto store = Store::open(path());
  auth::SecretBox other(std::string(32, 'x'));
  store->set_secret_box(&other);
  try {
    store->find_provider("gh");
    ADD_FAILURE() << "opened with another key";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("provider 'gh'"));
  }
}

TEST_F(ProviderStoreTest, WithoutABoxNothingIsWritten) {
  auto store = Store::open(path());
  EXPECT_THROW(store->insert_provider(sample()), Error);
  store->set_secret_box(&box_);
  EXPECT_THAT(store->providers(), IsEmpty());
}

TEST_F(ProviderStoreTest, DuplicateIsProviderTakenAndUpdateOfNoneThrows) {
  auto store = open();
  store->insert_provider(sample());
  ProviderRecord again = sample();
  again.type = "generic";
  EXPECT_THROW(store->insert_provider(again), ProviderTaken);
  EXPECT_EQ(store->find_provider("gh")->type, "github");
  ProviderRecord missing = sample();
  missing.name = "other";
  EXPECT_THROW(store->update_provider(missing), Error);
}

TEST_F(ProviderStoreTest, AttachmentsFollowProvidersAndSandboxes) {
  auto store = open();
  store->insert_provider(sample());
  ProviderRecord ai = sample();
  ai.name = "ai";
  store->insert_provider(ai);
  store->attach_provider("aaaaaaaaaaaa", "gh");
  store->attach_provider("aaaaaaaaaaaa", "gh");  // idempotent
  store->attach_provider("aaaaaaaaaaaa", "ai");
  store->attach_provider("bbbbbbbbbbbb", "gh");
  EXPECT_THAT(store->providers_of("aaaaaaaaaaaa"), ElementsAre("ai", "gh"));
  EXPECT_THAT(store->sandboxes_of("gh"), ElementsAre("aaaaaaaaaaaa", "bbbbbbbbbbbb"));
  store->detach_provider("bbbbbbbbbbbb", "gh");
  EXPECT_THAT(store->sandboxes_of("gh"), ElementsAre("aaaaaaaaaaaa"));
  store->remove("aaaaaaaaaaaa");  // a sandbox's attachments go with it
  EXPECT_THAT(store->sandboxes_of("gh"), IsEmpty());
  store->attach_provider("cccccccccccc", "ai");
  store->remove_provider("ai");
  EXPECT_THAT(store->providers_of("cccccccccccc"), IsEmpty());
  EXPECT_EQ(store->find_provider("ai"), std::nullopt);
}

}  // namespace
}  // namespace openshell::gateway
