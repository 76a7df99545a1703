// Who a gateway's sandbox's processes run as: `sandbox create --user` and
// `sandbox exec --user`, root in the sandbox only where the policy has
// process.allow_root, and root there never host root nor any more confined
// than the sandbox's user; installing software as agents do (apt as root,
// pip in a venv) in the base image. As root and rootless.
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::StartsWith;

namespace e2e {
namespace {

class Users : public GatewayTest {
 protected:
  Users() : GatewayTest("users") {}
  Result os(const std::vector<std::string>& args, Options o = {}) override {
    o = with_home(std::move(o));
    o.env.insert(o.env.end(), extra_env_.begin(), extra_env_.end());
    return openshell(mode(), args, o);
  }
  std::string policy(const std::string& body) {
    static int counter = 0;
    return write_file(
        scratch() + "/users-" + mode_name(mode()) + "-" + std::to_string(++counter) + ".toml",
        "version = 1\n" + body);
  }
  std::string allow_root() { return policy("[process]\nallow_root = true\n"); }
  // The base image in this home's store; "" when OSH_BASE_LAYOUT is unset.
  bool import_base() {
    const char* base = std::getenv("OSH_BASE_LAYOUT");
    if (!base || !*base) return false;
    // Readable by every mode's user whatever the layout's directory.
    static const std::string readable = [&] {
      std::string path = scratch() + "/users-base-image.tar";
      std::error_code ec;
      std::filesystem::copy_file(base, path, std::filesystem::copy_options::overwrite_existing, ec);
      ::chmod(path.c_str(), 0644);
      return ec ? std::string() : path;
    }();
    if (readable.empty()) return false;
    Options slow;
    slow.timeout_s = 300;
    Result imp = os({"image", "import", readable, "base"}, slow);
    EXPECT_EQ(imp.status, 0) << imp.err;
    return imp.status == 0;
  }

  std::string home_;
  std::vector<std::string> extra_env_;
};
E2E_ALL_MODES(Users);

// "Cap...", "NoNewPrivs", "Seccomp" lines of a /proc/PID/status text.
std::string confinement_of(const std::string& status) {
  std::istringstream in(status);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("Cap", 0) == 0 || line.rfind("NoNewPrivs", 0) == 0 ||
        line.rfind("Seccomp", 0) == 0)
      out += line + "\n";
  return out;
}

// The host pid of the one process whose command line is exactly argv.
std::string host_pid_of(const std::vector<std::string>& argv) {
  std::string want;
  for (const auto& a : argv) want += a + '\0';
  std::string found;
  DIR* dir = ::opendir("/proc");
  while (dirent* entry = dir ? ::readdir(dir) : nullptr) {
    std::string pid = entry->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in("/proc/" + pid + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline == want) found = pid;
  }
  if (dir) ::closedir(dir);
  return found;
}

TEST_P(Users, RootWithoutAllowRootIsRefusedNamingThePolicyField) {
  const std::string refused =
      "openshell: --user 0: root in the sandbox needs process.allow_root = true in its policy (it "
      "has the default one)\n";
  Result create = os({"sandbox", "create", "--name", "r", "--from", rootfs(), "--user", "0"});
  EXPECT_EQ(create.status, 125);
  EXPECT_EQ(create.err, refused);
  EXPECT_EQ(os({"sandbox", "get", "r"}).status, 125) << "a refused create leaves no sandbox";

  ASSERT_EQ(os({"sandbox", "create", "--name", "u", "--from", rootfs(), "-d"}).status, 0);
  Result exec = os({"sandbox", "exec", "--user", "0", "u", "--", "id", "-u"});
  EXPECT_EQ(exec.status, 125);
  EXPECT_EQ(exec.out, "");
  EXPECT_EQ(exec.err, refused);
  // By name and by group too: root's group is root's.
  Result by_name = os({"sandbox", "exec", "-u", "root", "u", "--", "id", "-u"});
  EXPECT_EQ(by_name.status, 125);
  EXPECT_THAT(by_name.err, StartsWith("openshell: --user root: root in the sandbox needs "
                                      "process.allow_root = true"));
  Result group = os({"sandbox", "exec", "-u", "1000:0", "u", "--", "id", "-u"});
  EXPECT_EQ(group.status, 125);
  EXPECT_THAT(group.err, StartsWith("openshell: --user 1000:0: root in the sandbox needs"));
  // A policy that says no says so by its file's name.
  const std::string no = policy("[process]\nallow_root = false\n");
  Result with_file = os(
      {"sandbox", "create", "--name", "r2", "--from", rootfs(), "--policy", no, "--user", "root"});
  EXPECT_EQ(with_file.status, 125);
  EXPECT_EQ(with_file.err,
            "openshell: --user root: root in the sandbox needs process.allow_root "
            "= true in its policy (" +
                no + ")\n");
  // An unknown name is one line too.
  Result unknown = os({"sandbox", "exec", "--user", "nosuchuser", "u", "--", "id"});
  EXPECT_EQ(unknown.status, 125);
  EXPECT_THAT(unknown.err, HasSubstr("nosuchuser"));
  EXPECT_EQ(std::count(unknown.err.begin(), unknown.err.end(), '\n'), 1) << unknown.err;
  EXPECT_EQ(os({"sandbox", "delete", "u"}).status, 0);
}

// exec --user UID[:GID] runs as those ids, confined exactly like the main
// process: the same capabilities (none), no_new_privs and seccomp filter.
TEST_P(Users, ExecUserIsConfinedLikeTheMainProcess) {
  const std::string marker = "4242" + std::to_string(static_cast<int>(mode()));
  Result create = os({"sandbox", "create", "--name", "x", "--from", rootfs(), "--policy",
                      allow_root(), "-d", "--", "sleep", marker});
  ASSERT_EQ(create.status, 0) << create.err;
  const std::string main_pid = host_pid_of({"sleep", marker});
  ASSERT_FALSE(main_pid.empty()) << "the main process is not to be found";
  const std::string main_confinement =
      confinement_of(file_contents("/proc/" + main_pid + "/status"));
  // Nothing of what the init keeps to switch users (CAP_SETUID, CAP_SETGID).
  for (const char* set : {"CapPrm", "CapEff", "CapInh", "CapAmb", "CapBnd"})
    EXPECT_THAT(main_confinement, HasSubstr(std::string(set) + ":\t0000000000000000"));
  EXPECT_THAT(main_confinement, HasSubstr("NoNewPrivs:\t1"));
  EXPECT_THAT(main_confinement, HasSubstr("Seccomp:\t2"));

  Result own =
      os({"sandbox", "exec", "x", "--", "sh", "-c", "id -u; id -g; cat /proc/self/status"});
  ASSERT_EQ(own.status, 0) << own.err;
  EXPECT_THAT(own.out, StartsWith("1000\n1000\n"));
  EXPECT_EQ(confinement_of(own.out), main_confinement);

  const bool single = mode() == Mode::kRootlessSingle;
  for (const std::string user : {"0", "0:0", "root", "1234:55"}) {
    SCOPED_TRACE(user);
    Result r = os({"sandbox", "exec", "--user", user, "x", "--", "sh", "-c",
                   "id -u; id -g; cat /proc/self/status"});
    if (single) {
      // One id: nothing but the sandbox's own user exists in it.
      EXPECT_EQ(r.status, 125);
      EXPECT_EQ(r.err, "openshell: --user " + user +
                           ": the sandbox holds only its own user (1000:1000): rootless without "
                           "subordinate ids in /etc/subuid and /etc/subgid\n");
      continue;
    }
    ASSERT_EQ(r.status, 0) << r.err;
    const bool root = user != "1234:55";
    EXPECT_THAT(r.out, StartsWith(root ? "0\n0\n" : "1234\n55\n"));
    EXPECT_EQ(confinement_of(r.out), main_confinement);
  }
  // The same user as the sandbox's needs nothing more, in every mode.
  Result same = os({"sandbox", "exec", "-u", "sandbox", "x", "--", "id", "-u"});
  EXPECT_EQ(same.status, 0) << same.err;
  EXPECT_EQ(same.out, "1000\n");
  // The init keeps what switching users takes for itself: its processes never see it.
  Result tty = os({"sandbox", "exec", "-t", "-u", single ? "1000" : "0", "x", "--", "sh", "-c",
                   "grep CapEff /proc/self/status"});
  EXPECT_EQ(tty.status, 0) << tty.err;
  EXPECT_THAT(tty.out, HasSubstr("CapEff:\t0000000000000000"));
  EXPECT_EQ(os({"sandbox", "delete", "x"}).status, 0);
}

// create --user: the main process runs as it, and again after stop/start.
TEST_P(Users, CreateUserRunsTheMainProcessAsIt) {
  Result r = os({"sandbox", "create", "--name", "c", "--from", rootfs(), "--policy", allow_root(),
                 "--user", "0", "--", "sh", "-c", "id -u; id -g"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "0\n0\n");
  ASSERT_EQ(os({"sandbox", "start", "c"}).status, 0);
  Result logs;
  for (int i = 0; i < 1500; ++i) {
    logs = os({"logs", "c"});
    if (logs.out == "0\n0\n0\n0\n") break;
    ::usleep(20000);
  }
  EXPECT_EQ(logs.out, "0\n0\n0\n0\n");
  Result other = os({"sandbox", "create", "--no-keep", "--from", rootfs(), "-u", "1234:55", "--",
                     "sh", "-c", "id -u; id -g; touch /sandbox/mine && echo wrote"});
  EXPECT_EQ(other.status, 0) << other.err;
  EXPECT_EQ(other.out, "1234\n55\nwrote\n");
  EXPECT_EQ(os({"sandbox", "delete", "c"}).status, 0);
}

// Root in the sandbox is an unprivileged id outside: never host root, and
// refused what host root may do.
TEST_P(Users, RootInTheSandboxIsNotHostRoot) {
  const std::string marker = "4343" + std::to_string(static_cast<int>(mode()));
  Result create = os({"sandbox", "create", "--name", "h", "--from", rootfs(), "--policy",
                      allow_root(), "--user", "0", "-d", "--", "sleep", marker});
  ASSERT_EQ(create.status, 0) << create.err;
  const std::string pid = host_pid_of({"sleep", marker});
  ASSERT_FALSE(pid.empty());
  struct stat st {};
  ASSERT_EQ(::stat(("/proc/" + pid).c_str(), &st), 0);
  EXPECT_NE(st.st_uid, 0u) << "root in the sandbox is host root";
  EXPECT_NE(st.st_gid, 0u);
  // Rootless, a sandbox made for root maps it to the caller: no one more.
  if (is_rootless(mode())) {
    EXPECT_EQ(st.st_uid, uid_of(mode()));
  }
  // What host root could do, root in the sandbox cannot.
  Result sysctl = os({"sandbox", "exec", "h", "--", "sh", "-c",
                      "id -u; echo openshell > /proc/sys/kernel/domainname"});
  EXPECT_EQ(sysctl.status, 1) << sysctl.err;
  EXPECT_EQ(sysctl.out, "0\n");
  EXPECT_THAT(sysctl.err,
              testing::AnyOf(HasSubstr("Permission denied"), HasSubstr("Read-only file system")));
  Result mount = os({"sandbox", "exec", "h", "--", "mount", "-t", "tmpfs", "x", "/mnt"});
  EXPECT_NE(mount.status, 0);
  EXPECT_THAT(mount.err, HasSubstr("permission denied"));  // busybox's words for EPERM
  // No CAP_CHOWN: root may not give a file away.
  Result chown =
      os({"sandbox", "exec", "h", "--", "sh", "-c", "touch /tmp/f && chown 1234 /tmp/f"});
  EXPECT_EQ(chown.status, 1);
  EXPECT_THAT(chown.err, HasSubstr(mode() == Mode::kRootlessSingle ? "Invalid argument"
                                                                   : "Operation not permitted"));
  // From root to another user: nothing of root's stays.
  Result down = os({"sandbox", "exec", "-u", "1000", "h", "--", "sh", "-c",
                    "id -u; grep -E '^Cap(Prm|Eff|Amb)' /proc/self/status"});
  if (mode() == Mode::kRootlessSingle) {
    EXPECT_EQ(down.status, 125);
    EXPECT_THAT(down.err, HasSubstr("the sandbox holds only its own user (0:0)"));
  } else {
    EXPECT_EQ(down.status, 0) << down.err;
    EXPECT_EQ(down.out,
              "1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t"
              "0000000000000000\n");
  }
  EXPECT_EQ(os({"sandbox", "delete", "h"}).status, 0);
}

// The recipe of docs/policy.md: apt-get install as root in the base image,
// from a repository the test makes in the sandbox (no mirror is reached).
TEST_P(Users, AptInstallsAsRootWhereThePolicyAllowsIt) {
  if (!import_base())
    GTEST_SKIP() << "OSH_BASE_LAYOUT is not set (scripts/test builds it with openshell image "
                    "build-base --output)";
  const std::string p = policy(
      "[filesystem_policy]\nread_only = [\"/proc\", \"/sys\", \"/dev\"]\n"
      "read_write = [\"/usr\", \"/etc\", \"/var\", \"/opt\", \"/lib\", \"/bin\", \"/sbin\", "
      "\"/sandbox\", \"/tmp\", \"/dev/null\", \"/dev/shm\", \"/dev/pts\", \"/root\"]\n"
      "[process]\nallow_root = true\n");
  // Rootless, the image's files belong to the id the caller maps to (no
  // idmapped mounts without root): the sandbox is made for root, which is
  // then the caller's own id. As root, files keep their owners and root is
  // one more of the sandbox's users.
  const bool made_for_root = is_rootless(mode());
  std::vector<std::string> create = {"sandbox", "create", "--name", "apt", "--policy", p, "-d"};
  if (made_for_root) create.insert(create.end(), {"--user", "0"});
  Result made = os(create);
  ASSERT_EQ(made.status, 0) << made.err;
  // A package, and a flat repository of it, made with what the image has.
  Result repo = os({"sandbox", "exec", "apt", "--", "bash", "-euc",
                    "mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/bin /tmp/repo\n"
                    "printf 'Package: osh-demo\\nVersion: 1.0\\nArchitecture: all\\n"
                    "Maintainer: test <t@t>\\nDescription: demo\\n' > /tmp/pkg/DEBIAN/control\n"
                    "printf '#!/bin/sh\\necho osh-demo works\\n' > /tmp/pkg/usr/bin/osh-demo\n"
                    "chmod 755 /tmp/pkg/usr/bin/osh-demo\n"
                    "dpkg-deb --root-owner-group --build /tmp/pkg /tmp/repo/osh-demo_1.0_all.deb "
                    ">/dev/null\n"
                    "cd /tmp/repo\n"
                    "{ dpkg-deb -f osh-demo_1.0_all.deb; echo Filename: ./osh-demo_1.0_all.deb;"
                    "  echo Size: $(stat -c %s osh-demo_1.0_all.deb);"
                    "  echo SHA256: $(sha256sum osh-demo_1.0_all.deb | cut -d' ' -f1); echo; }"
                    " > Packages\n"
                    "chmod -R a+rX /tmp/repo"});
  ASSERT_EQ(repo.status, 0) << repo.err;
  Options slow;
  slow.timeout_s = 300;
  std::vector<std::string> as_root = {"sandbox", "exec"};
  if (!made_for_root) as_root.insert(as_root.end(), {"--user", "0"});
  as_root.insert(as_root.end(), {"apt", "--", "bash", "-euc",
                                 "echo 'deb [trusted=yes] file:/tmp/repo ./' > "
                                 "/etc/apt/sources.list\n"
                                 "apt-get -o APT::Sandbox::User=root -qq update\n"
                                 "apt-get -o APT::Sandbox::User=root -qq install -y osh-demo "
                                 ">/dev/null\n"
                                 "echo installed"});
  Result install = os(as_root, slow);
  EXPECT_EQ(install.status, 0) << install.out << install.err;
  EXPECT_THAT(install.out, HasSubstr("installed"));
  // Installed for every user of the sandbox.
  Result use = os({"sandbox", "exec", "apt", "--", "osh-demo"});
  EXPECT_EQ(use.status, 0) << use.err;
  EXPECT_EQ(use.out, "osh-demo works\n");
  EXPECT_EQ(os({"sandbox", "delete", "apt"}).status, 0);
}

// A wheel, as pip wants it: a zip with the module and its dist-info.
std::string make_wheel(const std::string& dir) {
  const std::string script =
      "import base64, hashlib, sys, zipfile\n"
      "d = sys.argv[1]\n"
      "files = {'oshdemo/__init__.py': b'def hello():\\n    return \"oshdemo works\"\\n',\n"
      "  'oshdemo-1.0.dist-info/METADATA': b'Metadata-Version: 2.1\\nName: oshdemo\\nVersion: "
      "1.0\\n',\n"
      "  'oshdemo-1.0.dist-info/WHEEL': b'Wheel-Version: 1.0\\nGenerator: test\\n"
      "Root-Is-Purelib: true\\nTag: py3-none-any\\n'}\n"
      "rec = ''.join('%s,sha256=%s,%d\\n' % (n, base64.urlsafe_b64encode("
      "hashlib.sha256(b).digest()).rstrip(b'=').decode(), len(b)) for n, b in files.items())\n"
      "rec += 'oshdemo-1.0.dist-info/RECORD,,\\n'\n"
      "with zipfile.ZipFile(d + '/oshdemo-1.0-py3-none-any.whl', 'w') as z:\n"
      "    for n, b in files.items(): z.writestr(n, b)\n"
      "    z.writestr('oshdemo-1.0.dist-info/RECORD', rec)\n";
  write_file(dir + "/make_wheel.py", script);
  std::string command = "python3 " + dir + "/make_wheel.py " + dir;
  if (std::system(command.c_str()) != 0) return "";
  return file_contents(dir + "/oshdemo-1.0-py3-none-any.whl");
}

// One GET a connection, answered from `files` (path -> body), else 404.
class StaticHttpServer {
 public:
  explicit StaticHttpServer(std::map<std::string, std::string> files)
      : files_(std::move(files)), server_([this](int fd) { serve(fd); }) {}
  uint16_t port() const { return server_.port(); }
  int answered() const { return answered_.load(); }

 private:
  void serve(int fd) {
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::string path;
    if (request.rfind("GET ", 0) == 0) path = request.substr(4, request.find(' ', 4) - 4);
    // Through the proxy a client may send the absolute form.
    if (auto scheme = path.find("://"); scheme != std::string::npos)
      path = path.substr(path.find('/', scheme + 3));
    auto it = files_.find(path);
    std::string body = it == files_.end() ? "not here\n" : it->second;
    std::string head =
        std::string("HTTP/1.1 ") + (it == files_.end() ? "404 Not Found" : "200 OK") +
        "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nContent-Type: " +
        (path.size() > 4 && path.substr(path.size() - 4) == ".whl" ? "application/octet-stream"
                                                                   : "text/html") +
        "\r\nConnection: close\r\n\r\n";
    std::string reply = head + body;
    for (size_t sent = 0; sent < reply.size();) {
      ssize_t n = ::send(fd, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    if (it != files_.end()) ++answered_;
    ::close(fd);
  }

  std::map<std::string, std::string> files_;
  std::atomic<int> answered_{0};
  LoopbackTcpServer server_;
};

// python3 -m venv and pip install through a policy that allows the package
// index: here a "simple" index the test serves on the host's loopback.
TEST_P(Users, PipInstallsIntoAVenvThroughThePolicy) {
  if (!import_base())
    GTEST_SKIP() << "OSH_BASE_LAYOUT is not set (scripts/test builds it with openshell image "
                    "build-base --output)";
  const std::string dir = make_dir(mode(), "pip-" + mode_name(mode()));
  const std::string wheel = make_wheel(dir);
  ASSERT_FALSE(wheel.empty()) << "python3 could not make the wheel";
  StaticHttpServer index({{"/simple/oshdemo/",
                           "<html><body><a href=\"/files/oshdemo-1.0-py3-none-any.whl\">"
                           "oshdemo-1.0-py3-none-any.whl</a></body></html>\n"},
                          {"/files/oshdemo-1.0-py3-none-any.whl", wheel}});
  const std::string port = std::to_string(index.port());
  const std::string hosts = write_file(dir + "/hosts", "127.0.0.1 pypi.test\n");
  extra_env_ = {"OPENSHELL_HOSTS_FILE=" + hosts};
  const std::string p =
      policy("[network_policies.pypi]\nendpoints = [ { host = \"pypi.test\", port = " + port +
             ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  ASSERT_EQ(os({"sandbox", "create", "--name", "py", "--policy", p, "-d"}).status, 0);
  Options slow;
  slow.timeout_s = 300;
  Result pip = os({"sandbox", "exec", "py", "--", "bash", "-euc",
                   "python3 -m venv /sandbox/.venv\n"
                   "/sandbox/.venv/bin/pip install -q --disable-pip-version-check "
                   "--trusted-host pypi.test --index-url http://pypi.test:" +
                       port +
                       "/simple oshdemo\n"
                       "/sandbox/.venv/bin/python -c 'import oshdemo; print(oshdemo.hello())'"},
                  slow);
  EXPECT_EQ(pip.status, 0) << pip.out << pip.err;
  EXPECT_EQ(pip.out, "oshdemo works\n") << pip.err;
  EXPECT_EQ(index.answered(), 2) << "the index and the wheel, each once";
  // Elsewhere the policy lets nothing through: the proxy refuses (pip itself
  // says no more than "not found").
  Result other = os(
      {"sandbox", "exec", "py", "--", "/sandbox/.venv/bin/python", "-c",
       "import urllib.request as u; u.urlopen('http://other.test:" + port + "/simple/oshdemo/')"});
  EXPECT_EQ(other.status, 1);
  EXPECT_THAT(other.err, HasSubstr("urllib.error.HTTPError: HTTP Error 403")) << other.err;
  EXPECT_EQ(index.answered(), 2);
  EXPECT_EQ(os({"sandbox", "delete", "py"}).status, 0);
}

}  // namespace
}  // namespace e2e
