// `openshell doctor check` on this machine and on faked conditions, the
// default image's "cannot build it" line, and the shell completions in a
// real bash (zsh and fish parse them).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

// Output of a shell command line run as root, stdout and stderr together.
std::string shell_output(const std::string& command, int* status = nullptr) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (status) *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

// The line of one check ("✓ kernel: ..."), "" when absent.
std::string line_of(const std::string& out, const std::string& name) {
  for (size_t at = 0; at < out.size();) {
    size_t end = out.find('\n', at);
    std::string line = out.substr(at, end - at);
    if (line.find(" " + name + ": ") != std::string::npos && line.find(" " + name + ": ") <= 4)
      return line;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

class Doctor : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    home_ = make_dir(mode(), "doctor-" + mode_name(mode()) + "-" + std::to_string(++counter), 0700);
    empty_ = make_dir(mode(), "doctor-empty-" + std::to_string(counter), 0755);
  }
  Result os(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
    Options o;
    o.env = std::move(env);
    o.env.push_back("OPENSHELL_HOME=" + home_);
    o.timeout_s = 120;
    return openshell(mode(), args, o);
  }
  std::string home_, empty_;
};
E2E_ALL_MODES(Doctor);

// What is stable here: Debian 12 on Linux 6.x, hybrid cgroups, Landlock 7,
// seccomp; one line per check; the status follows the required checks.
TEST_P(Doctor, ThisMachine) {
  Result r = os({"doctor", "check"});
  EXPECT_THAT(line_of(r.out, "kernel"), HasSubstr("✓ kernel: Linux 6."));
  EXPECT_THAT(line_of(r.out, "user namespaces"), HasSubstr("✓ user namespaces: available"));
  EXPECT_THAT(line_of(r.out, "cgroups"), HasSubstr("cgroups: hybrid; usable: "));
  EXPECT_EQ(line_of(r.out, "landlock"), "✓ landlock: ABI 7");
  EXPECT_EQ(line_of(r.out, "seccomp"), "✓ seccomp: filters available");
  EXPECT_THAT(line_of(r.out, "state directory"), HasSubstr("✓ state directory: " + home_));
  EXPECT_THAT(line_of(r.out, "gateway"), HasSubstr("is not running: the first command starts it"));
  EXPECT_NE(line_of(r.out, "default image"), "");
  if (mode() == Mode::kRootlessSubuid) {
    EXPECT_THAT(line_of(r.out, "subuid range"), HasSubstr("✓ subuid range: "));
    EXPECT_THAT(line_of(r.out, "newuidmap"), HasSubstr("✓ newuidmap: /usr/bin/newuidmap (setuid)"));
  }
  if (mode() == Mode::kRootlessSingle) {
    EXPECT_THAT(line_of(r.out, "subuid range"), HasSubstr("✗ subuid range: no entry for"));
  }
  const bool required_missing = r.out.find("✗") != std::string::npos &&
                                r.out.find("sandbox create cannot work here") != std::string::npos;
  EXPECT_EQ(r.status, required_missing ? 1 : 0) << r.out;

  Result j = os({"doctor", "check", "-o", "json"});
  auto doc = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << j.out;
  EXPECT_EQ(doc["ok"].get<bool>(), j.status == 0);
  EXPECT_EQ(doc["checks"].size(), 15u);
  EXPECT_EQ(doc["checks"][0]["name"], "kernel");
}

// Each condition faked: a cgroup tree with nothing, an /etc without the
// caller's ranges, a PATH without newuidmap; none stops sandbox create.
TEST_P(Doctor, FakedHostConditions) {
  write_file(empty_ + "/subuid", "someone-else:100000:65536\n");
  write_file(empty_ + "/subgid", "someone-else:100000:65536\n");
  Result r = os({"doctor", "check"}, {"OPENSHELL_DOCTOR_SYS=" + empty_,
                                      "OPENSHELL_DOCTOR_ETC=" + empty_, "PATH=" + empty_});
  EXPECT_THAT(line_of(r.out, "cgroups"),
              HasSubstr("✗ cgroups: no cgroup file system at " + empty_ + "/fs/cgroup"));
  EXPECT_THAT(line_of(r.out, "cgroups"), HasSubstr("(optional)"));
  if (mode() == Mode::kRoot) {
    EXPECT_THAT(line_of(r.out, "subuid range"), HasSubstr("✓"));
  } else {
    EXPECT_THAT(line_of(r.out, "subuid range"), HasSubstr("✗ subuid range: no entry for "));
    EXPECT_THAT(line_of(r.out, "subgid range"), HasSubstr("usermod --add-subgids"));
    EXPECT_THAT(line_of(r.out, "subgid range"), HasSubstr("(optional)"));
    EXPECT_EQ(line_of(r.out, "newuidmap"),
              "✗ newuidmap: not on PATH; fix: apt-get install uidmap (without it a sandbox holds "
              "your id alone) (optional)");
  }
}

// The chosen gateway (-g, --gateway-endpoint) must answer; the local one
// need not run, the first command starts it.
TEST_P(Doctor, ChosenGatewayThatDoesNotAnswer) {
  const std::string url = "unix://" + empty_ + "/no-gateway.sock";
  Result r = os({"doctor", "check", "--gateway-endpoint", url});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(line_of(r.out, "gateway"), HasSubstr("✗ gateway: "));
  EXPECT_THAT(line_of(r.out, "gateway"), HasSubstr("fix: start it ('openshell gateway run')"));
  EXPECT_THAT(r.out, HasSubstr("sandbox create cannot work here"));
  Result named = os({"-g", "nonexistent-gw", "doctor", "check"});
  EXPECT_NE(named.status, 0);
}

// No mirror in the apt sources, no tool on PATH, a mirror nobody answers
// at: each says why in one line, with the command to build or import it,
// and doctor and sandbox create say the same line.
TEST_P(Doctor, DefaultImageThatCannotBeBuilt) {
  RefusedPort refused;
  const std::string dead = "http://127.0.0.1:" + std::to_string(refused.port()) + "/debian";
  const std::string dead_root = make_dir(mode(), "doctor-apt-" + mode_name(mode()), 0755);
  shell_output("mkdir -p " + dead_root + "/etc/apt");
  write_file(dead_root + "/etc/apt/sources.list", "deb " + dead + " bookworm main\n");
  const std::string bin = make_dir(mode(), "doctor-bin-" + mode_name(mode()), 0755);
  for (const std::string tool : {"debootstrap", "mmdebstrap"}) {
    write_file(bin + "/" + tool, "#!/bin/sh\nexit 1\n", 0755);
  }
  struct Case {
    std::vector<std::string> env;
    std::string why;
  };
  const std::vector<Case> cases = {
      {{"OPENSHELL_APT_ROOT=" + empty_}, "apt names no Debian mirror"},
      {{"PATH=" + empty_},
       mode() == Mode::kRoot ? "neither debootstrap nor mmdebstrap is on PATH"
                             : "as an ordinary user it takes mmdebstrap, which is not on PATH"},
      {{"OPENSHELL_APT_ROOT=" + dead_root, "PATH=" + bin},
       "nothing answers at the mirror 127.0.0.1:" + std::to_string(refused.port())},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    Result create = os({"sandbox", "create", "--", "true"}, c.env);
    EXPECT_EQ(create.status, 125);
    EXPECT_THAT(create.err, HasSubstr(c.why));
    EXPECT_THAT(create.err, HasSubstr("build it with 'openshell image build-base --mirror URL'"));
    EXPECT_THAT(create.err, HasSubstr("or import one with 'openshell image import FILE base'"));
    EXPECT_EQ(std::count(create.err.begin(), create.err.end(), '\n'), 1) << create.err;
    Result doctor = os({"doctor", "check"}, c.env);
    EXPECT_EQ(doctor.status, 1);
    const std::string line = line_of(doctor.out, "default image");
    EXPECT_THAT(
        line, HasSubstr("✗ default image: the default image base cannot be built here: " + c.why));
    // The same line, word for word.
    const std::string said = line.substr(line.find("the default image"));
    EXPECT_THAT(create.err, HasSubstr(said));
  }
  Result run = os({"run", "--image", "base", "--", "true"}, cases[0].env);
  EXPECT_EQ(run.status, 125);
  EXPECT_THAT(run.err, HasSubstr("apt names no Debian mirror"));
  Result ahead = os({"image", "build-base", "--mirror", dead}, {"PATH=" + bin});
  EXPECT_EQ(ahead.status, 125);
  EXPECT_THAT(ahead.err, HasSubstr("nothing answers at the mirror 127.0.0.1"));
  EXPECT_EQ(file_contents_of_dir(home_ + "/sandboxes"), "");
}

// The first sandbox create builds base, saying so, then runs on it. A fake
// debootstrap for root (the busybox root, with stand-ins for groupadd and
// useradd), a fake mmdebstrap for an ordinary user (the busybox root as its
// archive; its hook is the real one's business) and a file:// mirror stand
// in for Debian's, so that no network is needed; the real build is
// scripts/test's base-image step.
TEST_P(Doctor, FirstSandboxCreateBuildsTheDefaultImage) {
  GatewayGuard guard(mode(), home_);
  const std::string bin = make_dir(mode(), "doctor-fake-tools-" + mode_name(mode()), 0755);
  // debootstrap [options] SUITE ROOT MIRROR: ROOT is the last but one.
  write_file(bin + "/debootstrap",
             R"(#!/bin/sh
set -e
eval root=\${$(($# - 1))}
cp -a )" + rootfs() +
                 R"(/. "$root"/
mkdir -p "$root/usr/sbin" "$root/usr/share/locale" "$root/etc"
for t in groupadd useradd; do
  printf '#!/bin/sh\nexit 0\n' >"$root/usr/sbin/$t"
  chmod 755 "$root/usr/sbin/$t"
done
)",
             0755);
  // mmdebstrap [options] SUITE TARGET MIRROR: TARGET is the last but one.
  write_file(bin + "/mmdebstrap",
             R"(#!/bin/sh
set -e
eval out=\${$(($# - 1))}
tar -C )" + rootfs() +
                 R"( -cf "$out" .
)",
             0755);
  const std::string tool = mode() == Mode::kRoot ? "debootstrap" : "mmdebstrap";
  const std::string apt = make_dir(mode(), "doctor-file-mirror-" + mode_name(mode()), 0755);
  shell_output("mkdir -p " + apt + "/etc/apt");
  write_file(apt + "/etc/apt/sources.list", "deb file://" + scratch() + " bookworm main\n");
  const std::vector<std::string> env = {"OPENSHELL_APT_ROOT=" + apt,
                                        "PATH=" + bin + ":/usr/sbin:/usr/bin:/sbin:/bin"};
  Result r = os({"sandbox", "create", "--no-keep", "--", "echo", "done"}, env);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("building the default image base, one time, about a minute "
                               "(" +
                               tool + " from file://" + scratch() + ")"));
  EXPECT_EQ(r.out, "done\n");
  EXPECT_THAT(os({"image", "list", "-q"}).out, HasSubstr("localhost/base:latest"));
  // Once: the next one finds it.
  Result again = os({"sandbox", "create", "--no-keep", "--", "echo", "again"}, env);
  EXPECT_EQ(again.out, "again\n");
  EXPECT_THAT(again.err, Not(HasSubstr("building")));
  EXPECT_THAT(line_of(os({"doctor", "check"}, env).out, "default image"),
              HasSubstr("✓ default image: base is in the store"));
  Result ahead = os({"image", "build-base"}, env);
  EXPECT_EQ(ahead.status, 0);
  EXPECT_THAT(ahead.err, HasSubstr("already in the store"));
  // On a terminal the line counts the seconds, redrawn, and ends with done.
  Options tty;
  tty.pty = true;
  tty.env = env;
  tty.env.push_back("OPENSHELL_HOME=" + home_);
  Result drawn = openshell(mode(), {"image", "build-base", "--force"}, tty);
  EXPECT_EQ(drawn.status, 0) << drawn.out;
  EXPECT_THAT(drawn.out,
              HasSubstr("\rbuilding the default image base, one time, about a minute: 0s"));
  EXPECT_THAT(drawn.out, HasSubstr("about a minute: done"));
}

class Completions : public GatewayTest {
 protected:
  Completions() : GatewayTest("complete") {}
  // Completes the words (the last one being typed) in a real bash with the
  // generated script, openshell on PATH and this test's home.
  std::string complete(const std::string& script, const std::string& words) {
    std::string cmd =
        "cd " + scratch() + " && env -i PATH=" + scratch() +
        ":/usr/bin:/bin OPENSHELL_HOME=" + home_ + " bash --norc -c '. " + script +
        "; COMP_WORDS=(" + words + "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); " +
        "_openshell; [ ${#COMPREPLY[@]} = 0 ] || printf \"%s\\n\" \"${COMPREPLY[@]}\"'";
    return shell_output(cmd);
  }
};
INSTANTIATE_TEST_SUITE_P(Modes, Completions, testing::Values(Mode::kRoot), param_name);

TEST_P(Completions, BashCompletesCommandsAndLiveSandboxNames) {
  const std::string script = scratch() + "/openshell.bash";
  int status = -1;
  shell_output(binary() + " completions bash > " + script, &status);
  ASSERT_EQ(status, 0);
  EXPECT_EQ(shell_output("bash -n " + script, &status), "");
  EXPECT_EQ(status, 0);
  EXPECT_EQ(shell_output("bash --norc -c '. " + script + "; complete -p openshell'"),
            "complete -o default -F _openshell openshell\n");

  const std::string top = complete(script, "openshell \"\"");
  for (const char* word :
       {"run\n", "sandbox\n", "image\n", "gateway\n", "doctor\n", "completions\n"})
    EXPECT_THAT(top, HasSubstr(word));
  EXPECT_THAT(top, Not(HasSubstr("__complete")));
  EXPECT_EQ(complete(script, "openshell sandbox cr"), "create\n");
  EXPECT_EQ(complete(script, "openshell doctor check --ou"), "--output\n");

  Result made =
      os({"sandbox", "create", "--name", "compl1", "--from", rootfs(), "-d", "--", "sleep", "60"});
  ASSERT_EQ(made.status, 0) << made.err;
  EXPECT_EQ(complete(script, "openshell sandbox delete com"), "compl1\n");
  const std::string exec = complete(script, "openshell sandbox exec \"\"");
  EXPECT_THAT(exec, HasSubstr("compl1\n"));
  EXPECT_THAT(exec, HasSubstr("--workdir\n"));
  EXPECT_EQ(complete(script, "openshell logs c"), "compl1\n");
  EXPECT_EQ(complete(script, "openshell sandbox create --name"), "--name\n");
  ASSERT_EQ(os({"sandbox", "delete", "compl1"}).status, 0);
  EXPECT_EQ(complete(script, "openshell sandbox delete com"), "");
}

TEST_P(Completions, ZshAndFishScriptsParseAndComplete) {
  for (const std::string shell : {"zsh", "fish"}) {
    SCOPED_TRACE(shell);
    if (shell_output("command -v " + shell).empty()) {
      ADD_FAILURE() << shell << " is not installed (apt-get install " << shell << ")";
      continue;
    }
    const std::string script = scratch() + "/openshell." + shell;
    int status = -1;
    shell_output(binary() + " completions " + shell + " > " + script, &status);
    ASSERT_EQ(status, 0);
    EXPECT_EQ(shell_output(shell + " -n " + script, &status), "");
    EXPECT_EQ(status, 0);
    // And complete: fish through its own `complete -C`, zsh through the
    // bash function its bashcompinit runs.
    const std::string run = "env -i HOME=" + scratch() + " PATH=" + scratch() +
                            ":/usr/bin:/bin OPENSHELL_HOME=" + home_ + " " + shell + " -c ";
    const std::string said =
        shell == "fish"
            ? shell_output(run + "'source " + script + "; complete -C \"openshell sandbox cr\"'")
            : shell_output(run + "'autoload -U compinit; compinit -u; source " + script +
                           "; setopt ksharrays; COMP_WORDS=(openshell sandbox cr); "
                           "COMP_CWORD=2; _openshell; print -l $COMPREPLY'");
    EXPECT_EQ(said, "create\n");
  }
}

}  // namespace
}  // namespace e2e
