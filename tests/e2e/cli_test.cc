// What a new user meets on the command line (issue 10): errors in
// openshell's own words, exec -n with a one-word command, exec -t and TERM,
// download into a destination that does not exist yet or of a name that
// starts with '-', and the README's writable bind.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

class Cli : public GatewayTest {
 protected:
  Cli() : GatewayTest("cli-home", false) {}
  void create(const std::string& name) {
    Result r = os({"sandbox", "create", "--name", name, "--from", rootfs()});
    ASSERT_EQ(r.status, 0) << r.err;
  }
};
E2E_ALL_MODES(Cli);

// Mistyped commands and options: one line naming the word, never CLI11's
// "A subcommand is required".
TEST_P(Cli, UnknownCommandsAndOptionsAreNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"sandbox", "lst"}, "openshell: unknown command 'lst' (did you mean list?)\n"},
      {{"image", "lst"}, "openshell: unknown command 'lst' (did you mean list?)\n"},
      {{"policy", "gett", "x"}, "openshell: unknown command 'gett' (did you mean get?)\n"},
      {{"gateway", "stat"}, "openshell: unknown command 'stat' (did you mean status?)\n"},
      {{"sandbox", "xyzzy"},
       "openshell: unknown command 'xyzzy' (see 'openshell sandbox --help')\n"},
      {{"xyzzy"}, "openshell: unknown command 'xyzzy' (see 'openshell --help')\n"},
      {{"-u"}, "openshell: unknown option -u (see 'openshell --help')\n"},
      {{"sandbox", "-u", "list"},
       "openshell: unknown option -u (see 'openshell sandbox --help')\n"},
      {{"sandbox", "list", "-u"},
       "openshell: unknown option -u (see 'openshell sandbox list --help')\n"},
      {{"sandbox", "exec", "x"},
       "openshell: no command given (exec NAME -- CMD) (see 'openshell sandbox exec --help')\n"},
      // `sandbox SUBCOMMAND` parses with its own branch of the tree only:
      // a misspelt one still gets the nearest name, an alias its command,
      // and global options before it still count.
      {{"sandbox", "exce", "x"}, "openshell: unknown command 'exce' (did you mean exec?)\n"},
      {{"sandbox", "rm", "-u"},
       "openshell: unknown option -u (see 'openshell sandbox delete --help')\n"},
      {{"-v", "-g", "nosuch", "sandbox", "ls", "-u"},
       "openshell: unknown option -u (see 'openshell sandbox list --help')\n"},
  };
  for (const auto& [args, line] : cases) {
    Result r = os(args);
    EXPECT_EQ(r.status, 125) << testing::PrintToString(args);
    EXPECT_EQ(r.err, line) << testing::PrintToString(args);
    EXPECT_EQ(r.out, "");
  }
  // A command with subcommands, given none: which ones there are.
  Result bare = os({"image"});
  EXPECT_EQ(bare.status, 125);
  EXPECT_THAT(bare.err, StartsWith("openshell: a command is needed after 'openshell image': "));
  EXPECT_THAT(bare.err, HasSubstr("list"));
  EXPECT_THAT(bare.err, Not(HasSubstr("subcommand")));
}

TEST_P(Cli, FromAPathThatIsNoDirectory) {
  Result missing = os({"sandbox", "create", "--from", "./nosuchdir", "--", "true"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_EQ(missing.err, "openshell: --from ./nosuchdir: no such directory\n");
  const std::string file = write_file(scratch() + "/cli-not-a-dir", "x");
  Result not_dir = os({"sandbox", "create", "--from", file, "--", "true"});
  EXPECT_EQ(not_dir.status, 125);
  EXPECT_EQ(not_dir.err, "openshell: --from " + file +
                             ": not a directory (an image archive is imported with 'openshell "
                             "image import FILE NAME')\n");
  ::unlink(file.c_str());
}

// exec goes straight to its stream: with no gateway listening it starts
// one (as every command does) and the command runs once.
TEST_P(Cli, ExecStartsTheGatewayWhenNoneListens) {
  create("nogw");
  ASSERT_EQ(os({"gateway", "stop"}).status, 0);
  Result r = os({"sandbox", "exec", "nogw", "--", "sh", "-c",
                 "echo ran >> /sandbox/count; "
                 "cat /sandbox/count"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ran\n");
  EXPECT_EQ(os({"gateway", "status", "-o", "json"}).status, 0);
  // A named gateway that does not listen is named, never started.
  Result named = os({"--gateway-endpoint", "unix://" + home_ + "/run/none.sock", "sandbox", "exec",
                     "nogw", "--", "true"});
  EXPECT_EQ(named.status, 125);
  EXPECT_THAT(named.err, HasSubstr("none.sock"));
  EXPECT_EQ(named.out, "");
}

// `sandbox exec --help` is the command's own help (its branch alone is built).
TEST_P(Cli, SandboxSubcommandHelpIsItsOwn) {
  Result r = os({"sandbox", "exec", "--help"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Usage: openshell sandbox exec [OPTIONS]"));
  EXPECT_THAT(r.out, HasSubstr("--workdir"));
  EXPECT_THAT(r.out, HasSubstr("Example: openshell sandbox exec demo -- ls -l"));
  Result group = os({"sandbox", "--help"});
  EXPECT_EQ(group.status, 0) << group.err;
  for (const char* sub : {"create", "exec", "connect", "delete", "commit", "logs"})
    EXPECT_THAT(group.out, HasSubstr(sub));
}

// `exec -n NAME -- CMD` with a one-word CMD (it was "command is required");
// a command that cannot run is named.
TEST_P(Cli, ExecOneWordCommandAndNamesWhatCannotRun) {
  create("one");
  Result pwd = os({"sandbox", "exec", "-n", "one", "--", "pwd"});
  EXPECT_EQ(pwd.status, 0) << pwd.err;
  EXPECT_EQ(pwd.out, "/sandbox\n");
  Result plain = os({"sandbox", "exec", "one", "--", "pwd"});
  EXPECT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.out, "/sandbox\n");
  Result none = os({"sandbox", "exec", "-n", "one"});
  EXPECT_EQ(none.status, 125);
  EXPECT_EQ(
      none.err,
      "openshell: no command given (exec NAME -- CMD) (see 'openshell sandbox exec --help')\n");
  Result missing = os({"sandbox", "exec", "one", "--", "nosuchcmd"});
  EXPECT_EQ(missing.status, 127);
  EXPECT_EQ(missing.err, "openshell: cannot run nosuchcmd: No such file or directory\n");
  Result dir = os({"sandbox", "exec", "-n", "one", "--", "/etc"});
  EXPECT_EQ(dir.status, 126);
  EXPECT_EQ(dir.err, "openshell: cannot run /etc: Permission denied\n");
}

// exec -t gives the command the caller's TERM (xterm without one), as run
// -t does; -e TERM=... wins. Without -t, no TERM.
TEST_P(Cli, ExecTtyPassesTerm) {
  create("term");
  Options tty;
  tty.pty = true;
  tty.env = {"TERM=vt220"};
  Result t = os({"sandbox", "exec", "-t", "term", "--", "sh", "-c", "echo \"[$TERM]\""}, tty);
  EXPECT_EQ(t.status, 0) << t.out;
  EXPECT_THAT(t.out, HasSubstr("[vt220]"));
  Options no_term;
  no_term.pty = true;
  Result x = os({"sandbox", "exec", "-t", "term", "--", "sh", "-c", "echo \"[$TERM]\""}, no_term);
  EXPECT_THAT(x.out, HasSubstr("[xterm]"));
  Result e =
      os({"sandbox", "exec", "-t", "-e", "TERM=dumb", "term", "--", "sh", "-c", "echo \"[$TERM]\""},
         tty);
  EXPECT_THAT(e.out, HasSubstr("[dumb]"));
  Options plain;
  plain.env = {"TERM=vt220"};
  Result p = os({"sandbox", "exec", "term", "--", "sh", "-c", "echo \"[$TERM]\""}, plain);
  EXPECT_EQ(p.out, "[]\n") << p.err;
}

// download as docker cp: into an existing directory under its own name, or
// as a destination that does not exist yet (its parent must); a name that
// starts with '-'; every failure one line of openshell's, status 125.
TEST_P(Cli, DownloadDestinationsAndErrors) {
  create("dl");
  ASSERT_EQ(os({"sandbox", "exec", "dl", "--", "sh", "-c",
                "mkdir -p /sandbox/src/sub && echo a > /sandbox/src/a && echo b > "
                "/sandbox/src/sub/b && echo minus > /sandbox/-minus"})
                .status,
            0);
  const std::string m = mode_name(mode());
  const std::string out = make_dir(mode(), "cli-down-" + m);
  // The README's own example: ./back does not exist yet.
  Result back = os({"sandbox", "download", "dl", "/sandbox/src", out + "/back"});
  EXPECT_EQ(back.status, 0) << back.err;
  EXPECT_EQ(file_contents(out + "/back/a"), "a\n");
  EXPECT_EQ(file_contents(out + "/back/sub/b"), "b\n");
  // Again: ./back is a directory now, so it goes into it.
  Result into = os({"sandbox", "download", "dl", "/sandbox/src", out + "/back"});
  EXPECT_EQ(into.status, 0) << into.err;
  EXPECT_EQ(file_contents(out + "/back/src/sub/b"), "b\n");
  // A file under a new name, and a name tar would take for an option.
  Result file = os({"sandbox", "download", "dl", "/sandbox/src/a", out + "/renamed"});
  EXPECT_EQ(file.status, 0) << file.err;
  EXPECT_EQ(file_contents(out + "/renamed"), "a\n");
  Result minus = os({"sandbox", "download", "dl", "/sandbox/-minus", out});
  EXPECT_EQ(minus.status, 0) << minus.err;
  EXPECT_EQ(file_contents(out + "/-minus"), "minus\n");

  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"/sandbox/nothere", out},
       "openshell: download of /sandbox/nothere: No such file or directory\n"},
      {{"/sandbox/src", out + "/no/such"},
       "openshell: download: " + out +
           "/no: no such directory (the destination's parent must exist)\n"},
      {{"/sandbox/src/a", out + "/renamed"},
       "openshell: download: " + out +
           "/renamed exists and is not a directory; nothing was "
           "changed\n"},
      {{"/sandbox/src", out + "/back"},
       "openshell: download: " + out + "/back/src exists; nothing was changed\n"},
  };
  for (const auto& [args, line] : refused) {
    std::vector<std::string> command = {"sandbox", "download", "dl"};
    command.insert(command.end(), args.begin(), args.end());
    Result r = os(command);
    EXPECT_EQ(r.status, 125) << testing::PrintToString(args);
    EXPECT_EQ(r.err, line);
  }
  // What it may not read, as the sandbox's user.
  ASSERT_EQ(os({"sandbox", "exec", "dl", "--", "sh", "-c",
                "echo s > /sandbox/secret && chmod 000 /sandbox/secret"})
                .status,
            0);
  Result secret = os({"sandbox", "download", "dl", "/sandbox/secret", out});
  EXPECT_EQ(secret.status, 125);
  EXPECT_EQ(secret.err, "openshell: download of /sandbox/secret: Permission denied\n");
  // Nothing half-made is left.
  std::vector<std::string> left = split_words(file_contents_of_dir(out));
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"-minus", "back", "renamed"}));
  // upload's refusal is 125 too.
  Result up = os({"sandbox", "upload", "dl", out + "/renamed", "/usr"});
  EXPECT_EQ(up.status, 125);
  EXPECT_EQ(up.err, "openshell: upload to /usr/renamed: Permission denied\n");
}

// The README's `run --bind "$PWD:/work" --workdir /work -- make test`: the
// sandbox's user writes a directory its caller owns; run as root, one of an
// ordinary user's (idmapped); a root-owned one holding the working
// directory cannot be written, and a warning says why.
TEST_P(Cli, RunBindOfTheCurrentDirectoryIsWritable) {
  const std::string m = mode_name(mode());
  const std::string dir = make_dir(mode(), "cli-bind-" + m);
  uid_t owner = uid_of(mode());
  gid_t group = gid_of(mode());
  if (mode() == Mode::kRoot) {
    owner = group = 4242;  // an ordinary user's directory
    ASSERT_EQ(::chown(dir.c_str(), owner, group), 0);
  }
  Result r = sandbox(mode(), {"--bind", dir + ":/work", "--workdir", "/work"},
                     {"sh", "-c", "echo made > made && cat made"});
  if (mode() == Mode::kRoot && r.status == 1 &&
      r.err.find("Permission denied") != std::string::npos)
    GTEST_SKIP() << "the scratch file system cannot do idmapped mounts: " << r.err;
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "made\n");
  EXPECT_EQ(r.err, "");
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/made").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, owner);
  EXPECT_EQ(st.st_gid, group);
  if (mode() != Mode::kRoot) return;
  // Root's own directory: the sandbox's user cannot write, and is told.
  const std::string mine = make_dir(mode(), "cli-bind-root");
  Result refused = sandbox(mode(), {"--bind", mine + ":/work", "--workdir", "/work"},
                           {"sh", "-c", "echo made > made"});
  EXPECT_EQ(refused.status, 1);
  EXPECT_THAT(refused.err,
              StartsWith("openshell: warning: --bind " + mine +
                         ": owned by root, so the sandbox cannot write there (a directory of an "
                         "ordinary user's is mapped to the sandbox's user; see openshell-run(1), "
                         "Users and groups)\n"));
  EXPECT_THAT(refused.err, HasSubstr("Permission denied"));
  // Read-only binds, and binds that do not hold the working directory,
  // say nothing.
  Result ro = sandbox(mode(), {"--bind", mine + ":/work:ro", "--workdir", "/work"}, {"true"});
  EXPECT_EQ(ro.status, 0);
  EXPECT_EQ(ro.err, "");
  Result elsewhere = sandbox(mode(), {"--bind", mine + ":/work"}, {"true"});
  EXPECT_EQ(elsewhere.status, 0);
  EXPECT_EQ(elsewhere.err, "");
}

}  // namespace
}  // namespace e2e
