#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"
#include "oci/seccomp_json.h"
#include "test_util.h"

namespace openshell::oci {
namespace {

using nlohmann::json;
using openshell::testing::ChildReport;
using openshell::testing::ChildWriter;
using openshell::testing::run_in_child;

// In a child: no_new_privs, the compiled filter, then the calls.
ChildReport run_filtered(const json& profile, void (*calls)(ChildWriter&)) {
  SeccompFilter filter = compile_seccomp(profile);
  return run_in_child([&](ChildWriter& out) {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(3);
    ChildFailure failure;
    if (!runtime::seccomp::install(filter.program(), &failure)) {
      out.say(std::string("install failed: ") + failure.message());
      ::_exit(4);
    }
    calls(out);
  });
}

std::string refusal(const json& profile) {
  try {
    compile_seccomp(profile);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(OciSeccomp, AnErrnoRuleRefusesItsCallAndNothingElse) {
  json profile = json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["mkdir", "mkdirat", "no_such_call"], "action": "SCMP_ACT_ERRNO",
                  "errnoRet": 38}]})");
  ChildReport report = run_filtered(profile, [](ChildWriter& out) {
    errno = 0;
    long ret = ::syscall(SYS_mkdirat, AT_FDCWD, "/tmp/openshell-oci-seccomp-never", 0700);
    out.result("mkdirat", ret, errno);
    errno = 0;
    ret = ::syscall(SYS_getppid);
    out.result("getppid", ret, errno);
  });
  ASSERT_TRUE(report.has("mkdirat")) << report.text;
  EXPECT_EQ(report.at("mkdirat").ret, -1);
  EXPECT_EQ(report.at("mkdirat").err, ENOSYS);
  EXPECT_GT(report.at("getppid").ret, 0);
}

TEST(OciSeccomp, AnAllowListRefusesWhatItDoesNotName) {
  // The shape of the engines' default profiles: errno by default, a list
  // allowed, clone's namespace flags masked.
  json profile = json::parse(R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "syscalls": [
      {"names": ["read", "write", "exit", "exit_group", "getpid", "getppid", "close",
                 "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "brk", "mmap", "munmap",
                 "futex", "fstat", "newfstatat", "lseek", "pread64"],
       "action": "SCMP_ACT_ALLOW"},
      {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
       "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}]},
      {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
       "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"},
                {"index": 0, "value": 4294967295, "op": "SCMP_CMP_EQ"}]}]})");
  ChildReport report = run_filtered(profile, [](ChildWriter& out) {
    errno = 0;
    long ret = ::syscall(SYS_getppid);
    out.result("getppid", ret, errno);
    errno = 0;
    ret = ::syscall(SYS_unshare, CLONE_NEWUTS);
    out.result("unshare", ret, errno);
    errno = 0;
    ret = ::syscall(SYS_personality, 0xffffffffUL);
    out.result("personality-query", ret, errno);
    errno = 0;
    ret = ::syscall(SYS_personality, static_cast<unsigned long>(READ_IMPLIES_EXEC));
    out.result("personality-set", ret, errno);
  });
  ASSERT_TRUE(report.has("unshare")) << report.text;
  EXPECT_GT(report.at("getppid").ret, 0);
  EXPECT_EQ(report.at("unshare").ret, -1);
  EXPECT_EQ(report.at("unshare").err, EPERM);
  EXPECT_GE(report.at("personality-query").ret, 0) << "an alternative of one argument";
  EXPECT_EQ(report.at("personality-set").ret, -1);
  EXPECT_EQ(report.at("personality-set").err, EPERM);
}

TEST(OciSeccomp, BadProfilesAreRefusedNamingTheField) {
  struct Case {
    const char* profile;
    const char* names;
  };
  const Case cases[] = {
      {R"({})", "linux.seccomp.defaultAction: is required"},
      {R"({"defaultAction": "SCMP_ACT_FOO"})",
       "linux.seccomp.defaultAction: \"SCMP_ACT_FOO\" is not a seccomp action"},
      {R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": "x"})",
       "linux.seccomp.defaultErrnoRet: must be a non-negative integer"},
      {R"({"defaultAction": "SCMP_ACT_NOTIFY"})", "SCMP_ACT_NOTIFY is not supported"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/agent.sock"})",
       "linux.seccomp.listenerPath: is not supported"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_Z80"]})",
       "linux.seccomp.architectures[0]: \"SCMP_ARCH_Z80\" is not an architecture"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_NEW"]})",
       "linux.seccomp.flags[0]: \"SECCOMP_FILTER_FLAG_NEW\" is not a seccomp flag"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": "read",
          "action": "SCMP_ACT_ERRNO"}]})",
       "linux.seccomp.syscalls[0].names: must be an array"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"]},
          {"names": ["read"], "action": "SCMP_ACT_ERRNO"}]})",
       "linux.seccomp.syscalls[0].action: is required"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"],
          "action": "SCMP_ACT_ERRNO", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_XX"}]}]})",
       "linux.seccomp.syscalls[0].args[0].op: \"SCMP_CMP_XX\" is not a seccomp comparison"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"],
          "action": "SCMP_ACT_ERRNO", "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]}]})",
       "linux.seccomp.syscalls[0].args[0].index: 6 is not an argument"},
      {R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"],
          "action": "SCMP_ACT_ERRNO", "args": [{"index": 0, "value": -1, "op": "SCMP_CMP_EQ"}]}]})",
       "linux.seccomp.syscalls[0].args[0].value: must be a non-negative integer"},
  };
  for (const Case& c : cases) {
    std::string message = refusal(json::parse(c.profile));
    EXPECT_NE(message.find(c.names), std::string::npos) << c.profile << "\n -> " << message;
    EXPECT_EQ(message.rfind("config.json: linux.seccomp", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace openshell::oci
