// Images end to end: import (OCI layouts, docker save archives), pull from a
// real registry (Debian's docker-registry, images pushed with skopeo) and
// from one that misbehaves, hostile layers, the store's bookkeeping, and
// sandboxes made from images; as root and rootless.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include <gmock/gmock.h>

#include "harness.h"
#include "image_helpers.h"

using testing::ContainsRegex;
using testing::EndsWith;
using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

using image_helpers::busybox_layout;
using image_helpers::field_of;
using image_helpers::free_port;
using image_helpers::q;
using image_helpers::sh;
using image_helpers::Shell;
using image_helpers::wait_listening;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// How many names a space-separated list holds.
size_t count_words(const std::string& list) {
  size_t n = 0;
  bool in_word = false;
  for (char c : list) {
    bool space = c == ' ' || c == '\n';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

// A background server process, killed (and waited for) on destruction.
class Process {
 public:
  Process() = default;
  explicit Process(const std::vector<std::string>& argv, const std::string& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Process() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// ---- shared fixtures: built once, as root, readable by the test users --------

// The busybox image as an OCI layout directory.
// A copy of the busybox layout changed by a shell snippet run in it ($L is
// the layout; umoci and skopeo are there to use).
// With gc, blobs nothing names any more are removed (umoci checks every
// blob then: a layout broken on purpose goes without).
std::string derived_layout(const std::string& name, const std::string& snippet, bool gc = true) {
  std::string dir = scratch() + "/" + name;
  sh("rm -rf " + q(dir));
  Shell r =
      sh("cp -a " + q(busybox_layout()) + " " + q(dir) + " && L=" + q(dir) + " && cd " +
         q(scratch()) + " && " + snippet +
         (gc ? " && umoci gc --layout " + q(dir) : std::string()) + " && chmod -R a+rX " + q(dir));
  if (r.status != 0) ADD_FAILURE() << "building " << name << ": " << r.out;
  return dir;
}

// Debian's docker-registry on loopback, for the whole test run.
class Registry {
 public:
  Registry() {
    dir_ = scratch() + "/registry";
    sh("mkdir -p " + q(dir_ + "/data"));
    port_ = free_port();
    write_file(dir_ + "/config.yml",
               "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: " +
                   dir_ + "/data\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:" +
                   std::to_string(port_) + "\n");
    process_ = std::make_unique<Process>(
        std::vector<std::string>{"docker-registry", "serve", dir_ + "/config.yml"}, dir_ + "/log");
    ok_ = wait_listening(port_, 30000);
  }
  bool ok() const { return ok_; }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
  // skopeo copy of a layout (its tag "latest") to REPO:TAG here.
  bool push(const std::string& layout, const std::string& repo_tag, const std::string& extra = "") {
    Shell r = sh("skopeo copy --quiet --dest-tls-verify=false " + extra + " oci:" + q(layout) +
                 ":latest docker://" + host() + "/" + repo_tag);
    if (r.status != 0) ADD_FAILURE() << "skopeo: " << r.out;
    return r.status == 0;
  }

 private:
  std::string dir_;
  uint16_t port_ = 0;
  std::unique_ptr<Process> process_;
  bool ok_ = false;
};

Registry* registry() {
  static Registry* r = [] {
    auto* reg = new Registry();
    std::atexit([] { delete registry(); });
    return reg;
  }();
  return r;
}

// osh-fake-registry serving a layout, misbehaving as told.
class FakeRegistry {
 public:
  FakeRegistry(const std::string& layout, const std::string& mode) {
    static int n = 0;
    port_file_ = scratch() + "/fake-port-" + std::to_string(++n);
    std::string bin = env_or("OSH_FAKE_REGISTRY", "build/tests/e2e/osh-fake-registry");
    process_ =
        std::make_unique<Process>(std::vector<std::string>{bin, "--layout", layout, "--port-file",
                                                           port_file_, "--mode", mode},
                                  port_file_ + ".log");
    for (int i = 0; i < 1500 && port_.empty(); ++i) {  // 30 s at most
      port_ = file_contents(port_file_);
      while (!port_.empty() && (port_.back() == '\n' || port_.back() == ' ')) port_.pop_back();
      if (port_.empty()) ::usleep(20000);
    }
  }
  bool ok() const { return !port_.empty(); }
  std::string ref(const std::string& tag = "latest") const {
    return "127.0.0.1:" + port_ + "/test/image:" + tag;
  }

 private:
  std::string port_file_, port_;
  std::unique_ptr<Process> process_;
};

// ---- the fixture: a state directory per test ----------------------------------

class Images : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    if (busybox_layout().empty())
      GTEST_SKIP() << "the busybox image could not be built (see above)";
    static int counter = 0;
    home_ = make_dir(mode(), "img-" + mode_name(mode()) + "-" + std::to_string(++counter), 0700);
  }
  void TearDown() override {
    if (!home_.empty()) {
      os({"sandbox", "delete", "--all"});
      os({"gateway", "stop"});
      EXPECT_EQ(file_contents_of_dir(home_ + "/sandboxes"), "") << "sandbox files left";
      EXPECT_EQ(file_contents_of_dir(home_ + "/images/tmp"), "")
          << "work in progress left in the store";
    }
    ModeTest::TearDown();
  }
  Result os(const std::vector<std::string>& args, Options o = {}) {
    o.env.push_back("OPENSHELL_HOME=" + home_);
    if (o.timeout_s == 30) o.timeout_s = 120;
    return openshell(mode(), args, o);
  }
  // The names in the store, one per line.
  std::string names() { return os({"image", "list", "-q"}).out; }
  std::string layers() { return file_contents_of_dir(home_ + "/images/layers"); }
  // Imports the busybox layout as NAME and expects it to work.
  void import_busybox(const std::string& name = "busybox") {
    Result r = os({"image", "import", busybox_layout(), name});
    ASSERT_EQ(r.status, 0) << r.err;
  }
  // Runs COMMAND in a new sandbox from IMAGE; returns the result.
  Result run_in(const std::string& image, const std::vector<std::string>& command,
                std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"sandbox", "create", "--no-keep", "--from", image};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    args.insert(args.end(), command.begin(), command.end());
    return os(args);
  }
  // The store holds no image and no layer, after a failed pull or import.
  void expect_store_empty() {
    EXPECT_EQ(names(), "");
    EXPECT_EQ(layers(), "");
    EXPECT_EQ(file_contents_of_dir(home_ + "/images/tmp"), "");
  }

  std::string home_;
};

TEST_P(Images, ImportedLayoutRunsAsASandboxWithItsConfig) {
  import_busybox();
  EXPECT_EQ(names(), "localhost/busybox:latest\n");
  Result list = os({"image", "list"});
  EXPECT_THAT(list.out, HasSubstr("localhost/busybox:latest"));
  EXPECT_THAT(list.out, HasSubstr("NAME"));
  Result r = run_in("busybox", {"sh", "-c", "echo $PATH; id -u; pwd; cat /etc/hostname"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(
      r.out,
      "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n1000\n/sandbox\nsandbox\n");
  // The image's Cmd is the default main process.
  Result dflt = os({"sandbox", "create", "--name", "dflt", "--from", "busybox", "-o", "json"});
  EXPECT_EQ(dflt.status, 0) << dflt.err;
  Result get = os({"sandbox", "get", "dflt", "-o", "json"});
  EXPECT_THAT(get.out, HasSubstr("\"command\": [\n    \"sh\"\n  ]"));
  EXPECT_THAT(get.out, HasSubstr("\"name\": \"localhost/busybox:latest\""));
  EXPECT_THAT(get.out, HasSubstr("\"storage\": \"overlay\""));
}

TEST_P(Images, RunTakesAnImageWithItsConfig) {
  const std::string layout = derived_layout(
      "run-config-" + mode_name(mode()),
      "umoci config --image \"$L:latest\" --config.env GREETING=hello --config.workingdir /etc "
      "--config.cmd sh --config.cmd -c --config.cmd 'echo $GREETING from $(pwd)'");
  ASSERT_EQ(os({"image", "import", layout, "runner"}).status, 0);
  // No command: the image's.
  Result dflt = os({"run", "--image", "runner"});
  EXPECT_EQ(dflt.status, 0) << dflt.err;
  EXPECT_EQ(dflt.out, "hello from /etc\n");
  Result given = os({"run", "--image", "runner", "-e", "GREETING=hi", "-w", "/tmp", "--", "sh",
                     "-c", "echo $GREETING from $(pwd)"});
  EXPECT_EQ(given.out, "hi from /tmp\n") << given.err;
  Result both = os({"run", "--image", "runner", "--rootfs", rootfs(), "--", "true"});
  EXPECT_EQ(both.status, 125);
  EXPECT_THAT(both.err, HasSubstr("--image and --rootfs"));
}

TEST_P(Images, InspectListsConfigAndLayers) {
  import_busybox();
  Result r = os({"image", "inspect", "busybox"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"cmd\": [\n      \"sh\"\n    ]"));
  EXPECT_THAT(r.out, HasSubstr("\"diff_id\": \"sha256:"));
  EXPECT_THAT(r.out, HasSubstr("\"reference\": \"localhost/busybox:latest\""));
  Result missing = os({"image", "inspect", "nothere"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_THAT(missing.err, HasSubstr("image nothere: not in the image store"));
}

TEST_P(Images, ImportsOciArchivesAndDockerSaveArchives) {
  const std::string dir = make_dir(mode(), "archives-" + mode_name(mode()));
  const std::string oci = dir + "/oci.tar", docker = dir + "/docker.tar",
                    gz = dir + "/docker.tar.gz";
  ASSERT_EQ(sh("tar -C " + q(busybox_layout()) + " -cf " + q(oci) +
               " . && skopeo copy --quiet oci:" + q(busybox_layout()) +
               ":latest docker-archive:" + q(docker) + ":example.org/tools/bb:1 && gzip -c " +
               q(docker) + " > " + q(gz) + " && chmod a+r " + q(dir) + "/*")
                .status,
            0);
  Result a = os({"image", "import", oci, "from-oci"});
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_THAT(a.err, HasSubstr("Importing localhost/from-oci:latest: 1 of 1 layers to unpack"));
  // A docker save archive names its image itself.
  Result b = os({"image", "import", docker});
  ASSERT_EQ(b.status, 0) << b.err;
  Result c = os({"image", "import", gz, "zipped:2"});
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(names(), "example.org/tools/bb:1\nlocalhost/from-oci:latest\nlocalhost/zipped:2\n");
  // One layer, shared by the three names.
  EXPECT_EQ(count_words(layers()), 1u) << layers();
  Result r = run_in("example.org/tools/bb:1", {"echo", "from docker save"});
  EXPECT_EQ(r.out, "from docker save\n") << r.err;
  // Not an image at all.
  const std::string junk = write_file(dir + "/junk.tar", "not a tar archive at all");
  Result bad = os({"image", "import", junk, "junk"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr(junk));
}

TEST_P(Images, ImageConfigEnvWorkdirUserEntrypointAndCmd) {
  const std::string layout = derived_layout(
      "config-" + mode_name(mode()),
      "umoci config --image \"$L:latest\" --config.env FOO=from-image --config.env BAR=keep "
      "--config.workingdir /srv --config.user 1234:1234 --config.entrypoint /bin/echo "
      "--config.entrypoint entry --config.cmd default-arg");
  ASSERT_EQ(os({"image", "import", layout, "configured"}).status, 0);
  // No command: the entrypoint with the image's Cmd.
  Result none = os({"sandbox", "create", "--no-keep", "--from", "configured"});
  EXPECT_EQ(none.out, "entry default-arg\n") << none.err;
  // A command replaces Cmd, not the entrypoint (Docker's rule).
  Result given = run_in("configured", {"given"});
  EXPECT_EQ(given.out, "entry given\n") << given.err;
  // The environment, working directory and user.
  const std::string layout2 = derived_layout(
      "config2-" + mode_name(mode()),
      "umoci config --image \"$L:latest\" --config.env FOO=from-image --config.env BAR=keep "
      "--config.workingdir /srv --config.user 1234:1234");
  ASSERT_EQ(os({"image", "import", layout2, "configured2"}).status, 0);
  Result r = run_in("configured2", {"sh", "-c", "echo $FOO $BAR; pwd; id -u; id -g"},
                    {"-e", "FOO=from-user"});
  EXPECT_EQ(r.out, "from-user keep\n/srv\n1234\n1234\n") << r.err;
  // Its working directory and its home, the workspace, are its own.
  Result home =
      run_in("configured2",
             {"sh", "-c", "echo $HOME; echo a > /srv/a && echo b > $HOME/b && cat /srv/a $HOME/b"});
  EXPECT_EQ(home.out, "/sandbox\na\nb\n") << home.err;
  // Without a WorkingDir the home is the working directory, and still its own.
  const std::string layout3 = derived_layout(
      "config3-" + mode_name(mode()), "umoci config --image \"$L:latest\" --config.user 1234:1234");
  ASSERT_EQ(os({"image", "import", layout3, "configured3"}).status, 0);
  Result home3 = run_in("configured3", {"sh", "-c", "pwd; echo b > $HOME/b && cat $HOME/b"});
  EXPECT_EQ(home3.out, "/sandbox\nb\n") << home3.err;
  // A policy's group wins over the image's; its user would too.
  std::string group_policy = scratch() + "/group-" + mode_name(mode()) + ".toml";
  write_file(group_policy, "version = 1\n[process]\nrun_as_group = \"2345\"\n");
  Result grouped = run_in("configured2", {"sh", "-c", "id -u; id -g"}, {"--policy", group_policy});
  EXPECT_EQ(grouped.out, "1234\n2345\n") << grouped.err;
}

// An image whose User is root by another spelling ("00", "0000", "0:0", or
// a name its passwd maps to uid 0) runs as the sandbox user, as one whose
// User is "root" does: through the gateway and through run --image alike.
TEST_P(Images, ImageUserThatIsRootRunsAsTheSandboxUser) {
  for (const std::string user : {"00", "0000", "0:0", "toor", "toor:toor"}) {
    SCOPED_TRACE(user);
    std::string tag = user;
    for (char& c : tag)
      if (c == ':') c = '-';
    const std::string layout = derived_layout(
        "rootuser-" + tag + "-" + mode_name(mode()),
        "rm -rf t t.tar && mkdir -p t/etc && "
        "printf 'root:x:0:0:root:/root:/bin/sh\\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\\n"
        "toor:x:0:0::/:/bin/sh\\n' > t/etc/passwd && "
        "printf 'root:x:0:\\nsandbox:x:1000:\\ntoor:x:0:\\n' > t/etc/group && "
        "tar -C t -cf t.tar etc && umoci raw add-layer --image \"$L:latest\" t.tar && rm -rf t "
        "t.tar && "
        "umoci config --image \"$L:latest\" --config.user " +
            user);
    ASSERT_EQ(os({"image", "import", layout, "rootuser-" + tag}).status, 0);
    Result created = run_in("rootuser-" + tag, {"sh", "-c", "id -u; id -g"});
    EXPECT_EQ(created.status, 0) << created.err;
    EXPECT_EQ(created.out, "1000\n1000\n") << created.err;
    Result ran = os({"run", "--image", "rootuser-" + tag, "--", "sh", "-c", "id -u; id -g"});
    EXPECT_EQ(ran.status, 0) << ran.err;
    EXPECT_EQ(ran.out, "1000\n1000\n") << ran.err;
  }
}

// The image's /etc/passwd and /etc/group are read inside the image, a
// regular file of at most 4 MiB: "etc/passwd -> /dev/zero" (an endless
// read), a FIFO (a read that never returns) and a huge file are clear
// errors or no user, and "etc -> /etc" never finds a user of the host's.
TEST_P(Images, HostileUserFilesStayInsideTheImage) {
  struct Case {
    std::string name, snippet, user, expect;
  };
  const std::vector<Case> cases = {
      {"zero", "mkdir -p t/etc && ln -s /dev/zero t/etc/passwd", "sandbox",
       "user sandbox: no such user"},
      {"fifo", "mkdir -p t/etc && mkfifo t/etc/passwd", "sandbox",
       "/etc/passwd: not a regular file"},
      {"huge", "mkdir -p t/etc && yes 'u:x:5:5::/:/bin/sh' | head -c 5000000 > t/etc/passwd",
       "sandbox", "/etc/passwd: larger than 4 MiB"},
      // osh-e2e-sub is a user of the host's, not of the image's.
      {"etc", "mkdir t && ln -s /etc t/etc", "osh-e2e-sub",
       "etc/passwd: too many levels of symbolic links"},
      {"dotdot", "mkdir -p t/etc && ln -s ../../../../../../etc/passwd t/etc/passwd", "osh-e2e-sub",
       "/etc/passwd in the image: too many levels of symbolic links"},
      {"group", "mkdir -p t/etc && ln -s /etc/group t/etc/group", "sandbox:osh-e2e-sub",
       "/etc/group in the image: too many levels of symbolic links"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string layout =
        derived_layout("hostile-user-" + c.name + "-" + mode_name(mode()),
                       "rm -rf t t.tar && " + c.snippet +
                           " && tar -C t -cf t.tar etc && "
                           "umoci raw add-layer --image \"$L:latest\" t.tar && rm -rf t t.tar && "
                           "umoci config --image \"$L:latest\" --config.user " +
                           c.user);
    ASSERT_EQ(os({"image", "import", layout, "hostile-" + c.name}).status, 0);
    Result created = run_in("hostile-" + c.name, {"id", "-u"});
    EXPECT_EQ(created.status, 125) << created.out;
    EXPECT_THAT(created.err, HasSubstr(c.expect));
    EXPECT_EQ(std::count(created.err.begin(), created.err.end(), '\n'), 1) << created.err;
    Result ran = os({"run", "--image", "hostile-" + c.name, "--", "id", "-u"});
    EXPECT_EQ(ran.status, 125) << ran.out;
    EXPECT_THAT(ran.err, HasSubstr(c.expect));
  }
  // The same image's copy (the sandbox's own root) is read inside it too.
  Options copy;
  copy.env.push_back("OPENSHELL_STORAGE=copy");
  os({"gateway", "stop"});
  Result c =
      os({"sandbox", "create", "--no-keep", "--from", "hostile-etc", "--", "id", "-u"}, copy);
  EXPECT_EQ(c.status, 125) << c.out;
  EXPECT_THAT(c.err, HasSubstr("/etc/passwd: too many levels of symbolic links"));
}

// The storage is the gateway's choice: an API client's "storage":"copy"
// (a whole copy of the root per sandbox, on the gateway's disk) is refused,
// unless the gateway copies every root anyway (OPENSHELL_STORAGE=copy).
TEST_P(Images, ClientsDoNotChooseTheStorage) {
  import_busybox();
  ASSERT_EQ(os({"sandbox", "list"}).status, 0);  // starts the gateway
  const std::string sock = home_ + "/run/gateway.sock";
  auto create = [&](const std::string& name) {
    return sh("curl -s --unix-socket " + q(sock) + " -X POST http://localhost/v1/sandboxes -d " +
              q("{\"name\":\"" + name +
                "\",\"spec\":{\"from\":\"busybox\",\"storage\":\"copy\",\"command\":[\"true\"]}}"));
  };
  Shell refused = create("copy1");
  EXPECT_THAT(refused.out, HasSubstr("\"invalid_spec\""));
  EXPECT_THAT(refused.out, HasSubstr("storage 'copy': chosen by the gateway, not by its clients"));
  EXPECT_THAT(os({"sandbox", "list"}).out, Not(HasSubstr("copy1")));
  os({"gateway", "stop"});
  Options copy;
  copy.env.push_back("OPENSHELL_STORAGE=copy");
  ASSERT_EQ(os({"sandbox", "list"}, copy).status, 0);
  Shell accepted = create("copy2");
  EXPECT_THAT(accepted.out, Not(HasSubstr("\"error\"")));
  EXPECT_EQ(field_of(os({"sandbox", "get", "copy2", "-o", "json"}).out, "storage"), "copy");
  // curl ran as root: the sandbox is root's, which `delete --all` (the
  // caller's own) leaves; the gateway's user, an admin of its gateway, may
  // delete it by name.
  EXPECT_EQ(os({"sandbox", "delete", "copy2"}).status, 0);
}

TEST_P(Images, WorkspaceAndChangesPersistAcrossStopAndStart) {
  import_busybox();
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "keep", "--from", "busybox", "-d", "--", "sleep", "600"})
          .status,
      0);
  Result w = os({"sandbox", "exec", "keep", "--", "sh", "-c",
                 "echo notes > /sandbox/notes; echo changed > /tmp/x"});
  ASSERT_EQ(w.status, 0) << w.err;
  ASSERT_EQ(os({"sandbox", "stop", "keep"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "keep"}).status, 0);
  Result r = os({"sandbox", "exec", "keep", "--", "cat", "/sandbox/notes"});
  EXPECT_EQ(r.out, "notes\n") << r.err;
  // The image itself is untouched: a new sandbox sees no notes.
  Result fresh = run_in("busybox", {"sh", "-c", "ls /sandbox | wc -l"});
  EXPECT_EQ(fresh.out, "0\n") << fresh.err;
}

TEST_P(Images, WhiteoutsAndOpaqueDirectoriesApply) {
  // A second layer deletes /etc/motd-gone and makes /etc/opaque opaque.
  const std::string layout = derived_layout(
      "whiteouts-" + mode_name(mode()),
      "mkdir -p l1/etc/opaque && echo a > l1/etc/opaque/a && echo old > l1/etc/motd-gone && "
      "tar -C l1 -cf l1.tar . && umoci raw add-layer --image \"$L:latest\" l1.tar && "
      "mkdir -p l2/etc/opaque && echo b > l2/etc/opaque/b && : > l2/etc/opaque/.wh..wh..opq && "
      ": > l2/etc/.wh.motd-gone && tar -C l2 -cf l2.tar . && "
      "umoci raw add-layer --image \"$L:latest\" l2.tar && rm -rf l1 l2 l1.tar l2.tar");
  ASSERT_EQ(os({"image", "import", layout, "wh"}).status, 0);
  Result r = run_in(
      "wh", {"sh", "-c", "ls /etc/opaque; test -e /etc/motd-gone && echo present || echo gone"});
  EXPECT_EQ(r.out, "b\ngone\n") << r.err;
  // Through the copy fallback as well.
  Options copy;
  copy.env.push_back("OPENSHELL_STORAGE=copy");
  os({"gateway", "stop"});
  Result c = os({"sandbox", "create", "--no-keep", "--from", "wh", "--", "sh", "-c",
                 "ls /etc/opaque; test -e /etc/motd-gone && echo present || echo gone"},
                copy);
  EXPECT_EQ(c.out, "b\ngone\n") << c.err;
}

TEST_P(Images, CopyFallbackSaysSoAndKeepsTheWorkspace) {
  import_busybox();
  Options copy;
  copy.env.push_back("OPENSHELL_STORAGE=copy");
  Result created = os(
      {"sandbox", "create", "--name", "cp", "--from", "busybox", "-d", "--", "sleep", "600"}, copy);
  ASSERT_EQ(created.status, 0) << created.err;
  EXPECT_THAT(created.err,
              HasSubstr("warning: overlayfs cannot stack the root here (OPENSHELL_STORAGE=copy)"));
  Result get = os({"sandbox", "get", "cp"});
  EXPECT_THAT(get.out, HasSubstr("Storage:"));
  EXPECT_THAT(get.out, HasSubstr("copy: overlayfs cannot stack the root here"));
  ASSERT_EQ(os({"sandbox", "exec", "cp", "--", "sh", "-c", "echo kept > /sandbox/k"}).status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "cp"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "cp"}).status, 0);
  EXPECT_EQ(os({"sandbox", "exec", "cp", "--", "cat", "/sandbox/k"}).out, "kept\n");
  // The copy's /sandbox is its user's too.
  const std::string layout =
      derived_layout("copy-user-" + mode_name(mode()),
                     "umoci config --image \"$L:latest\" --config.user 1234:1234");
  ASSERT_EQ(os({"image", "import", layout, "copy-user"}).status, 0);
  Result home = os({"sandbox", "create", "--no-keep", "--from", "copy-user", "--", "sh", "-c",
                    "id -u; echo b > $HOME/b && cat $HOME/b"},
                   copy);
  EXPECT_EQ(home.out, "1234\nb\n") << home.err;
}

TEST_P(Images, RemovePruneAndSandboxesKeepTheirLayers) {
  import_busybox();
  import_busybox("second");
  EXPECT_EQ(count_words(layers()), 1u);
  ASSERT_EQ(os({"sandbox", "create", "--name", "user", "--from", "busybox", "--", "true"}).status,
            0);
  Result rm = os({"image", "rm", "busybox", "second"});
  EXPECT_EQ(rm.status, 0) << rm.err;
  EXPECT_THAT(rm.out, HasSubstr("Untagged localhost/busybox:latest"));
  EXPECT_EQ(names(), "");
  Result prune = os({"image", "prune"});
  EXPECT_EQ(prune.status, 0) << prune.err;
  // The sandbox still uses the layer: it stays, and the sandbox starts.
  EXPECT_EQ(count_words(layers()), 1u);
  Result start = os({"sandbox", "start", "user"});
  EXPECT_EQ(start.status, 0) << start.err;
  ASSERT_EQ(os({"sandbox", "delete", "user"}).status, 0);
  Result prune2 = os({"image", "prune", "-o", "json"});
  EXPECT_THAT(prune2.out, HasSubstr("\"layers\": 1"));
  EXPECT_EQ(layers(), "");
  Result again = os({"image", "rm", "busybox"});
  EXPECT_EQ(again.status, 125);
  EXPECT_THAT(again.err, HasSubstr("not in the store"));
}

// Without a mirror to build it from (apt sources that name none), a
// missing base says how to build or import it (doctor_test.cc fakes each
// reason).
TEST_P(Images, MissingDefaultImageSaysHowToBuildIt) {
  Options o;
  o.env.push_back("OPENSHELL_APT_ROOT=" + home_);
  Result r = os({"sandbox", "create", "--", "true"}, o);
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("openshell image build-base --mirror URL"));
  EXPECT_EQ(file_contents_of_dir(home_ + "/sandboxes"), "");
}

TEST_P(Images, HostileLayersAreRefusedAndTouchNothingOutside) {
  const std::string outside = make_dir(mode(), "outside-" + mode_name(mode()), 0777);
  struct Case {
    std::string name, snippet, expect;
  };
  const std::vector<Case> cases = {
      {"symlink",
       "mkdir -p h/a h/b/evil && ln -s " + outside +
           " h/a/evil && echo pwned > h/b/evil/pwned && "
           "tar -C h/a -cf h.tar evil && tar -C h/b -rf h.tar evil/pwned",
       "evil/pwned"},
      {"dotdot",
       "mkdir -p h/x && echo pwned > h/pwned && cd h/x && tar -cPf ../../h.tar ../pwned && cd "
       "../..",
       "'..'"},
      {"absolute",
       "mkdir -p h && echo pwned > " + outside + "-src && tar -cPf h.tar " + outside + "-src",
       "absolute"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string layout =
        derived_layout("hostile-" + c.name + "-" + mode_name(mode()),
                       "rm -rf h h.tar && " + c.snippet +
                           " && umoci raw add-layer --image \"$L:latest\" h.tar && rm -rf h h.tar");
    Result r = os({"image", "import", layout, "hostile"});
    EXPECT_EQ(r.status, 125);
    EXPECT_THAT(r.err, HasSubstr(c.expect));
    EXPECT_EQ(file_contents_of_dir(outside), "");
    EXPECT_EQ(names(), "");
  }
  if (mode() == Mode::kRoot) {
    const std::string layout = derived_layout(
        "hostile-device",
        "rm -rf h h.tar && mkdir h && mknod h/mem c 1 1 && tar -C h -cf h.tar mem && "
        "umoci raw add-layer --image \"$L:latest\" h.tar && rm -rf h h.tar");
    Result r = os({"image", "import", layout, "hostile"});
    EXPECT_EQ(r.status, 125);
    EXPECT_THAT(r.err, HasSubstr("mem"));
    EXPECT_EQ(names(), "");
  }
}

TEST_P(Images, TamperedBlobsAreRefused) {
  // A layer blob cut in half: its digest no longer matches.
  const std::string layout = derived_layout("truncated-" + mode_name(mode()),
                                            "b=$(ls -S \"$L\"/blobs/sha256/* | head -1) && "
                                            "truncate -s $(( $(stat -c %s \"$b\") / 2 )) \"$b\"",
                                            false);
  Result r = os({"image", "import", layout, "cut"});
  EXPECT_EQ(r.status, 125);
  // The unpacking reads past the end first: that is the one reason given.
  EXPECT_THAT(r.err, StartsWith("Importing localhost/cut:latest: 1 of 1 layers to unpack ("));
  EXPECT_THAT(r.err,
              ContainsRegex("\nopenshell: layer sha256:[0-9a-f]{12}: truncated gzip input\n$"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  expect_store_empty();
}

TEST_P(Images, PullsFromARegistryByTagAndDigest) {
  Registry* reg = registry();
  if (!reg->ok())
    GTEST_SKIP() << "docker-registry did not start (is the docker-registry package installed?)";
  ASSERT_TRUE(reg->push(busybox_layout(), "test/busybox:latest"));
  const std::string ref = reg->host() + "/test/busybox:latest";
  Result r = os({"image", "pull", ref});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("1 of 1 layers to fetch"));
  EXPECT_EQ(names(), ref + "\n");
  // Again: nothing to fetch.
  Result again = os({"image", "pull", ref});
  EXPECT_THAT(again.err, HasSubstr("already stored"));
  // On a terminal: one line redrawn, with a bar.
  ASSERT_EQ(os({"image", "rm", ref}).status, 0);
  ASSERT_EQ(os({"image", "prune"}).status, 0);
  Options tty;
  tty.pty = true;
  tty.cols = 160;
  tty.rows = 24;
  Result drawn = os({"image", "pull", ref}, tty);
  EXPECT_EQ(drawn.status, 0) << drawn.out;
  EXPECT_THAT(drawn.out, HasSubstr("\r\033[KPulling " + ref + " ["));
  EXPECT_THAT(drawn.out, HasSubstr("1/1 layers"));
  // By digest.
  Result inspect = os({"image", "inspect", ref});
  auto pos = inspect.out.find("\"digest\": \"");
  ASSERT_NE(pos, std::string::npos);
  const std::string digest = inspect.out.substr(pos + 11, 71);
  Result by_digest = os({"image", "pull", reg->host() + "/test/busybox@" + digest});
  EXPECT_EQ(by_digest.status, 0) << by_digest.err;
  Result run = run_in(ref, {"echo", "pulled"});
  EXPECT_EQ(run.out, "pulled\n") << run.err;
}

TEST_P(Images, ShortNamesComeFromTheConfiguredRegistryOnly) {
  Registry* reg = registry();
  if (!reg->ok()) GTEST_SKIP() << "docker-registry did not start";
  ASSERT_TRUE(reg->push(busybox_layout(), "test/short:1"));
  // Nothing configured: refused in one line that says both fixes.
  Options none;
  none.env = {"OPENSHELL_REGISTRIES_CONF=" + home_ + "/absent.conf", "OPENSHELL_DEFAULT_REGISTRY="};
  Result refused = os({"image", "pull", "test/short:1"}, none);
  EXPECT_EQ(refused.status, 125);
  EXPECT_EQ(refused.err,
            "openshell: image reference 'test/short:1' names no registry: write "
            "REGISTRY/NAME[:TAG], or configure a default (OPENSHELL_DEFAULT_REGISTRY, "
            "gateway.toml images.default_registry, or unqualified-search-registries in "
            "/etc/containers/registries.conf)\n");
  expect_store_empty();
  // registries.conf's first search registry.
  const std::string conf = home_ + "/registries.conf";
  write_file(conf, "unqualified-search-registries = [\"" + reg->host() +
                       "\"]\n[[registry]]\nprefix = \"mirror.test\"\nlocation = \"" + reg->host() +
                       "\"\n");
  Options searched;
  searched.env = {"OPENSHELL_REGISTRIES_CONF=" + conf, "OPENSHELL_DEFAULT_REGISTRY="};
  Result r = os({"image", "pull", "test/short:1"}, searched);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(os({"image", "list", "-q"}, searched).out, "test/short:1\n");
  EXPECT_EQ(names(), reg->host() + "/test/short:1\n");  // another default: shown whole
  // The variable wins; a location says where the registry's API is.
  Options mapped = searched;
  mapped.env.back() = "OPENSHELL_DEFAULT_REGISTRY=mirror.test";
  Result via = os({"image", "pull", "test/short:1"}, mapped);
  ASSERT_EQ(via.status, 0) << via.err;
  EXPECT_EQ(os({"image", "list", "-q"}, mapped).out, reg->host() + "/test/short:1\ntest/short:1\n");
}

TEST_P(Images, CreatePullsAMissingImage) {
  Registry* reg = registry();
  if (!reg->ok()) GTEST_SKIP() << "docker-registry did not start";
  ASSERT_TRUE(reg->push(busybox_layout(), "test/auto:1"));
  Result r = run_in(reg->host() + "/test/auto:1", {"echo", "auto"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "auto\n");
  EXPECT_THAT(r.err, HasSubstr("Pulling"));
}

TEST_P(Images, RegistryErrorsAreClear) {
  Registry* reg = registry();
  if (!reg->ok()) GTEST_SKIP() << "docker-registry did not start";
  ASSERT_TRUE(reg->push(busybox_layout(), "test/errors:latest"));
  Result tag = os({"image", "pull", reg->host() + "/test/errors:nope"});
  EXPECT_EQ(tag.status, 125);
  EXPECT_THAT(tag.err, HasSubstr("manifest unknown"));
  Result repo = os({"image", "pull", reg->host() + "/test/nothing:latest"});
  EXPECT_EQ(repo.status, 125);
  EXPECT_THAT(repo.err, HasSubstr("404"));
  RefusedPort refusing;
  const std::string closed_host = "127.0.0.1:" + std::to_string(refusing.port());
  Result closed = os({"image", "pull", closed_host + "/x:1"});
  EXPECT_EQ(closed.status, 125);
  EXPECT_THAT(closed.err, HasSubstr(closed_host));
  EXPECT_THAT(closed.err, HasSubstr("Connection refused"));
  Result bad = os({"image", "pull", "Not/A:Ref!"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr("image reference"));
  expect_store_empty();
}

// A registry that is not on localhost speaks HTTPS unless --insecure says
// otherwise. registry.test resolves to the fake registry on 127.0.0.1
// through a hosts file of the test's own.
TEST_P(Images, PlainHttpOnlyForLocalhostOrWithInsecure) {
  FakeRegistry fake(busybox_layout(), "ok");
  ASSERT_TRUE(fake.ok()) << "osh-fake-registry did not start";
  std::string hosts = scratch() + "/hosts-insecure-" + mode_name(mode());
  write_file(hosts, "127.0.0.1 registry.test\n");
  std::string ref = fake.ref();
  ref.replace(0, ref.find(':'), "registry.test");
  Options o;
  o.env.push_back("OPENSHELL_HOSTS_FILE=" + hosts);
  Result tls = os({"image", "pull", ref}, o);
  EXPECT_EQ(tls.status, 125);
  EXPECT_THAT(tls.err, HasSubstr("TLS handshake with registry.test"));
  EXPECT_THAT(tls.err, HasSubstr("--insecure"));
  expect_store_empty();
  Result create = os({"sandbox", "create", "--no-keep", "--from", ref, "--", "true"}, o);
  EXPECT_EQ(create.status, 125);
  EXPECT_THAT(create.err, HasSubstr("--insecure"));
  expect_store_empty();
  // --insecure on each command that pulls.
  Result plain = os({"image", "pull", "--insecure", ref}, o);
  EXPECT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(os({"image", "inspect", ref}).status, 0);
  ASSERT_EQ(os({"image", "rm", ref}).status, 0);
  Result created =
      os({"sandbox", "create", "--no-keep", "--insecure", "--from", ref, "--", "echo", "ok"}, o);
  EXPECT_EQ(created.status, 0) << created.err;
  EXPECT_EQ(created.out, "ok\n");
  ASSERT_EQ(os({"image", "rm", ref}).status, 0);
  Result ran = os({"run", "--insecure", "--image", ref, "--", "echo", "ok"}, o);
  EXPECT_EQ(ran.status, 0) << ran.err;
  EXPECT_EQ(ran.out, "ok\n");
}

TEST_P(Images, MisbehavingRegistriesLeaveNoImage) {
  struct Case {
    std::string mode, expect;
  };
  const std::vector<Case> cases = {
      {"wrong-digest", "digest"}, {"truncate", "bytes"}, {"500", "500"}, {"429", "429"},
      {"401", "authentication"},  {"404-blobs", "404"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.mode);
    FakeRegistry fake(busybox_layout(), c.mode);
    ASSERT_TRUE(fake.ok()) << "osh-fake-registry did not start";
    Result r = os({"image", "pull", fake.ref()});
    EXPECT_EQ(r.status, 125);
    EXPECT_THAT(r.err, HasSubstr(c.expect));
    expect_store_empty();
  }
  // Failures that pass are retried.
  FakeRegistry flaky(busybox_layout(), "500-once");
  ASSERT_TRUE(flaky.ok());
  Result r = os({"image", "pull", flaky.ref()});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_P(Images, ZstdLayersAndPlatformIndexes) {
  // The layer recompressed with zstd, under an index that also names
  // another platform (with the original gzip manifest): this machine's is
  // the zstd one.
  const std::string layout = derived_layout(
      "zstd-" + mode_name(mode()),
      "cd \"$L\" && m=$(sed 's/.*sha256:\\([0-9a-f]*\\).*/\\1/' index.json) && "
      "l=$(grep -o 'layer.v1.tar+gzip\",\"digest\":\"sha256:[0-9a-f]*' blobs/sha256/$m | sed "
      "'s/.*://') && "
      "zcat blobs/sha256/$l | zstd -q -c > z && z=$(sha256sum z | cut -c1-64) && mv z "
      "blobs/sha256/$z && "
      "zs=$(stat -c %s blobs/sha256/$z) && "
      "sed -e "
      "\"s/tar+gzip\\\",\\\"digest\\\":\\\"sha256:$l\\\",\\\"size\\\":[0-9]*/"
      "tar+zstd\\\",\\\"digest\\\":\\\"sha256:$z\\\",\\\"size\\\":$zs/\" "
      "blobs/sha256/$m > m2 && m2=$(sha256sum m2 | cut -c1-64) && m2s=$(stat -c %s m2) && mv m2 "
      "blobs/sha256/$m2 && "
      "arch=$(dpkg --print-architecture) && "
      "printf "
      "'{\"schemaVersion\":2,\"mediaType\":\"application/"
      "vnd.oci.image.index.v1+json\",\"manifests\":["
      "{\"mediaType\":\"application/"
      "vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:%s\",\"size\":%s,"
      "\"platform\":{\"os\":\"linux\",\"architecture\":\"s390x\"}},"
      "{\"mediaType\":\"application/"
      "vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:%s\",\"size\":%s,"
      "\"platform\":{\"os\":\"linux\",\"architecture\":\"%s\"}}]}' $m $(stat -c %s "
      "blobs/sha256/$m) "
      "$m2 $m2s $arch > i && echo sha256:$m2 > manifest-for-this-machine && "
      "i=$(sha256sum i | cut -c1-64) && is=$(stat -c %s i) && mv i blobs/sha256/$i && "
      "printf "
      "'{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/"
      "vnd.oci.image.index.v1+json\","
      "\"digest\":\"sha256:%s\",\"size\":%s,\"annotations\":{\"org.opencontainers.image.ref.name\":"
      "\"latest\"}}]}' "
      "$i $is > index.json && cd - >/dev/null",
      false);
  FakeRegistry fake(layout, "ok");
  ASSERT_TRUE(fake.ok());
  Result r = os({"image", "pull", fake.ref()});
  ASSERT_EQ(r.status, 0) << r.err;
  Result run = run_in(fake.ref(), {"echo", "zstd"});
  EXPECT_EQ(run.out, "zstd\n") << run.err;
  std::string chosen = file_contents(layout + "/manifest-for-this-machine");
  ASSERT_FALSE(chosen.empty());
  EXPECT_THAT(os({"image", "inspect", fake.ref()}).out,
              HasSubstr("\"digest\": \"" + chosen.substr(0, 71) + "\""));
  Result other = os({"image", "pull", "--platform", "linux/riscv64", fake.ref()});
  EXPECT_EQ(other.status, 125);
  EXPECT_THAT(other.err, HasSubstr("no image for linux/riscv64 (it has linux/s390x, linux/"));
}

TEST_P(Images, AFullDiskLeavesNoImage) {
  if (mode() != Mode::kRoot)
    GTEST_SKIP() << "mounting a small tmpfs as the state directory needs root";
  // An image larger than the disk: busybox plus 8 MiB of random bytes.
  const std::string layout = derived_layout(
      "big",
      "mkdir -p b && head -c 8388608 /dev/urandom > b/big && tar -C b -cf b.tar big && "
      "umoci raw add-layer --image \"$L:latest\" b.tar && rm -rf b b.tar");
  ASSERT_EQ(::mount("tmpfs", home_.c_str(), "tmpfs", 0, "size=6m,mode=0700"), 0);
  Result r = os({"image", "import", layout, "big"});
  EXPECT_EQ(r.status, 125);
  // The default bound (90% of the free space) refuses it before the disk would.
  EXPECT_THAT(r.err, HasSubstr("\nopenshell: " + layout + ": unpacks to more than "));
  EXPECT_THAT(r.err, HasSubstr(" (the default bound: 90% of the "));
  EXPECT_THAT(r.err, EndsWith(" MiB free on " + home_ +
                              "/images); set a larger bound with --max-unpacked-size SIZE or "
                              "OPENSHELL_MAX_UNPACKED=SIZE\n"));
  EXPECT_THAT(r.err, Not(HasSubstr("No space left on device")));
  // No image, no work in progress; the layer that fitted stays for the next
  // try until a prune.
  EXPECT_EQ(names(), "");
  EXPECT_EQ(file_contents_of_dir(home_ + "/images/tmp"), "");
  EXPECT_EQ(os({"image", "prune"}).status, 0);
  EXPECT_EQ(layers(), "");
  os({"gateway", "stop"});
  EXPECT_EQ(::umount2(home_.c_str(), MNT_DETACH), 0);
}

// A gzip bomb: 64 MiB of zeros in a layer of about 64 KiB. A bound on the
// unpacked size (--max-unpacked-size, OPENSHELL_MAX_UNPACKED) refuses it
// with one line, before the bytes are written, and leaves no image, no
// layer of it and no work in progress.
TEST_P(Images, AnImageLargerThanTheUnpackedBoundIsRefused) {
  const std::string layout = derived_layout(
      "bomb-" + mode_name(mode()),
      "rm -rf b b.tar && mkdir b && truncate -s 64M b/zeros && tar -C b -cf b.tar zeros && "
      "umoci raw add-layer --image \"$L:latest\" b.tar && rm -rf b b.tar");
  Shell blobs = sh("du -sk " + q(layout + "/blobs"));
  EXPECT_LT(std::atol(blobs.out.c_str()), 8192) << "the bomb is not small: " << blobs.out;
  auto expect_refused = [&](const Result& r, const std::string& bound) {
    EXPECT_EQ(r.status, 125) << r.out;
    EXPECT_THAT(r.err, HasSubstr(": unpacks to more than 16.0 MiB (" + bound +
                                 "); set a larger bound with "
                                 "--max-unpacked-size SIZE or OPENSHELL_MAX_UNPACKED=SIZE"));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(names(), "");
    EXPECT_EQ(file_contents_of_dir(home_ + "/images/tmp"), "");
    // Only the busybox layer below it may stay, until a prune.
    EXPECT_LE(count_words(layers()), 1u) << layers();
    EXPECT_EQ(os({"image", "prune"}).status, 0);
    EXPECT_EQ(layers(), "");
  };
  expect_refused(os({"image", "import", "-q", "--max-unpacked-size", "16M", layout, "bomb"}),
                 "--max-unpacked-size");
  Options env;
  env.env.push_back("OPENSHELL_MAX_UNPACKED=16M");
  expect_refused(os({"image", "import", "-q", layout, "bomb"}, env), "OPENSHELL_MAX_UNPACKED");
  // An archive whose own files are the bomb: counted as they are staged.
  const std::string archive = scratch() + "/bomb-archive-" + mode_name(mode()) + ".tar.gz";
  Shell made = sh("cd " + q(layout) + " && truncate -s 64M junk && tar -czf " + q(archive) +
                  " . && rm junk && chmod a+r " + q(archive));
  ASSERT_EQ(made.status, 0) << made.out;
  expect_refused(os({"image", "import", "-q", "--max-unpacked-size", "16M", archive, "bomb"}),
                 "--max-unpacked-size");
  // The same from a registry.
  FakeRegistry fake(layout, "ok");
  ASSERT_TRUE(fake.ok()) << "osh-fake-registry did not start";
  expect_refused(os({"image", "pull", "-q", "--max-unpacked-size", "16M", fake.ref()}),
                 "--max-unpacked-size");
  Result bad = os({"image", "import", "--max-unpacked-size", "lots", layout, "bomb"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr("--max-unpacked-size lots: not a size"));
}

TEST_P(Images, DefaultBaseImageRunsPython) {
  if (image_helpers::base_layout_source().empty())
    GTEST_SKIP() << "OSH_BASE_LAYOUT is not set (scripts/test builds it with openshell image "
                    "build-base --output)";
  const std::string& readable = image_helpers::readable_base_layout();
  ASSERT_FALSE(readable.empty()) << "cannot copy " << image_helpers::base_layout_source()
                                 << " into " << scratch();
  Options slow;
  slow.timeout_s = 300;
  Result imp = os({"image", "import", readable, "base"}, slow);
  ASSERT_EQ(imp.status, 0) << imp.err;
  Result r = os({"sandbox", "create", "--no-keep", "--", "python3", "-c", "print(1)"});
  EXPECT_EQ(r.out, "1\n") << r.err;
  Result bash = os({"sandbox", "create", "--no-keep", "--", "bash", "-lc",
                    "python3 --version; git --version | cut -d' ' -f1-2; id -un"});
  EXPECT_THAT(bash.out, HasSubstr("Python 3.11"));
  EXPECT_THAT(bash.out, HasSubstr("git version"));
  EXPECT_THAT(bash.out, HasSubstr("sandbox"));
  // Regression (issue 10, bug 2): localhost resolves inside, and a server
  // on the sandbox's loopback answers there.
  const std::string client =
      "import time, urllib.request\n"
      "for i in range(300):\n"
      "    try:\n"
      "        print(urllib.request.urlopen('http://localhost:9000/').status); break\n"
      "    except OSError as e:\n"
      "        last = e; time.sleep(0.1)\n"
      "else:\n"
      "    print(last)\n";
  Result local = os({"sandbox", "create", "--no-keep", "--", "bash", "-c",
                     "cd /tmp && python3 -m http.server 9000 >/dev/null 2>&1 & python3 -c \"$0\"; "
                     "kill %1",
                     client});
  EXPECT_EQ(local.out, "200\n") << local.err;
}

// busybox's command is sh: with no input it ends at once, and the sandbox
// is Completed before anyone could exec into it. create says so.
TEST_P(Images, AMainProcessThatExitsAtOnceSaysSo) {
  import_busybox();
  const std::string warning =
      "the main process exited at once with status 0: sh (the image's command; a shell with no "
      "input ends at once), and the sandbox is Completed. For a sandbox that keeps running for "
      "'sandbox exec', give it a command that lasts: openshell sandbox create --from busybox -- "
      "sleep infinity\n";
  Result detached = os({"sandbox", "create", "--name", "d", "--from", "busybox", "-d"});
  EXPECT_EQ(detached.status, 0) << detached.err;
  EXPECT_EQ(detached.err, "openshell: warning: sandbox 'd': " + warning);
  EXPECT_EQ(detached.out, "d\n");
  Result attached = os({"sandbox", "create", "--name", "a", "--from", "busybox"});
  EXPECT_EQ(attached.status, 0) << attached.err;
  EXPECT_EQ(attached.err, "openshell: warning: sandbox 'a': " + warning);
  // A command that lasts, or one the caller chose, is no surprise.
  Result lasting =
      os({"sandbox", "create", "--name", "l", "--from", "busybox", "-d", "--", "sleep", "600"});
  EXPECT_EQ(lasting.err, "");
  Result chosen = os({"sandbox", "create", "--name", "c", "--from", "busybox", "--", "true"});
  EXPECT_EQ(chosen.status, 0);
  EXPECT_EQ(chosen.err, "");
}

E2E_ALL_MODES(Images);

}  // namespace
}  // namespace e2e
