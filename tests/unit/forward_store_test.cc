// Port forwards in gateway.db: one forward a BIND:PORT and a sandbox's port,
// kept across a reopen, and removed with their sandbox.
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "gateway/store.h"
#include "test_util.h"

namespace openshell::gateway {
namespace {

using openshell::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

SandboxRecord sandbox(const std::string& id, const std::string& name) {
  SandboxRecord r;
  r.id = id;
  r.name = name;
  r.spec = "{}";
  r.created_ms = r.updated_ms = 1700000000000;
  return r;
}

ForwardRecord forward(const std::string& id, const std::string& bind, uint16_t port) {
  return ForwardRecord{id, bind, port, 1700000000000 + port};
}

class ForwardStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> open() { return Store::open(tmp_ / "gateway.db"); }
  TempDir tmp_;
};

TEST_F(ForwardStoreTest, KeptAcrossAReopenAndRemovedWithTheirSandbox) {
  {
    auto store = open();
    store->insert(sandbox("aaaaaaaaaaaa", "one"));
    store->insert(sandbox("bbbbbbbbbbbb", "two"));
    store->insert_forward(forward("aaaaaaaaaaaa", "127.0.0.1", 8080));
    store->insert_forward(forward("aaaaaaaaaaaa", "0.0.0.0", 3000));
    store->insert_forward(forward("bbbbbbbbbbbb", "127.0.0.1", 9090));
  }
  auto store = open();
  EXPECT_THAT(store->forwards_of("aaaaaaaaaaaa"),
              ElementsAre(forward("aaaaaaaaaaaa", "0.0.0.0", 3000),
                          forward("aaaaaaaaaaaa", "127.0.0.1", 8080)));
  EXPECT_EQ(store->forwards().size(), 3u);
  store->remove_forward("aaaaaaaaaaaa", 3000);
  EXPECT_THAT(store->forwards_of("aaaaaaaaaaaa"),
              ElementsAre(forward("aaaaaaaaaaaa", "127.0.0.1", 8080)));
  store->remove("aaaaaaaaaaaa");
  EXPECT_THAT(store->forwards_of("aaaaaaaaaaaa"), IsEmpty());
  EXPECT_THAT(store->forwards(), ElementsAre(forward("bbbbbbbbbbbb", "127.0.0.1", 9090)));
}

TEST_F(ForwardStoreTest, ABindAndPortOrASandboxsPortIsOneForward) {
  auto store = open();
  store->insert(sandbox("aaaaaaaaaaaa", "one"));
  store->insert(sandbox("bbbbbbbbbbbb", "two"));
  store->insert_forward(forward("aaaaaaaaaaaa", "127.0.0.1", 8080));
  // The same BIND:PORT for another sandbox, the same port of the sandbox
  // from another BIND: both refused, nothing changed.
  EXPECT_THROW(store->insert_forward(forward("bbbbbbbbbbbb", "127.0.0.1", 8080)), ForwardTaken);
  EXPECT_THROW(store->insert_forward(forward("aaaaaaaaaaaa", "127.0.0.2", 8080)), ForwardTaken);
  // Another BIND of the same port, for another sandbox, is another forward.
  store->insert_forward(forward("bbbbbbbbbbbb", "127.0.0.2", 8080));
  EXPECT_EQ(store->forwards().size(), 2u);
  try {
    store->insert_forward(forward("bbbbbbbbbbbb", "127.0.0.1", 8080));
  } catch (const ForwardTaken& e) {
    EXPECT_STREQ(e.what(), "a forward of 127.0.0.1:8080 exists already");
  }
}

}  // namespace
}  // namespace openshell::gateway
