// Who may do what on a gateway that several users share (docs/api.md,
// "Principals and authorization"): a root gateway whose socket is opened
// to a group, two users of that group who each see and touch only their
// own sandboxes, root who sees them all, a user outside the group who
// cannot connect, and host paths that a user cannot read given to the
// gateway to read for them (attacks, each seen to fail).
//
// The users speak the API on the socket directly, as their own uid: the
// refusals are the API's (403 and its code), and what they may still do is
// shown by the same calls succeeding on their own sandboxes.
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;
using json = nlohmann::json;

namespace e2e {
namespace {

constexpr const char* kGroup = "osh-e2e-authz";
constexpr const char* kAlice = "osh-e2e-alice";
constexpr const char* kBob = "osh-e2e-bob";
constexpr const char* kCarol = "osh-e2e-carol";  // not in the group

struct User {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

int shell(const std::string& command) { return std::system(command.c_str()); }

bool lookup(const std::string& name, User* user) {
  passwd* pw = ::getpwnam(name.c_str());
  if (!pw) return false;
  user->name = name;
  user->uid = pw->pw_uid;
  user->gid = pw->pw_gid;
  int n = 64;
  user->groups.resize(64);
  while (::getgrouplist(name.c_str(), pw->pw_gid, user->groups.data(), &n) < 0)
    user->groups.resize(static_cast<size_t>(n));
  user->groups.resize(static_cast<size_t>(n));
  return true;
}

struct Reply {
  int status = 0;  // 0: no status line came back
  int connect_errno = 0;
  std::string raw;
  std::string body;
  json json_body() const { return json::parse(body, nullptr, false); }
  std::string code() const {
    json j = json_body();
    return j.is_object() && j.contains("error") ? j["error"].value("code", "") : "";
  }
  std::string message() const {
    json j = json_body();
    return j.is_object() && j.contains("error") ? j["error"].value("message", "") : "";
  }
};

// Sends the request on the socket as the user (with the user's groups) and
// reads until the gateway closes the connection (20 s at most). The child
// does only system calls: the request is built before the fork.
Reply exchange(const User& user, const std::string& socket_path, const std::string& request) {
  Reply reply;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) return reply;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return reply;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    ::close(err[0]);
    if (::setgroups(user.groups.size(), user.groups.data()) != 0 ||
        ::setresgid(user.gid, user.gid, user.gid) != 0 ||
        ::setresuid(user.uid, user.uid, user.uid) != 0)
      ::_exit(121);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      int e = errno;
      if (::write(err[1], &e, sizeof e) != sizeof e) ::_exit(125);
      ::_exit(0);
    }
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size()))
      ::_exit(123);
    char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20000) != 1) ::_exit(124);
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) ::_exit(0);
      if (::write(out[1], buf, static_cast<size_t>(n)) != n) ::_exit(125);
    }
  }
  ::close(out[1]);
  ::close(err[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;)
    reply.raw.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  if (::read(err[0], &reply.connect_errno, sizeof reply.connect_errno) <= 0)
    reply.connect_errno = 0;
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << request.substr(0, request.find('\r')) << ": the client ended with " << status
      << " (124: no close within 20 s)";
  if (reply.raw.rfind("HTTP/1.1 ", 0) == 0 && reply.raw.size() >= 12)
    reply.status = std::atoi(reply.raw.substr(9, 3).c_str());
  size_t at = reply.raw.find("\r\n\r\n");
  if (at != std::string::npos) reply.body = reply.raw.substr(at + 4);
  return reply;
}

// A connection kept open as the user (a WebSocket stream): what came back
// so far in `text`; read_until waits (20 s at most) for a piece of it.
class Stream {
 public:
  Stream(const User& user, const std::string& socket_path, const std::string& request) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket_path.c_str(),
                std::min(socket_path.size(), sizeof addr.sun_path - 1));
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(out[0]);
      if (::setgroups(user.groups.size(), user.groups.data()) != 0 ||
          ::setresgid(user.gid, user.gid, user.gid) != 0 ||
          ::setresuid(user.uid, user.uid, user.uid) != 0)
        ::_exit(121);
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
        ::_exit(122);
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size()))
        ::_exit(123);
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
        if (::write(out[1], buf, static_cast<size_t>(n)) != n) break;
      ::_exit(0);
    }
    ::close(out[1]);
    fd_ = out[0];
  }
  ~Stream() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool read_until(const std::string& piece) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (text.find(piece) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
      char buf[4096];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      text.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  std::string text;

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

std::string request(const std::string& method, const std::string& target,
                    const std::string& body = "") {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST" || method == "PUT")
    r +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

// A WebSocket upgrade (exec, logs -f, watch, and upload and download, which
// are execs of tar in the sandbox).
std::string upgrade(const std::string& target) {
  return "GET " + target +
         " HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
         "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
}

class Authz : public GatewayTest {
 protected:
  Authz() : GatewayTest("authz", /*check_sandbox_files=*/true) {}

  static void SetUpTestSuite() {
    if (::geteuid() != 0) return;
    if (!::getgrnam(kGroup)) {
      made_group_ = shell(std::string("groupadd ") + kGroup + " >/dev/null 2>&1") == 0;
    }
    for (const char* name : {kAlice, kBob, kCarol}) {
      if (::getpwnam(name)) continue;
      std::string cmd = "useradd -M -s /usr/sbin/nologin ";
      if (std::string(name) != kCarol) cmd += std::string("-G ") + kGroup + " ";
      if (shell(cmd + name + " >/dev/null 2>&1") == 0) made_users_.push_back(name);
    }
  }
  static void TearDownTestSuite() {
    for (const auto& name : made_users_) shell("userdel " + name + " >/dev/null 2>&1");
    made_users_.clear();
    if (made_group_) shell(std::string("groupdel ") + kGroup + " >/dev/null 2>&1");
    made_group_ = false;
  }

  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    if (mode() != Mode::kRoot)
      GTEST_SKIP() << "a gateway shared by a group's users is a root gateway";
    ASSERT_TRUE(lookup(kAlice, &alice_) && lookup(kBob, &bob_) && lookup(kCarol, &carol_))
        << "the test users could not be made";
    lookup("root", &root_);
    socket_ = home_ + "/run/gateway.sock";
    // The users reach the socket through the home (the system gateway's
    // /run/openshell is the gateway's own business).
    ASSERT_EQ(::chmod(home_.c_str(), 0711), 0);
  }

  void TearDown() override {
    // Whatever a failed assertion left: the users' sandboxes too (the
    // harness deletes only root's own).
    if (!socket_.empty() && ::access(socket_.c_str(), F_OK) == 0) {
      Reply all = call(root_, "GET", "/v1/sandboxes?all=1");
      json list = all.json_body();
      if (list.is_object())
        for (const auto& s : list.value("sandboxes", json::array()))
          call(root_, "DELETE", "/v1/sandboxes/" + s.value("name", ""));
    }
    GatewayTest::TearDown();
  }

  // The gateway, started by the command line with [api] socket_group in
  // its gateway.toml.
  void start_shared_gateway() {
    write_file(home_ + "/gateway.toml", std::string("[api]\nsocket_group = \"") + kGroup + "\"\n",
               0600);
    Result r = os({"sandbox", "list"});
    ASSERT_EQ(r.status, 0) << r.err;
  }

  Reply call(const User& user, const std::string& method, const std::string& target,
             const std::string& body = "") {
    return exchange(user, socket_, request(method, target, body));
  }

  // A sandbox of the user's that idles on the test's busybox root.
  void create(const User& user, const std::string& name) {
    json body = {{"name", name}, {"spec", {{"from", rootfs()}}}};
    Reply r = call(user, "POST", "/v1/sandboxes", body.dump());
    ASSERT_EQ(r.status, 201) << r.raw;
    ASSERT_EQ(r.json_body().value("phase", ""), "Ready") << r.raw;
    ASSERT_EQ(r.json_body().value("owner", ""), user.name) << r.raw;
  }

  // The answer to an upgrade that is refused: the connection stays open
  // after it (a refused upgrade is a plain exchange, kept alive).
  Reply upgrade_reply(const User& user, const std::string& target) {
    Stream stream(user, socket_, upgrade(target));
    Reply reply;
    EXPECT_TRUE(stream.read_until("}}\n")) << stream.text;
    reply.raw = stream.text;
    if (reply.raw.rfind("HTTP/1.1 ", 0) == 0 && reply.raw.size() >= 12)
      reply.status = std::atoi(reply.raw.substr(9, 3).c_str());
    size_t at = reply.raw.find("\r\n\r\n");
    if (at != std::string::npos) reply.body = reply.raw.substr(at + 4);
    return reply;
  }

  // The command line as the user, on this gateway's socket
  // (--gateway-endpoint unix://…): its exit status and what it printed.
  Result cli(const User& user, const std::string& args) {
    std::string groups;
    for (gid_t g : user.groups) groups += (groups.empty() ? "" : ",") + std::to_string(g);
    const std::string command =
        "setpriv --reuid=" + std::to_string(user.uid) + " --regid=" + std::to_string(user.gid) +
        " --groups=" + groups + " env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=" + scratch() +
        " XDG_CONFIG_HOME=" + home_ + "/config-" + user.name + " " + binary() +
        " --gateway-endpoint unix://" + socket_ + " " + args + " 2>&1";
    Result r;
    FILE* out = ::popen(command.c_str(), "r");
    if (!out) return r;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, out)) > 0;) r.out.append(buf, n);
    int status = ::pclose(out);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
  }

  std::vector<std::string> names(const Reply& list) {
    std::vector<std::string> out;
    json j = list.json_body();
    if (j.is_object())
      for (const auto& s : j.value("sandboxes", json::array())) out.push_back(s.value("name", ""));
    return out;
  }

  User alice_, bob_, carol_, root_;
  std::string socket_;
  static inline bool made_group_ = false;
  static inline std::vector<std::string> made_users_;
};
E2E_ALL_MODES(Authz);

void expect_refused(const Reply& r, const std::string& code) {
  SCOPED_TRACE(r.raw + (r.connect_errno ? std::string("connect: ") + std::strerror(r.connect_errno)
                                        : std::string()));
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.code(), code);
  EXPECT_NE(r.message(), "");
}

TEST_P(Authz, TwoUsersEachSeeAndTouchOnlyTheirOwnSandboxes) {
  start_shared_gateway();
  // The socket and its directory: the group's, and nobody else's.
  struct stat st;
  ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, ::getgrnam(kGroup)->gr_gid);
  ASSERT_EQ(::stat((home_ + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0710u);

  Reply who = call(alice_, "GET", "/v1/whoami");
  ASSERT_EQ(who.status, 200) << who.raw;
  EXPECT_EQ(who.json_body(),
            json({{"principal", kAlice}, {"admin", false}, {"transport", "unix"}}));

  create(alice_, "alice-box");
  create(bob_, "bob-box");
  EXPECT_THAT(names(call(alice_, "GET", "/v1/sandboxes")), testing::ElementsAre("alice-box"));
  EXPECT_THAT(names(call(bob_, "GET", "/v1/sandboxes")), testing::ElementsAre("bob-box"));
  // The gateway's count is of what the caller may see.
  EXPECT_EQ(call(alice_, "GET", "/v1/gateway").json_body().value("sandboxes", -1), 1);
  EXPECT_EQ(call(root_, "GET", "/v1/gateway").json_body().value("sandboxes", -1), 2);

  // Everything alice might do to bob's sandbox is refused, before it is done.
  const std::string bob_box = "/v1/sandboxes/bob-box";
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", bob_box},
           {"GET", bob_box + "/logs"},
           {"GET", bob_box + "/events"},
           {"GET", bob_box + "/wait"},
           {"GET", bob_box + "/policy"},
           {"GET", bob_box + "/policies"},
           {"POST", bob_box + "/stop"},
           {"POST", bob_box + "/start"},
           {"DELETE", bob_box},
           {"POST", bob_box + "/commit"},
       }) {
    SCOPED_TRACE(method + " " + path);
    Reply r = call(alice_, method, path);
    expect_refused(r, "not_owner");
    EXPECT_THAT(r.message(), HasSubstr("bob-box"));
  }
  expect_refused(call(alice_, "PUT", bob_box + "/policy", R"({"policy":"version = 1\n"})"),
                 "not_owner");
  // exec (and upload and download: tar run through exec), and logs -f.
  expect_refused(upgrade_reply(alice_, bob_box + "/exec"), "not_owner");
  expect_refused(upgrade_reply(alice_, bob_box + "/logs"), "not_owner");
  // Named in a batch delete, it is refused for that name alone (the other
  // name has its own answer beside it), and recorded as the single DELETE is.
  Reply batch = call(alice_, "POST", "/v1/sandboxes:batchDelete",
                     json({{"names", {"bob-box", "no-such-box"}}}).dump());
  ASSERT_EQ(batch.status, 200) << batch.raw;
  json answer = batch.json_body();
  EXPECT_EQ(answer.value("deleted", json()), json::array()) << batch.raw;
  ASSERT_EQ(answer.value("errors", json()).size(), 2u) << batch.raw;
  EXPECT_EQ(answer["errors"][0].value("name", ""), "bob-box");
  EXPECT_EQ(answer["errors"][0].value("status", 0), 403);
  EXPECT_EQ(answer["errors"][0].value("code", ""), "not_owner");
  EXPECT_EQ(answer["errors"][1].value("name", ""), "no-such-box");
  EXPECT_EQ(answer["errors"][1].value("code", ""), "not_found");
  // Nothing of it happened: bob's sandbox runs on, on its first policy.
  Reply bobs = call(bob_, "GET", bob_box);
  ASSERT_EQ(bobs.status, 200) << bobs.raw;
  EXPECT_EQ(bobs.json_body().value("phase", ""), "Ready");
  Reply revisions = call(bob_, "GET", bob_box + "/policies");
  EXPECT_EQ(revisions.json_body().value("revisions", json::array()).size(), 1u) << revisions.raw;
  // Her own she may touch: the same calls succeed.
  EXPECT_EQ(call(alice_, "GET", "/v1/sandboxes/alice-box/events").status, 200);
  EXPECT_EQ(call(alice_, "GET", "/v1/sandboxes/alice-box/logs").status, 200);

  // Admins' views are admins'.
  expect_refused(call(alice_, "GET", "/v1/sandboxes?all=1"), "admin_only");
  expect_refused(call(alice_, "POST", "/v1/gateway/stop"), "admin_only");
  // Names are global: a taken one says only that it is taken, not whose.
  Reply taken = call(bob_, "POST", "/v1/sandboxes",
                     json({{"name", "alice-box"}, {"spec", {{"from", rootfs()}}}}).dump());
  EXPECT_EQ(taken.status, 409) << taken.raw;
  EXPECT_EQ(taken.code(), "name_taken");
  EXPECT_THAT(taken.message(), Not(HasSubstr(kAlice)));

  // Root, an admin, sees every sandbox with its owner, and may touch them.
  Result all = os({"sandbox", "list", "--all"});
  ASSERT_EQ(all.status, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("OWNER"));
  EXPECT_THAT(all.out, testing::ContainsRegex("alice-box +" + std::string(kAlice)));
  EXPECT_THAT(all.out, testing::ContainsRegex("bob-box +" + std::string(kBob)));
  Result own = os({"sandbox", "list", "--names"});
  EXPECT_EQ(own.out, "") << "root's own list holds only root's sandboxes";
  EXPECT_EQ(call(root_, "GET", bob_box).status, 200);

  // Every refusal is recorded: who, what, and why.
  std::string audit = file_contents(home_ + "/audit.log");
  EXPECT_THAT(audit, HasSubstr("\"principal\":\"" + std::string(kAlice) + "\""));
  EXPECT_THAT(audit, HasSubstr("\"path\":\"/v1/sandboxes/bob-box/exec\""));
  EXPECT_THAT(audit, HasSubstr("\"path\":\"/v1/sandboxes:batchDelete\""));
  EXPECT_THAT(audit, HasSubstr("\"code\":\"not_owner\""));
  EXPECT_THAT(audit, HasSubstr("\"code\":\"admin_only\""));
  ASSERT_EQ(::stat((home_ + "/audit.log").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  EXPECT_EQ(call(alice_, "DELETE", "/v1/sandboxes/alice-box").status, 200);
  EXPECT_EQ(call(bob_, "DELETE", bob_box).status, 200);
}

// Providers are the gateway's to lend: a user sees their names and keys,
// and only an admin makes, changes, deletes or attaches one.
TEST_P(Authz, OnlyAdminsMakeOrAttachProviders) {
  start_shared_gateway();
  const std::string provider =
      json({{"name", "gh"}, {"type", "github"}, {"credentials", {{"GITHUB_TOKEN", "v-1"}}}}).dump();
  expect_refused(call(alice_, "POST", "/v1/providers", provider), "admin_only");
  Reply made = call(root_, "POST", "/v1/providers", provider);
  ASSERT_EQ(made.status, 201) << made.raw;
  Reply seen = call(alice_, "GET", "/v1/providers/gh");
  EXPECT_EQ(seen.status, 200) << seen.raw;
  EXPECT_EQ(seen.json_body().value("credentials", json()), json::array({"GITHUB_TOKEN"}));
  EXPECT_THAT(seen.raw, Not(HasSubstr("v-1")));
  expect_refused(call(alice_, "PATCH", "/v1/providers/gh",
                      json({{"credentials", {{"GITHUB_TOKEN", "v-2"}}}}).dump()),
                 "admin_only");
  create(alice_, "alice-box");
  expect_refused(
      call(alice_, "POST", "/v1/sandboxes/alice-box/providers", json({{"provider", "gh"}}).dump()),
      "admin_only");
  expect_refused(
      call(alice_, "POST", "/v1/sandboxes",
           json({{"name", "alice-two"}, {"spec", {{"from", rootfs()}}}, {"providers", {"gh"}}})
               .dump()),
      "admin_only");
  expect_refused(call(alice_, "DELETE", "/v1/providers/gh"), "admin_only");
  EXPECT_EQ(call(alice_, "DELETE", "/v1/sandboxes/alice-box").status, 200);
  EXPECT_EQ(call(root_, "DELETE", "/v1/providers/gh").status, 200);
}

// A port forward is its sandbox's: only its owner (or an admin) starts,
// stops or sees one; another user's attempts are refused and change nothing.
TEST_P(Authz, ForwardsAreTheirSandboxOwnersAlone) {
  start_shared_gateway();
  create(alice_, "alice-fwd");
  create(bob_, "bob-fwd");
  int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(probe);
  const int port = ntohs(addr.sin_port);
  const std::string body = json({{"port", port}}).dump();
  const std::string alices = "/v1/sandboxes/alice-fwd/forwards";
  Reply made = call(alice_, "POST", alices, body);
  ASSERT_EQ(made.status, 201) << made.raw;
  EXPECT_EQ(made.json_body().value("state", ""), "listening") << made.raw;
  // Bob may not add to, stop or read alice's.
  expect_refused(call(bob_, "POST", alices, body), "not_owner");
  expect_refused(call(bob_, "DELETE", alices + "/" + std::to_string(port)), "not_owner");
  expect_refused(call(bob_, "GET", alices), "not_owner");
  Reply bobs_view = call(bob_, "GET", "/v1/forwards");
  ASSERT_EQ(bobs_view.status, 200) << bobs_view.raw;
  EXPECT_EQ(bobs_view.json_body().value("forwards", json()), json::array()) << bobs_view.raw;
  expect_refused(call(bob_, "GET", "/v1/forwards?all=1"), "admin_only");
  Result bob_cli = cli(bob_, "forward stop " + std::to_string(port) + " alice-fwd");
  EXPECT_EQ(bob_cli.status, 125) << bob_cli.out;
  EXPECT_THAT(bob_cli.out, HasSubstr("is not " + std::string(kBob) + "'s"));
  // A BIND:PORT taken by alice's is refused to bob without naming her sandbox.
  Reply clash = call(bob_, "POST", "/v1/sandboxes/bob-fwd/forwards", body);
  EXPECT_EQ(clash.status, 409) << clash.raw;
  EXPECT_EQ(clash.code(), "forward_exists");
  EXPECT_THAT(clash.message(), Not(HasSubstr("alice-fwd")));
  // Alice's forward is as it was; she sees it, and so does root with all=1.
  Reply alices_view = call(alice_, "GET", "/v1/forwards");
  ASSERT_EQ(alices_view.json_body().value("forwards", json::array()).size(), 1u) << alices_view.raw;
  EXPECT_EQ(alices_view.json_body()["forwards"][0].value("state", ""), "listening");
  Reply roots = call(root_, "GET", "/v1/forwards?all=1");
  EXPECT_THAT(roots.body, HasSubstr("\"sandbox\":\"alice-fwd\""));
  EXPECT_EQ(call(alice_, "DELETE", alices + "/" + std::to_string(port)).status, 200);
  EXPECT_EQ(call(alice_, "DELETE", "/v1/sandboxes/alice-fwd").status, 200);
  EXPECT_EQ(call(bob_, "DELETE", "/v1/sandboxes/bob-fwd").status, 200);
}

// The same through the command line: each user's `openshell
// --gateway-endpoint unix://SOCKET` on the shared socket.
TEST_P(Authz, EachUsersCommandLineSeesAndTouchesOnlyTheirOwn) {
  start_shared_gateway();
  Result made = cli(alice_, "sandbox create --name alice-cli --from " + rootfs());
  ASSERT_EQ(made.status, 0) << made.out;
  made = cli(bob_, "sandbox create --name bob-cli --from " + rootfs());
  ASSERT_EQ(made.status, 0) << made.out;
  Result list = cli(alice_, "sandbox list --names");
  EXPECT_EQ(list.status, 0) << list.out;
  EXPECT_EQ(list.out, "alice-cli\n");
  Result ran = cli(alice_, "sandbox exec alice-cli -- echo mine");
  EXPECT_EQ(ran.status, 0) << ran.out;
  EXPECT_THAT(ran.out, HasSubstr("mine"));
  const std::string refusal =
      "sandbox 'bob-cli' is not " + std::string(kAlice) + "'s (only its owner or an admin";
  for (const std::string& args :
       {std::string("sandbox get bob-cli"), std::string("sandbox exec bob-cli -- echo theirs"),
        std::string("sandbox download bob-cli /sandbox /tmp"), std::string("logs bob-cli"),
        std::string("sandbox stop bob-cli"), std::string("sandbox delete bob-cli")}) {
    SCOPED_TRACE(args);
    Result r = cli(alice_, args);
    EXPECT_EQ(r.status, 125) << r.out;
    EXPECT_THAT(r.out, HasSubstr(refusal));
  }
  Result all = cli(alice_, "sandbox list --all");
  EXPECT_EQ(all.status, 125) << all.out;
  EXPECT_THAT(all.out, HasSubstr("are for admins, and " + std::string(kAlice) + " is not one"));
  EXPECT_EQ(cli(bob_, "sandbox get bob-cli").status, 0);
  EXPECT_EQ(cli(alice_, "sandbox delete alice-cli").status, 0);
  EXPECT_EQ(cli(bob_, "sandbox delete bob-cli").status, 0);
}

// Over mutual TLS the principal is the certificate's name: a certificate
// for osh-e2e-alice is alice, as on the socket; it gets no host paths (not
// an admin); the owner's admin certificate sees everyone's.
TEST_P(Authz, ACertificatesNameIsTheSamePrincipalAndGetsNoHostPaths) {
  Result certs = os({"gateway", "generate-certs"});
  ASSERT_EQ(certs.status, 0) << certs.out << certs.err;
  write_file(home_ + "/gateway.toml",
             std::string("[api]\nsocket_group = \"") + kGroup + "\"\nlisten = [\"127.0.0.1:0\"]\n",
             0600);
  ASSERT_EQ(os({"sandbox", "list"}).status, 0);
  json info = json::parse(os({"gateway", "status", "-o", "json"}).out, nullptr, false);
  std::string url;
  for (const auto& l : info.value("listeners", json::array()))
    if (l.value("kind", "") == "tls") url = "https://" + l.value("address", "");
  ASSERT_NE(url, "") << info.dump();
  create(alice_, "alice-tls");
  create(bob_, "bob-tls");
  // Root's command line with a client home holding one certificate's files.
  const std::string client = make_dir(Mode::kRoot, "authz-tls-client", 0700);
  auto over_tls = [&](const std::string& cert_dir, std::vector<std::string> args) {
    const std::string dir = client + "/tls";
    shell("rm -rf '" + dir + "' && mkdir -m 0700 '" + dir + "' && cp '" + cert_dir +
          "/client.crt' '" + cert_dir + "/client.key' '" + home_ + "/tls/ca.crt' '" + dir + "'");
    args.insert(args.begin(), {"--gateway-endpoint", url});
    Options o;
    o.env.push_back("OPENSHELL_HOME=" + client);
    return openshell(Mode::kRoot, args, o);
  };
  const std::string alice_certs = client + "/alice";
  Result issued = os({"gateway", "issue-client", "--name", kAlice, "--out", alice_certs});
  ASSERT_EQ(issued.status, 0) << issued.out << issued.err;

  Result list = over_tls(alice_certs, {"sandbox", "list", "--names"});
  EXPECT_EQ(list.status, 0) << list.err;
  EXPECT_EQ(list.out, "alice-tls\n");
  Result theirs = over_tls(alice_certs, {"sandbox", "get", "bob-tls"});
  EXPECT_EQ(theirs.status, 125);
  EXPECT_THAT(theirs.err, HasSubstr("sandbox 'bob-tls' is not " + std::string(kAlice) + "'s"));
  Result from_dir =
      over_tls(alice_certs, {"sandbox", "create", "--name", "tls-dir", "--from", rootfs()});
  EXPECT_EQ(from_dir.status, 125) << from_dir.out;
  EXPECT_THAT(from_dir.err, HasSubstr("a host path is given only to an admin over tls"));
  std::string audit = file_contents(home_ + "/audit.log");
  EXPECT_THAT(audit, HasSubstr("\"code\":\"host_path_not_allowed\""));
  EXPECT_THAT(audit, HasSubstr("\"transport\":\"tls\""));

  // The gateway owner's certificate (CN root, OU admin) sees all.
  Result all = over_tls(home_ + "/tls", {"sandbox", "list", "--all"});
  EXPECT_EQ(all.status, 0) << all.err;
  EXPECT_THAT(all.out, testing::ContainsRegex("alice-tls +" + std::string(kAlice)));
  EXPECT_THAT(all.out, testing::ContainsRegex("bob-tls +" + std::string(kBob)));
  EXPECT_EQ(call(alice_, "DELETE", "/v1/sandboxes/alice-tls").status, 200);
  EXPECT_EQ(call(bob_, "DELETE", "/v1/sandboxes/bob-tls").status, 200);
}

// watch: a stream of every change, but only of the caller's sandboxes.
TEST_P(Authz, WatchShowsOnlyTheCallersSandboxes) {
  start_shared_gateway();
  Stream watch(alice_, socket_, upgrade("/v1/watch"));
  // The gateway takes her as a watcher before it answers the upgrade.
  ASSERT_TRUE(watch.read_until("101 Switching Protocols")) << watch.text;
  // Bob's change comes first, hers second: once hers is in her stream, his
  // would be there before it.
  create(bob_, "bob-watched");
  create(alice_, "alice-watched");
  ASSERT_TRUE(watch.read_until("\"alice-watched\"")) << watch.text;
  EXPECT_THAT(watch.text, Not(HasSubstr("bob-watched")));
}

TEST_P(Authz, AUserOutsideTheGroupCannotConnect) {
  start_shared_gateway();
  Reply r = call(carol_, "GET", "/v1/whoami");
  EXPECT_EQ(r.status, 0) << r.raw;
  EXPECT_EQ(r.connect_errno, EACCES) << std::strerror(r.connect_errno);
  // The group's users can.
  EXPECT_EQ(call(alice_, "GET", "/v1/whoami").status, 200);
}

// `gateway run --socket-group`, the flag rather than the file.
TEST_P(Authz, GatewayRunSocketGroupOpensTheSocketToTheGroup) {
  Result run;
  std::thread gateway([&] {
    Options o;
    o.timeout_s = 300;
    run = os({"gateway", "run", "--socket-group", kGroup}, o);
  });
  Reply who;
  for (int i = 0; i < 300 && who.status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (::access(socket_.c_str(), F_OK) == 0) who = call(bob_, "GET", "/v1/whoami");
  }
  EXPECT_EQ(who.status, 200) << who.raw;
  EXPECT_EQ(who.json_body().value("principal", ""), kBob);
  Result stop = os({"gateway", "stop"});
  EXPECT_EQ(stop.status, 0) << stop.err;
  gateway.join();
  EXPECT_EQ(run.status, 0) << run.err;
  // A group that does not exist stops the gateway, saying so.
  Result bad = os({"gateway", "run", "--socket-group", "osh-e2e-no-such-group"});
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.err,
              HasSubstr("socket group osh-e2e-no-such-group: no such group in /etc/group"));
}

// Attacks: a user names host paths that only root may read, and the root
// gateway is asked to read them on the user's behalf.
TEST_P(Authz, HostPathsAreUsedWithTheCallersRightsNotTheGateways) {
  start_shared_gateway();
  const std::string secret = make_dir(Mode::kRoot, "authz-secret", 0700);
  write_file(secret + "/shadow", "root's secret\n", 0600);
  const std::string own = make_dir(Mode::kRoot, "authz-alice", 0700);
  ASSERT_EQ(::chown(own.c_str(), alice_.uid, alice_.gid), 0);

  auto create_with = [&](const std::string& name, const json& spec) {
    return call(alice_, "POST", "/v1/sandboxes", json({{"name", name}, {"spec", spec}}).dump());
  };
  // --bind of a directory she cannot read.
  Reply bind = create_with(
      "steal-bind", {{"from", rootfs()},
                     {"binds", {{{"source", secret}, {"target", "/mnt"}, {"read_only", true}}}}});
  expect_refused(bind, "host_path_denied");
  EXPECT_THAT(bind.message(), HasSubstr(secret));
  EXPECT_THAT(bind.message(), HasSubstr("Permission denied"));
  // --from a directory she cannot read.
  Reply from = create_with("steal-from", {{"from", secret}});
  expect_refused(from, "host_path_denied");
  // A symbolic link of hers that leads there.
  const std::string link = own + "/link";
  ASSERT_EQ(::symlink(secret.c_str(), link.c_str()), 0);
  Reply linked = create_with(
      "steal-link", {{"from", rootfs()},
                     {"binds", {{{"source", link}, {"target", "/mnt"}, {"read_only", true}}}}});
  expect_refused(linked, "host_path_denied");
  EXPECT_THAT(linked.message(), HasSubstr("no longer where it leads"));
  // A directory of bob's that she may read: bound, it would be bob's to
  // the sandbox (a bind's owner becomes the sandbox user).
  const std::string bobs = make_dir(Mode::kRoot, "authz-bob", 0755);
  ASSERT_EQ(::chown(bobs.c_str(), bob_.uid, bob_.gid), 0);
  write_file(bobs + "/private", "bob's\n", 0600);
  ASSERT_EQ(::chown((bobs + "/private").c_str(), bob_.uid, bob_.gid), 0);
  Reply others = create_with(
      "steal-others", {{"from", rootfs()},
                       {"binds", {{{"source", bobs}, {"target", "/mnt"}, {"read_only", true}}}}});
  expect_refused(others, "host_path_denied");
  EXPECT_THAT(others.message(), HasSubstr("belongs to uid " + std::to_string(bob_.uid)));
  // A root she may list, holding a file only root may read: as the
  // sandbox's root its files keep their owners.
  const std::string tree = make_dir(Mode::kRoot, "authz-tree", 0755);
  shell("cp -a '" + rootfs() + "/.' '" + tree + "'");
  write_file(tree + "/etc/shadow", "root:secret\n", 0600);
  Reply root_dir = create_with("steal-tree", {{"from", tree}});
  expect_refused(root_dir, "host_path_denied");
  EXPECT_THAT(root_dir.message(), HasSubstr("/…/shadow (Permission denied)"));
  // A directory she may write, bound read-write, is hers to give...
  const std::string work = own + "/work";
  ASSERT_EQ(::mkdir(work.c_str(), 0700), 0);
  ASSERT_EQ(::chown(work.c_str(), alice_.uid, alice_.gid), 0);
  Reply mine = create_with(
      "mine", {{"from", rootfs()},
               {"binds", {{{"source", work}, {"target", "/mnt"}, {"read_only", false}}}}});
  ASSERT_EQ(mine.status, 201) << mine.raw;
  // ...until she swaps it for a link to the secret: the next start is refused.
  Reply stopped = call(alice_, "POST", "/v1/sandboxes/mine/stop");
  ASSERT_EQ(stopped.status, 200) << stopped.raw;
  ASSERT_EQ(::rename(work.c_str(), (own + "/old").c_str()), 0);
  ASSERT_EQ(::symlink(secret.c_str(), work.c_str()), 0);
  expect_refused(call(alice_, "POST", "/v1/sandboxes/mine/start"), "host_path_denied");
  EXPECT_EQ(call(alice_, "GET", "/v1/sandboxes/mine").json_body().value("phase", ""), "Stopped");
  EXPECT_EQ(call(alice_, "DELETE", "/v1/sandboxes/mine").status, 200);
  // None of the refused sandboxes exists.
  EXPECT_THAT(names(call(root_, "GET", "/v1/sandboxes?all=1")), testing::IsEmpty());
}

// A gateway that is not root cannot take its callers' rights for host
// paths, so it does not open its socket to a group at all.
class AuthzRootless : public GatewayTest {
 protected:
  AuthzRootless() : GatewayTest("authz-rootless") {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    if (mode() == Mode::kRoot) GTEST_SKIP() << "root's gateway may open its socket to a group";
  }
};
E2E_ALL_MODES(AuthzRootless);

TEST_P(AuthzRootless, ARootlessGatewayRefusesASocketGroup) {
  Result run = os({"gateway", "run", "--socket-group", "users"});
  EXPECT_EQ(run.status, 125) << run.out << run.err;
  EXPECT_THAT(run.err, HasSubstr("socket group users: only a root gateway opens its socket to a "
                                 "group (this one runs as uid " +
                                 std::to_string(uid_of(mode())) + ")"));
  EXPECT_EQ(::access((home_ + "/run/gateway.sock").c_str(), F_OK), -1)
      << "the refused gateway left its socket";
}

}  // namespace
}  // namespace e2e
