// A gateway sandbox's files as its root is made: mount points an image or
// directory lacks, /etc/hosts and the names the DNS stub answers itself;
// as root and rootless.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

class SandboxFiles : public GatewayTest {
 protected:
  SandboxFiles() : GatewayTest("files") {}
  // A copy of the busybox root, owned by root (another user than the
  // rootless modes' own), without the given paths.
  std::string root_without(const std::string& name, const std::vector<std::string>& missing) {
    const std::string dir = scratch() + "/" + name + "-" + mode_name(mode());
    std::filesystem::remove_all(dir);
    const std::string copy = "cp -a " + rootfs() + " " + dir;
    EXPECT_EQ(std::system(copy.c_str()), 0) << copy;
    for (const auto& path : missing) std::filesystem::remove_all(dir + "/" + path);
    return dir;
  }
  std::string id_of(const std::string& name) {
    Result r = os({"sandbox", "get", name, "-o", "json"});
    auto pos = r.out.find("\"id\": \"");
    if (pos == std::string::npos) return "";
    pos += 7;
    return r.out.substr(pos, r.out.find('"', pos) - pos);
  }
};

// Regression (issue 10, bug 1): rootless, a directory root owned by another
// user and lacking /etc/resolv.conf failed with "create mount point
// /etc/resolv.conf: Permission denied". Missing mount points are made in
// the sandbox's writable layer, never in the directory.
TEST_P(SandboxFiles, MissingMountPointsNeedNoWriteAccessToTheRoot) {
  const std::string dir = root_without("bare", {"etc/resolv.conf", "etc/hosts", "tmp", "sandbox"});
  Result r = os({"sandbox", "create", "--name", "bare", "--from", dir, "--no-keep", "--", "sh",
                 "-c", "cat /etc/resolv.conf /etc/hosts; test -d /tmp && pwd"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("nameserver 127.0.0.1\n"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.1\tlocalhost bare\n::1\tlocalhost"));
  EXPECT_THAT(r.out, HasSubstr("/sandbox\n"));
  // The directory itself is as it was.
  EXPECT_FALSE(std::filesystem::exists(dir + "/etc/resolv.conf"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/etc/hosts"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/tmp"));
  // And again after a stop and start, in the same writable layer.
  ASSERT_EQ(os({"sandbox", "create", "--name", "again", "--from", dir}).status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "again"}).status, 0);
  Result start = os({"sandbox", "start", "again"});
  EXPECT_EQ(start.status, 0) << start.err;
  Result hosts = os({"sandbox", "exec", "again", "--", "cat", "/etc/hosts"});
  EXPECT_THAT(hosts.out, HasSubstr("127.0.0.1\tlocalhost again\n")) << hosts.err << hosts.status;
  EXPECT_EQ(os({"sandbox", "delete", "again"}).status, 0);
  std::filesystem::remove_all(dir);
}

// Bug 2: a root that brings its own /etc/hosts keeps it.
TEST_P(SandboxFiles, AnImagesOwnHostsFileIsKept) {
  Result r = os({"sandbox", "create", "--name", "own", "--from", rootfs(), "--no-keep", "--", "cat",
                 "/etc/hosts"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "127.0.0.1 localhost\n::1 localhost\n");
}

// Bug 2: the DNS stub answers localhost and the sandbox's own name itself,
// and the network log holds no denial of them.
TEST_P(SandboxFiles, DnsStubAnswersLocalNames) {
  ASSERT_EQ(os({"sandbox", "create", "--name", "named", "--from", rootfs()}).status, 0);
  Result local = os({"sandbox", "exec", "named", "--", "nslookup", "localhost", "127.0.0.1"});
  EXPECT_EQ(local.status, 0) << local.out << local.err;
  EXPECT_THAT(local.out, HasSubstr("Address: 127.0.0.1"));
  EXPECT_THAT(local.out, HasSubstr("Address: ::1"));
  Result own = os({"sandbox", "exec", "named", "--", "nslookup", "named", "127.0.0.1"});
  EXPECT_EQ(own.status, 0) << own.out << own.err;
  EXPECT_THAT(own.out, HasSubstr("Address: 127.0.0.1"));
  // A name no rule knows is still refused, and logged.
  Result other = os({"sandbox", "exec", "named", "--", "nslookup", "example.invalid", "127.0.0.1"});
  EXPECT_NE(other.status, 0);
  const std::string log = home_ + "/sandboxes/" + id_of("named") + "/logs/network.log";
  const std::string text = file_contents(log);
  EXPECT_THAT(text, HasSubstr("example.invalid"));
  EXPECT_THAT(text, Not(HasSubstr("\"host\":\"localhost\"")));
  EXPECT_THAT(text, Not(HasSubstr("\"host\":\"named\"")));
  EXPECT_EQ(os({"sandbox", "delete", "named"}).status, 0);
}

// Item 10: -e KEY takes the caller's value on create as on exec, and
// --env-file reads docker's format on create, exec and run; -e wins.
TEST_P(SandboxFiles, EnvFileAndCallersValues) {
  const std::string file = write_file(scratch() + "/vars-" + mode_name(mode()),
                                      "# settings\nFROM_FILE=file value\nBOTH=file\n\nPASSED\n");
  Options caller;
  caller.env = {"PASSED=from the caller", "ALSO=also the caller's"};
  const std::string show = "echo \"$FROM_FILE|$BOTH|$PASSED|$ALSO\"";
  Result created = os({"sandbox", "create", "--name", "env", "--from", rootfs(), "--env-file", file,
                       "-e", "BOTH=flag", "-e", "ALSO", "--no-keep", "--", "sh", "-c", show},
                      caller);
  EXPECT_EQ(created.status, 0) << created.err;
  EXPECT_EQ(created.out, "file value|flag|from the caller|also the caller's\n");
  ASSERT_EQ(os({"sandbox", "create", "--name", "idle", "--from", rootfs()}).status, 0);
  Result exec =
      os({"sandbox", "exec", "idle", "--env-file", file, "-e", "ALSO", "--", "sh", "-c", show},
         caller);
  EXPECT_EQ(exec.status, 0) << exec.err;
  EXPECT_EQ(exec.out, "file value|file|from the caller|also the caller's\n");
  Result run = sandbox(mode(), {"--env-file", file}, {"sh", "-c", show}, caller);
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_EQ(run.out, "file value|file|from the caller|\n");
  // A bad line: one line naming the file and the line, exit 125.
  const std::string bad = write_file(scratch() + "/bad-vars-" + mode_name(mode()), "A=1\n=2\n");
  Result refused = os({"sandbox", "exec", "idle", "--env-file", bad, "--", "true"});
  EXPECT_EQ(refused.status, 125);
  EXPECT_EQ(refused.err, "openshell: --env-file " + bad + ":2: '=2' is not KEY=VALUE or KEY\n");
  Result refused_create =
      os({"sandbox", "create", "--from", rootfs(), "--env-file", bad, "--", "true"});
  EXPECT_EQ(refused_create.status, 125);
  EXPECT_EQ(refused_create.err,
            "openshell: --env-file " + bad + ":2: '=2' is not KEY=VALUE or KEY\n");
  EXPECT_EQ(os({"sandbox", "delete", "idle"}).status, 0);
}

// Item 10: create --bind, as run's: the sandbox user writes what the
// directory's owner may (idmapped as root), :ro refuses with EROFS, and the
// binds come back at every start.
TEST_P(SandboxFiles, CreateBindSurvivesStopAndStart) {
  // As root, a directory of an ordinary user: its owner becomes the
  // sandbox user inside.
  const Mode owner = mode() == Mode::kRoot ? Mode::kRootlessSubuid : mode();
  const std::string data = make_dir(owner, "cbind-" + mode_name(mode()), 0755);
  write_file(data + "/in", "from host\n", 0644);
  ASSERT_EQ(::chown((data + "/in").c_str(), uid_of(owner), gid_of(owner)), 0);
  Result created = os({"sandbox", "create", "--name", "bound", "--from", rootfs(), "--bind",
                       data + ":/data", "-v", data + ":/data-ro:ro"});
  ASSERT_EQ(created.status, 0) << created.err;
  for (int launch = 1; launch <= 2; ++launch) {
    SCOPED_TRACE("launch " + std::to_string(launch));
    const std::string out = data + "/out" + std::to_string(launch);
    Result w =
        os({"sandbox", "exec", "bound", "--", "sh", "-c",
            "id -u; cat /data/in && echo from sandbox > /data/out" + std::to_string(launch)});
    EXPECT_EQ(w.status, 0) << w.err;
    EXPECT_EQ(w.out, "1000\nfrom host\n");
    EXPECT_EQ(file_contents(out), "from sandbox\n");
    struct stat st {};
    EXPECT_EQ(::stat(out.c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, uid_of(owner));
    Result ro = os({"sandbox", "exec", "bound", "--", "sh", "-c", "echo x > /data-ro/no"});
    EXPECT_EQ(ro.status, 1);
    EXPECT_EQ(ro.err, "sh: can't create /data-ro/no: Read-only file system\n");
    EXPECT_FALSE(std::filesystem::exists(data + "/no"));
    if (launch == 1) {
      ASSERT_EQ(os({"sandbox", "stop", "bound"}).status, 0);
      // A stopped sandbox's copy sees its binds too, as docker cp sees a
      // stopped container's volumes.
      const std::string got = make_dir(mode(), "cbind-got-" + mode_name(mode()), 0777);
      Result down = os({"sandbox", "download", "bound", "/data/in", got});
      EXPECT_EQ(down.status, 0) << down.err;
      EXPECT_EQ(file_contents(got + "/in"), "from host\n");
      ASSERT_EQ(os({"sandbox", "start", "bound"}).status, 0);
    }
  }
  // get shows what create was given.
  Result get = os({"sandbox", "get", "bound"});
  EXPECT_THAT(get.out, testing::ContainsRegex("\nBind: +" + data + ":/data\n"));
  EXPECT_THAT(get.out, testing::ContainsRegex("\nBind: +" + data + ":/data-ro:ro\n"));
  Result json = os({"sandbox", "get", "bound", "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"target\": \"/data-ro\""));
  EXPECT_THAT(json.out, HasSubstr("\"read_only\": true"));
  EXPECT_EQ(os({"sandbox", "delete", "bound"}).status, 0);
  // The bind's files are the host's, not the sandbox's: they stay.
  EXPECT_EQ(file_contents(data + "/in"), "from host\n");
  // A source that does not exist: one line, exit 125, no sandbox.
  Result missing = os(
      {"sandbox", "create", "--name", "nobind", "--from", rootfs(), "--bind", data + "/nosuch:/x"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_EQ(missing.err, "openshell: --bind " + data + "/nosuch:/x: " + data +
                             "/nosuch: no such file or directory\n");
  std::filesystem::remove_all(data);
}

E2E_ALL_MODES(SandboxFiles);

}  // namespace
}  // namespace e2e
