#include "spec/sandbox_spec.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "auth/launch.h"
#include "base/error.h"
#include "cli/sandbox_common.h"
#include "gateway/store.h"
#include "test_util.h"

namespace openshell {
namespace {

using openshell::testing::error_of;
using openshell::testing::TempDir;
using ::testing::HasSubstr;

SandboxSpec vm_spec() {
  SandboxSpec spec;
  spec.from = "base";
  spec.command = {"sh", "-c", "echo hi"};
  spec.vm = SandboxVm{2, 1024, "/usr/lib/openshell/vmlinux"};
  return spec;
}

TEST(SandboxSpecVm, JsonRoundTrip) {
  const SandboxSpec spec = vm_spec();
  const nlohmann::json j = nlohmann::json::parse(spec.to_json());
  ASSERT_TRUE(j.contains("vm"));
  EXPECT_EQ(j["vm"]["vcpus"], 2);
  EXPECT_EQ(j["vm"]["memory_mib"], 1024);
  EXPECT_EQ(j["vm"]["kernel"], "/usr/lib/openshell/vmlinux");
  const SandboxSpec back = SandboxSpec::from_json(spec.to_json());
  ASSERT_TRUE(back.vm);
  EXPECT_EQ(*back.vm, *spec.vm);
  // A container's spec has no "vm", and reads back without one.
  SandboxSpec container;
  EXPECT_FALSE(nlohmann::json::parse(container.to_json()).contains("vm"));
  EXPECT_FALSE(SandboxSpec::from_json(container.to_json()).vm);
  // Fields left out take the defaults; a vm that is not an object is refused.
  const SandboxSpec bare = SandboxSpec::from_json(R"({"from":"base","vm":{"kernel":"/k"}})");
  ASSERT_TRUE(bare.vm);
  EXPECT_EQ(bare.vm->vcpus, 1u);
  EXPECT_EQ(bare.vm->memory_mib, 512u);
  EXPECT_THAT(error_of([] { SandboxSpec::from_json(R"({"vm":3})"); }), HasSubstr("vm"));
  EXPECT_THAT(error_of([] { SandboxSpec::from_json(R"({"vm":{"vcpus":4294967297}})"); }),
              HasSubstr("vm.vcpus: too large"));
  EXPECT_THAT(error_of([] { SandboxSpec::from_json(R"({"vm":{"memory_mib":"1G"}})"); }),
              HasSubstr("vm.memory_mib: not a whole number"));
  EXPECT_THAT(error_of([] { SandboxSpec::from_json(R"({"vm":{"vcpus":-1}})"); }),
              HasSubstr("sandbox spec"));
}

TEST(SandboxSpecVm, ValidateNamesTheField) {
  EXPECT_NO_THROW(vm_spec().validate());
  auto with = [](auto change) {
    SandboxSpec spec = vm_spec();
    change(&spec);
    try {
      spec.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(with([](SandboxSpec* s) { s->vm->vcpus = 0; }),
              HasSubstr("vm.vcpus 0: must be between 1 and 64"));
  EXPECT_THAT(with([](SandboxSpec* s) { s->vm->vcpus = 65; }), HasSubstr("vm.vcpus 65"));
  EXPECT_EQ(with([](SandboxSpec* s) { s->vm->vcpus = 64; }), "");
  EXPECT_THAT(with([](SandboxSpec* s) { s->vm->memory_mib = 63; }),
              HasSubstr("vm.memory_mib 63: must be between 64 and 65536"));
  EXPECT_THAT(with([](SandboxSpec* s) { s->vm->memory_mib = 65537; }),
              HasSubstr("vm.memory_mib 65537"));
  EXPECT_EQ(with([](SandboxSpec* s) { s->vm->memory_mib = 64; }), "");
  EXPECT_THAT(with([](SandboxSpec* s) { s->vm->kernel = "vmlinux"; }),
              HasSubstr("vm.kernel 'vmlinux': must be an absolute path"));
  EXPECT_THAT(with([](SandboxSpec* s) { s->vm->kernel = ""; }), HasSubstr("vm.kernel"));
  EXPECT_EQ(with([](SandboxSpec* s) { s->from = "host"; }),
            "--vm needs an image: the host's root cannot be a guest's disk");
  // The host's root is refused only for a VM; a copy's storage is no matter.
  EXPECT_EQ(with([](SandboxSpec* s) { s->vm.reset(), s->from = "host"; }), "");
  EXPECT_EQ(with([](SandboxSpec* s) { s->storage = "copy"; }), "");
}

// What the gateway stores is what it signs into the launch file, and what
// the supervisor reads back from it.
TEST(SandboxSpecVm, ThroughTheStoreAndTheLaunchFile) {
  TempDir dir;
  {
    auto store = gateway::Store::open(dir / "gateway.db");
    gateway::SandboxRecord record;
    record.id = "0123456789ab";
    record.name = "vm";
    record.generation = 1;
    record.spec = vm_spec().to_json();
    store->insert(record);
  }
  auto reopened = gateway::Store::open(dir / "gateway.db");
  auto stored = reopened->find_by_name("vm");
  ASSERT_TRUE(stored);
  ASSERT_TRUE(SandboxSpec::from_json(stored->spec).vm);
  EXPECT_EQ(*SandboxSpec::from_json(stored->spec).vm, *vm_spec().vm);

  const auth::SigningKey key = auth::SigningKey::load_or_create(dir / "gateway.key");
  auth::LaunchSpec launch;
  launch.sandbox_id = "abc123";
  launch.sandbox_name = "vm";
  launch.generation = 1;
  launch.nonce = std::string(64, 'a');
  launch.spec = stored->spec;
  const auth::LaunchSpec back = auth::decode_verified(auth::encode(launch, key), key);
  const SandboxSpec spec = SandboxSpec::from_json(back.spec);
  ASSERT_TRUE(spec.vm);
  EXPECT_EQ(*spec.vm, *vm_spec().vm);
}

TEST(SandboxSpecVm, SandboxGetShowsTheVm) {
  nlohmann::json sandbox = {{"name", "v"},
                            {"vm", {{"vcpus", 2}, {"memory_mib", 512}, {"kernel", "/k/vmlinux"}}}};
  ::testing::internal::CaptureStdout();
  cli::print_sandbox(sandbox, "table");
  const std::string shown = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(shown, HasSubstr("2 vCPUs, 512 MiB, kernel /k/vmlinux"));
  EXPECT_THAT(shown, HasSubstr("VM:"));
  sandbox["vm"]["vcpus"] = 1;
  ::testing::internal::CaptureStdout();
  cli::print_sandbox(sandbox, "table");
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), HasSubstr("1 vCPU, 512 MiB"));
  ::testing::internal::CaptureStdout();
  cli::print_sandbox({{"name", "c"}}, "table");
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), ::testing::Not(HasSubstr("VM:")));
}

}  // namespace
}  // namespace openshell
