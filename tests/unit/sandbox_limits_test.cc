#include "base/sandbox_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "spec/sandbox_spec.h"
#include "test_util.h"

namespace openshell::limits {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = 1ull << 30;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

TEST(SandboxLimits, TmpfsDefaultsFollowTheMemoryLimitElseTheRam) {
  EXPECT_EQ(default_tmp_size(std::nullopt, 10 * kGiB), kGiB);
  EXPECT_EQ(default_shm_size(std::nullopt, 10 * kGiB), kGiB / 2);
  EXPECT_EQ(default_tmp_size(256u << 20, 10 * kGiB), 256u << 20);
  EXPECT_EQ(default_shm_size(256u << 20, 10 * kGiB), 128u << 20);
  // Whole MiB, never below 1 MiB; unknown RAM gives 1 GiB.
  EXPECT_EQ(default_tmp_size((5u << 20) + 7, 0), 5u << 20);
  EXPECT_EQ(default_shm_size(1u << 20, 0), 1u << 20);
  EXPECT_EQ(default_tmp_size(std::nullopt, 0), kGiB);
  EXPECT_GT(memory_total(), 0u);
}

// The command line's spellings: docker's and Kubernetes' units alike.
TEST(SandboxLimits, CpusInDecimalOrMillicores) {
  EXPECT_EQ(parse_cpus("--cpu", "2"), 2.0);
  EXPECT_EQ(parse_cpus("--cpu", "1.5"), 1.5);
  EXPECT_EQ(parse_cpus("--cpu", "500m"), 0.5);
  EXPECT_EQ(parse_cpus("--cpus", "2500m"), 2.5);
  EXPECT_EQ(parse_cpus("--cpu", "4096"), 4096.0);
  for (const char* bad : {"", "0", "0m", "m", "-1", "1.5m", "lots", "1e3", "500M", " 1"})
    EXPECT_EQ(error_of([&] { parse_cpus("--cpu", bad); }),
              "--cpu " + std::string(bad) +
                  ": not a number of CPUs (like 2, 1.5, or 500m for half a CPU)")
        << bad;
  EXPECT_EQ(error_of([&] { parse_cpus("--cpus", "4097"); }), "--cpus 4097: more than 4096 CPUs");
  EXPECT_EQ(error_of([&] { parse_cpus("--cpus", "5000000m"); }),
            "--cpus 5000000m: more than 4096 CPUs");
}

TEST(SandboxLimits, MemoryInBytesOrBinaryUnits) {
  EXPECT_EQ(parse_memory("--memory", "512Mi"), 512ull << 20);
  EXPECT_EQ(parse_memory("--memory", "4Gi"), 4 * kGiB);
  EXPECT_EQ(parse_memory("--memory", "1G"), kGiB);
  EXPECT_EQ(parse_memory("--memory", "100M"), 100ull << 20);
  EXPECT_EQ(parse_memory("--memory", "8192Ki"), 8ull << 20);
  EXPECT_EQ(parse_memory("--memory", "1073741824"), kGiB);
  EXPECT_EQ(parse_memory("--memory", "2GiB"), 2 * kGiB);
  for (const char* bad : {"", "lots", "5X", "1Gx", "Mi", "-1G", "1 G"})
    EXPECT_EQ(
        error_of([&] { parse_memory("--memory", bad); }),
        "--memory " + std::string(bad) + ": not a size (like 512Mi, 4Gi, 1G, 100M or 1073741824)")
        << bad;
  EXPECT_EQ(error_of([&] { parse_memory("--memory", "1Mi"); }),
            "--memory 1Mi: below the minimum of 4M");
}

TEST(SandboxLimits, InodesAreBoundedWithTheSize) {
  EXPECT_EQ(tmpfs_inodes(kGiB), kGiB / (16 << 10));
  EXPECT_EQ(tmpfs_inodes(1u << 20), kMinInodes);
}

TEST(SandboxLimits, ApplyFillsOnlyWhatIsUnset) {
  SandboxSpec spec;
  spec.apply_limit_defaults(Defaults{}, 10 * kGiB);
  EXPECT_EQ(spec.pids, kDefaultPids);
  EXPECT_EQ(spec.tmp_size_bytes, kGiB);
  EXPECT_EQ(spec.shm_size_bytes, kGiB / 2);

  SandboxSpec own;
  own.pids = 0;
  own.memory_bytes = 64u << 20;
  own.shm_size_bytes = 3u << 20;
  own.apply_limit_defaults(Defaults{7, 5u << 20, std::nullopt}, 10 * kGiB);
  EXPECT_EQ(own.pids, 0u);
  EXPECT_EQ(own.tmp_size_bytes, 5u << 20);
  EXPECT_EQ(own.shm_size_bytes, 3u << 20);
}

TEST(SandboxLimits, GatewayConfiguration) {
  openshell::testing::TempDir dir;
  const std::string path = dir.path() + "/gateway.toml";
  EXPECT_FALSE(load_defaults(path).pids);  // no file: no changes
  openshell::testing::write_file(
      path, "[sandbox_defaults]\npids = 100\ntmp_size = \"64M\"\nshm_size = \"8M\"\n");
  Defaults d = load_defaults(path);
  EXPECT_EQ(d.pids, 100u);
  EXPECT_EQ(d.tmp_size, 64u << 20);
  EXPECT_EQ(d.shm_size, 8u << 20);

  auto error = [&](const std::string& text) {
    openshell::testing::write_file(path, text);
    try {
      load_defaults(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("[sandbox_defaults]\npids = -1\n"),
            path + ":2: sandbox_defaults.pids: not a number of processes (0: no limit)");
  EXPECT_EQ(error("[sandbox_defaults]\n\ntmp_size = \"big\"\n"),
            path + ":3: sandbox_defaults.tmp_size: not a size (like \"512M\" or \"2G\")");
  EXPECT_EQ(error("[sandbox_defaults]\nshm_size = \"4k\"\n"),
            path + ":2: sandbox_defaults.shm_size: below the minimum of 1M");
  EXPECT_EQ(error("[sandbox_defaults]\nmemory = \"1G\"\n"),
            path + ":2: sandbox_defaults.memory: unknown key (known: pids, tmp_size, shm_size)");
  EXPECT_THAT(error("[sandbox_defaults\n"), HasSubstr(path + ":1: "));
}

}  // namespace
}  // namespace openshell::limits
