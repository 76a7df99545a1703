// The spellings OpenShell's and docker's users expect: --cpu/--cpus with
// Kubernetes units, list -l with commas and repeats, --names and LABELS,
// logs --since and --tail, sandbox wait, upload and .gitignore, and the
// hint on Ctrl-C of an attached create; in every mode.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::MatchesRegex;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

class Spellings : public GatewayTest {
 protected:
  Spellings() : GatewayTest("spell") {}
  std::string json_of(const std::string& name) {
    return os({"sandbox", "get", name, "-o", "json"}).out;
  }
};

TEST_P(Spellings, CpuAndMemoryInKubernetesUnits) {
  // Bad values: one exact line each, exit 125, on create and run alike.
  struct Case {
    std::vector<std::string> args;
    std::string line;
  };
  const std::vector<Case> bad = {
      {{"sandbox", "create", "--cpus", "1.5m", "--", "true"},
       "openshell: --cpu 1.5m: not a number of CPUs (like 2, 1.5, or 500m for half a CPU)\n"},
      {{"sandbox", "create", "--cpu", "5000", "--", "true"},
       "openshell: --cpu 5000: more than 4096 CPUs\n"},
      {{"sandbox", "create", "--memory", "1Gx", "--", "true"},
       "openshell: --memory 1Gx: not a size (like 512Mi, 4Gi, 1G, 100M or 1073741824)\n"},
      {{"run", "--rootfs", rootfs(), "--cpu", "lots", "--", "true"},
       "openshell: --cpus lots: not a number of CPUs (like 2, 1.5, or 500m for half a CPU)\n"},
      {{"run", "--rootfs", rootfs(), "-m", "2Mi", "--", "true"},
       "openshell: --memory 2Mi: below the minimum of 4M\n"},
  };
  for (const auto& c : bad) {
    Result r = os(c.args);
    EXPECT_EQ(r.status, 125) << c.line;
    EXPECT_EQ(r.err, c.line);
  }
  // Good ones reach the sandbox's limits.
  Result created = os({"sandbox", "create", "--name", "lim", "--from", rootfs(), "--cpus", "500m",
                       "--memory", "512Mi", "-d"});
  ASSERT_EQ(created.status, 0) << created.err;
  const std::string j = json_of("lim");
  EXPECT_THAT(j, HasSubstr("\"cpus\": 0.5"));
  EXPECT_THAT(j, HasSubstr("\"memory_bytes\": 536870912"));
  Result get = os({"sandbox", "get", "lim"});
  EXPECT_THAT(get.out, HasSubstr("memory=512.0 MiB"));
  EXPECT_THAT(get.out, HasSubstr("cpus=0.5"));
  EXPECT_EQ(os({"sandbox", "delete", "lim"}).status, 0);
}

TEST_P(Spellings, ListSelectorsNamesAndLabels) {
  for (const auto& [name, labels] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"web1", {"--label", "team=x", "--label", "tier=web"}},
           {"db1", {"--label", "team=x", "--label", "tier=db"}},
           {"bare", {}}}) {
    std::vector<std::string> args = {"sandbox", "create", "--name", name, "--from", rootfs()};
    args.insert(args.end(), labels.begin(), labels.end());
    args.insert(args.end(), {"--", "true"});
    Result r = os(args);
    ASSERT_EQ(r.status, 0) << r.err;
  }
  EXPECT_EQ(os({"sandbox", "list", "--names"}).out, "web1\ndb1\nbare\n");
  EXPECT_EQ(os({"sandbox", "list", "--names", "-l", "team=x"}).out, "web1\ndb1\n");
  EXPECT_EQ(os({"sandbox", "list", "--names", "-l", "team=x,tier=web"}).out, "web1\n");
  EXPECT_EQ(os({"sandbox", "list", "--names", "-l", "team=x", "-l", "tier=db"}).out, "db1\n");
  EXPECT_EQ(os({"sandbox", "list", "--names", "-l", "tier", "-l", "team=y"}).out, "");
  EXPECT_EQ(os({"sandbox", "ls", "--names", "--selector", "tier"}).out, "web1\ndb1\n");
  Result table = os({"sandbox", "list"});
  EXPECT_THAT(table.out, MatchesRegex("NAME +PHASE +GEN +EXIT +AGE +FROM +LABELS +COMMAND\n.*"));
  EXPECT_THAT(table.out, MatchesRegex("(.|\n)*web1 .* team=x,tier=web +true\n(.|\n)*"));
  EXPECT_THAT(table.out, MatchesRegex("(.|\n)*bare .* - +true\n(.|\n)*"));
  Result bad = os({"sandbox", "list", "-l", "team=x,,tier"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_EQ(bad.err,
            "openshell: selector 'team=x,,tier': an empty term (expected KEY=VALUE or KEY, "
            "comma-separated)\n");
  Result both = os({"sandbox", "list", "--names", "-o", "json"});
  EXPECT_EQ(both.status, 125);
  EXPECT_THAT(both.err, HasSubstr("--names"));
  EXPECT_EQ(os({"sandbox", "delete", "--all"}).status, 0);
}

TEST_P(Spellings, LogsSinceLinesAndTail) {
  Result r = os({"sandbox", "create", "--name", "lg", "--from", rootfs(), "--", "sh", "-c",
                 "echo one; echo two; echo three >&2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(os({"logs", "lg", "--since", "1h"}).out, "one\ntwo\n");
  EXPECT_EQ(os({"logs", "lg", "--since", "2000-01-01T00:00:00Z", "-n", "2"}).out, "two\n");
  EXPECT_EQ(os({"logs", "lg", "--since", "2000-01-01T00:00:00Z", "-n", "2"}).err, "three\n");
  Result future = os({"logs", "lg", "--since", "2099-01-01T00:00:00+02:00"});
  EXPECT_EQ(future.status, 0) << future.err;
  EXPECT_EQ(future.out + future.err, "");
  EXPECT_EQ(os({"sandbox", "logs", "lg", "--lines", "1"}).err, "three\n");
  // --tail follows (OpenShell's spelling): here it ends with the sandbox.
  Result tail = os({"logs", "lg", "--tail", "--since", "10m"});
  EXPECT_EQ(tail.status, 0) << tail.err;
  EXPECT_EQ(tail.out, "one\ntwo\n");
  EXPECT_EQ(os({"logs", "lg", "--tail", "-n", "0"}).out, "");
  Result docker_tail = os({"logs", "--tail", "5"});
  EXPECT_EQ(docker_tail.status, 125);
  EXPECT_EQ(docker_tail.err,
            "openshell: --tail 5: --tail takes no number (it follows, as in OpenShell); -n 5 gives "
            "the last 5 lines\n");
  Result bad = os({"logs", "lg", "--since", "5x"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_EQ(bad.err,
            "openshell: --since 5x: not a duration (like 30s, 5m, 1h30m or 2d) or an RFC 3339 "
            "time (like 2026-12-01T12:00:00Z)\n");
  Result lines = os({"logs", "lg", "-n", "some"});
  EXPECT_EQ(lines.status, 125);
  EXPECT_EQ(lines.err, "openshell: -n some: not a number of lines\n");
  EXPECT_EQ(os({"sandbox", "delete", "lg"}).status, 0);
}

TEST_P(Spellings, WaitPrintsTheExitStatus) {
  ASSERT_EQ(os({"sandbox", "create", "--name", "job", "--from", rootfs(), "-d", "--", "sh", "-c",
                "sleep 0.3; exit 7"})
                .status,
            0);
  Result w = os({"sandbox", "wait", "job"});
  EXPECT_EQ(w.status, 7) << w.err;
  EXPECT_EQ(w.out, "7\n");
  // Again, once it is over; and without a name, the last one named.
  EXPECT_EQ(os({"sandbox", "wait"}).out, "7\n");
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "ok", "--from", rootfs(), "-d", "--", "true"}).status, 0);
  Result both = os({"sandbox", "wait", "job", "ok"});
  EXPECT_EQ(both.status, 0);
  EXPECT_EQ(both.out, "7\n0\n");
  // Stopped by a user: its main process ended by the stop's SIGTERM.
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "idle", "--from", rootfs(), "-d", "--", "sleep", "1000"})
          .status,
      0);
  ASSERT_EQ(os({"sandbox", "stop", "idle"}).status, 0);
  Result stopped = os({"sandbox", "wait", "idle"});
  EXPECT_EQ(stopped.out, "143\n");
  EXPECT_EQ(stopped.status, 143);
  Result missing = os({"sandbox", "wait", "nosuch"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_THAT(missing.err, StartsWith("openshell: "));
  EXPECT_THAT(missing.err, HasSubstr("nosuch"));
  EXPECT_EQ(os({"sandbox", "delete", "--all"}).status, 0);
}

TEST_P(Spellings, UploadLeavesOutWhatGitignoreSays) {
  ASSERT_EQ(os({"sandbox", "create", "--name", "up", "--from", rootfs()}).status, 0);
  const std::string m = mode_name(mode());
  const std::string src = make_dir(mode(), "proj-" + m);
  make_dir(mode(), "proj-" + m + "/build");
  write_file(src + "/.gitignore", "*.log\n/build/\n");
  write_file(src + "/a.txt", "hello\n");
  write_file(src + "/x.log", "noise\n");
  write_file(src + "/build/out", "binary\n");
  Result up = os({"sandbox", "upload", "up", src});
  ASSERT_EQ(up.status, 0) << up.err;
  // scratch() is in no git work tree: openshell reads the .gitignore files.
  EXPECT_EQ(up.out,
            "copied 2 files, 1 directory (20 B) into /sandbox; 2 left out by .gitignore files "
            "(--no-git-ignore copies them)\n");
  EXPECT_EQ(up.err, "");
  Result seen = os({"sandbox", "exec", "up", "--", "ls", "-A", "/sandbox/proj-" + m});
  EXPECT_EQ(seen.out, ".gitignore\na.txt\n") << seen.err;
  Result all = os({"sandbox", "upload", "up", "--no-git-ignore", "-v", src, "/tmp"});
  ASSERT_EQ(all.status, 0) << all.err;
  const std::string p = "proj-" + m;
  EXPECT_THAT(all.out, StartsWith(p + "\n"));
  for (const std::string& name :
       {p + "/.gitignore", p + "/a.txt", p + "/x.log", p + "/build", p + "/build/out"})
    EXPECT_THAT(all.out, HasSubstr("\n" + name + "\n"));
  EXPECT_THAT(all.out, testing::EndsWith("\ncopied 4 files, 2 directories (33 B) into /tmp\n"));
  EXPECT_EQ(os({"sandbox", "exec", "up", "--", "cat", "/tmp/" + p + "/build/out"}).out, "binary\n");
  // A file named on its own is copied, whatever .gitignore says.
  Result one = os({"sandbox", "upload", "up", src + "/x.log"});
  EXPECT_EQ(one.out, "copied 1 file (6 B) into /sandbox\n") << one.err;
  EXPECT_EQ(os({"sandbox", "delete", "up"}).status, 0);
}

TEST_P(Spellings, CtrlCOfAnAttachedCreateSaysTheSandboxRunsOn) {
  Options o;
  o.signal_when = "started\n";
  o.signal = SIGINT;
  Result r = os({"sandbox", "create", "--name", "attached", "--from", rootfs(), "--", "sh", "-c",
                 "echo started; exec sleep 1000"},
                o);
  EXPECT_EQ(r.status, 130) << r.err;
  EXPECT_EQ(r.out, "started\n");
  EXPECT_EQ(r.err,
            "\nopenshell: sandbox 'attached' keeps running; stop it with 'openshell sandbox stop "
            "attached', or remove it with 'openshell sandbox delete attached'\n");
  EXPECT_THAT(json_of("attached"), HasSubstr("\"phase\": \"Ready\""));
  EXPECT_EQ(os({"sandbox", "delete", "attached"}).status, 0);
}

}  // namespace

E2E_ALL_MODES(Spellings);

}  // namespace e2e
