// The gateway itself: its configuration file, how it and its supervisors
// show in ps, and what it starts again when it comes back and finds
// supervisors gone; as root and rootless.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

class Gateway : public GatewayTest {
 protected:
  Gateway() : GatewayTest("gw") {}
  // The pids of this home's gateway, or of the supervisor of a sandbox.
  std::vector<int> pids(const std::string& role, const std::string& sandbox = "") {
    std::vector<int> out;
    for (const auto& p : gateway_processes(home_)) {
      std::string pid = p.substr(0, p.find(':'));
      std::string cmdline = file_contents("/proc/" + pid + "/cmdline");
      std::string want = "openshell-" + role + '\0' + (sandbox.empty() ? "" : sandbox + '\0');
      if (cmdline.rfind(want, 0) == 0) out.push_back(std::stoi(pid));
    }
    return out;
  }
  // kill -9, and wait until it has ended (a zombie, or reaped).
  static void kill_and_wait(int pid) {
    ::kill(pid, SIGKILL);
    for (int i = 0; i < 1500; ++i) {
      std::string stat = file_contents("/proc/" + std::to_string(pid) + "/stat");
      auto paren = stat.rfind(')');
      if (paren == std::string::npos || stat.substr(paren + 2, 1) == "Z") return;
      ::usleep(20000);
    }
    ADD_FAILURE() << "pid " << pid << " outlived kill -9";
  }
  // kill -9 of the gateway, then of each named sandbox's supervisor: the
  // host went down under them (power lost, say).
  void kill_everything(const std::vector<std::string>& sandboxes) {
    for (int pid : pids("gateway")) kill_and_wait(pid);
    for (const auto& s : sandboxes) {
      std::vector<int> found = pids("supervisor", s);
      ASSERT_EQ(found.size(), 1u) << s;
      kill_and_wait(found[0]);
    }
  }
};
E2E_ALL_MODES(Gateway);

TEST_P(Gateway, ProcessesAreNamedForPsAndSs) {
  ASSERT_EQ(os({"sandbox", "create", "--name", "named", "--from", rootfs()}).status, 0);
  std::vector<int> gateway = pids("gateway");
  ASSERT_EQ(gateway.size(), 1u);
  std::string g = std::to_string(gateway[0]);
  EXPECT_EQ(file_contents("/proc/" + g + "/comm"), "osh-gateway\n");
  EXPECT_EQ(command_of(g), "openshell-gateway --ready-fd 3 ");
  std::vector<int> supervisor = pids("supervisor", "named");
  ASSERT_EQ(supervisor.size(), 1u);
  std::string s = std::to_string(supervisor[0]);
  EXPECT_EQ(file_contents("/proc/" + s + "/comm"), "osh-supervisor\n");
  EXPECT_THAT(command_of(s), StartsWith("openshell-supervisor named --launch "));
  std::string args = file_contents("/proc/" + s + "/cmdline");
  EXPECT_EQ(args.substr(0, args.find('\0')), "openshell-supervisor");
  // Its sandbox's PID 1 is the init's own small program (runtime/
  // init_image.h), from the one image the gateway hands every supervisor.
  std::string init = file_contents("/proc/" + s + "/task/" + s + "/children");
  ASSERT_FALSE(init.empty());
  init = init.substr(0, init.find(' '));
  EXPECT_EQ(file_contents("/proc/" + init + "/comm"), "osh-init\n");
  EXPECT_THAT(command_of(init), StartsWith("openshell-init __init "));
  struct stat exe {};
  ASSERT_EQ(::stat(("/proc/" + init + "/exe").c_str(), &exe), 0);
  EXPECT_LT(exe.st_size, 4 << 20) << "the init runs the whole binary";
  // The supervisor still works under its name: exec, stop, start.
  EXPECT_EQ(os({"sandbox", "exec", "named", "--", "true"}).status, 0);
  EXPECT_EQ(os({"sandbox", "stop", "named"}).status, 0);
  EXPECT_EQ(os({"sandbox", "start", "named"}).status, 0);
  EXPECT_EQ(pids("supervisor", "named").size(), 1u);
}

TEST_P(Gateway, SettingsFromTheFileTakeEffect) {
  TestDnsServer dns;
  TestServer server;
  const std::string port = std::to_string(server.port());
  // The name resolves only through the file's DNS server (which answers
  // 127.0.0.1 for every name): the host's own resolver knows nothing of it.
  write_file(home_ + "/gateway.toml",
             "[dns]\nservers = [\"127.0.0.1:" + std::to_string(dns.port()) +
                 "\"]\n\n[storage]\nmode = \"copy\"\n[api]\nmax_connections_per_uid = 64\n");
  std::string policy = write_file(
      scratch() + "/gw-policy-" + mode_name(mode()) + ".toml",
      "version = 1\n[network_policies.local]\nendpoints = [ { host = \"fromfile.test.openshell\", "
      "port = " +
          port + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  Result r = os({"sandbox", "create", "--name", "dns", "--from", rootfs(), "--policy", policy, "--",
                 "wget", "-q", "-O-", "http://fromfile.test.openshell:" + port + "/"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "hello from the test server\n") << r.err;
  EXPECT_GT(dns.queries(), 0);
  // storage.mode = "copy": the root is a copy, and the sandbox says why.
  Result get = os({"sandbox", "get", "dns", "-o", "json"});
  EXPECT_THAT(get.out, HasSubstr("\"storage\": \"copy\""));
  EXPECT_THAT(get.out, HasSubstr("storage.mode = \\\"copy\\\" in " + home_ + "/gateway.toml"));
  // gateway status: each setting and where it came from.
  Result status = os({"gateway", "status"});
  EXPECT_EQ(status.status, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("config: " + home_ + "/gateway.toml (present)"));
  EXPECT_THAT(status.out, testing::ContainsRegex(
                              "dns.servers +127.0.0.1:" + std::to_string(dns.port()) + " +file\n"));
  EXPECT_THAT(status.out, testing::ContainsRegex("dns.hosts_file +/etc/hosts +default\n"));
  EXPECT_THAT(status.out, testing::ContainsRegex("storage.mode +copy +file\n"));
  EXPECT_THAT(status.out, testing::ContainsRegex("api.max_connections_per_uid +64 +file\n"));
  // The environment wins over the file, and says so.
  ASSERT_EQ(os({"gateway", "stop"}).status, 0);
  Options env;
  env.env.push_back("OPENSHELL_STORAGE=overlay");
  Result json = os({"gateway", "status", "-o", "json"}, env);  // not running: nothing
  EXPECT_NE(json.status, 0);
  ASSERT_EQ(os({"sandbox", "list"}, env).status, 0);  // starts it with that environment
  json = os({"gateway", "status", "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"storage.mode\": {\n        \"env\": \"OPENSHELL_STORAGE\",\n"
                                  "        \"source\": \"environment\",\n"
                                  "        \"value\": \"overlay\""))
      << json.out;
}

TEST_P(Gateway, ABadFileStopsTheGatewayWithItsLine) {
  write_file(home_ + "/gateway.toml", "[dns]\nservers = [\"192.0.2.1\"]\nserver = 1\n");
  Options o;
  o.timeout_s = 20;
  Result r = os({"sandbox", "list"}, o);
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: the gateway did not start: " + home_ +
                       "/gateway.toml:3: dns.server: unknown key (known: servers, hosts_file, "
                       "resolv_conf, query_rate, query_burst) (see " +
                       home_ + "/gateway.log)\n");
  EXPECT_NE(os({"gateway", "status"}).status, 0);
  EXPECT_EQ(pids("gateway"), std::vector<int>{});
  write_file(home_ + "/gateway.toml", "[storage]\nmode = \"zfs\"\n");
  r = os({"sandbox", "list"}, o);
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr(home_ + "/gateway.toml:2: storage.mode: not one of auto, overlay, "
                                       "copy"));
  // Fixed, it starts; broken again while it runs, the status says so and
  // what needs the file fails with the same line.
  write_file(home_ + "/gateway.toml", "[storage]\nmode = \"overlay\"\n");
  ASSERT_EQ(os({"sandbox", "list"}).status, 0);
  write_file(home_ + "/gateway.toml", "[storage]\nmode = 1\n");
  Result status = os({"gateway", "status"});
  EXPECT_THAT(status.out,
              HasSubstr("config error: " + home_ +
                        "/gateway.toml:2: storage.mode: not one of auto, overlay, copy"));
  Result create = os({"sandbox", "create", "--name", "x", "--from", rootfs()});
  EXPECT_EQ(create.status, 125);
  EXPECT_EQ(create.err, "openshell: " + home_ +
                            "/gateway.toml:2: storage.mode: not one of auto, overlay, copy\n");
}

TEST_P(Gateway, SandboxesMeantToRunStartAgainAfterTheHostComesBack) {
  for (const auto& [name, policy] : std::vector<std::pair<std::string, std::string>>{
           {"keep", ""}, {"failing", "on-failure"}, {"never", "no"}}) {
    std::vector<std::string> args = {"sandbox", "create", "--name", name, "--from", rootfs()};
    if (!policy.empty()) args.insert(args.end(), {"--restart", policy});
    ASSERT_EQ(os(args).status, 0) << name;
  }
  ASSERT_EQ(os({"sandbox", "exec", "keep", "--", "sh", "-c", "echo kept > /sandbox/f"}).status, 0);
  // One stopped by its user stays stopped.
  ASSERT_EQ(os({"sandbox", "create", "--name", "stopped", "--from", rootfs()}).status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "stopped"}).status, 0);
  kill_everything({"keep", "failing", "never"});
  // The next command starts a gateway, which starts them again.
  EXPECT_TRUE(wait_phase("keep", "Ready"));
  EXPECT_EQ(field("keep", "generation"), "2");
  EXPECT_EQ(field("keep", "restart"), "unless-stopped");
  EXPECT_EQ(os({"sandbox", "exec", "keep", "--", "cat", "/sandbox/f"}).out, "kept\n");
  Result events = os({"sandbox", "get", "keep"});
  EXPECT_THAT(events.out, HasSubstr("Restart  restart policy unless-stopped: generation 1 ended "
                                    "Error (SupervisorLost) while the gateway was away"));
  EXPECT_TRUE(wait_phase("failing", "Ready"));
  EXPECT_EQ(field("failing", "generation"), "2");
  // --restart no: as it was found.
  EXPECT_EQ(phase("never"), "Error");
  EXPECT_EQ(field("never", "generation"), "1");
  EXPECT_THAT(os({"sandbox", "get", "never", "-o", "json"}).out, HasSubstr("SupervisorLost"));
  EXPECT_EQ(phase("stopped"), "Stopped");
  EXPECT_EQ(field("stopped", "generation"), "1");
}

// A supervisor's pid is committed without waiting for the disk: a gateway
// killed right after its creates must still find every supervisor, not
// launch them again.
TEST_P(Gateway, AKilledGatewayFindsEverySupervisorAgain) {
  std::vector<std::string> names = {"fresh1", "fresh2", "fresh3"};
  std::vector<int> supervisors;
  for (const auto& name : names) {
    ASSERT_EQ(os({"sandbox", "create", "--name", name, "--from", rootfs()}).status, 0) << name;
    std::vector<int> s = pids("supervisor", name);
    ASSERT_EQ(s.size(), 1u) << name;
    supervisors.push_back(s[0]);
  }
  for (int pid : pids("gateway")) kill_and_wait(pid);
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(wait_phase(names[i], "Ready")) << names[i];
    EXPECT_EQ(field(names[i], "generation"), "1") << names[i] << " was launched again";
    EXPECT_EQ(pids("supervisor", names[i]), std::vector<int>{supervisors[i]}) << names[i];
    EXPECT_EQ(os({"sandbox", "exec", names[i], "--", "true"}).status, 0) << names[i];
  }
}

TEST_P(Gateway, AStopByTheHostIsNoStopByTheUser) {
  ASSERT_EQ(os({"sandbox", "create", "--name", "host", "--from", rootfs()}).status, 0);
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "onfail", "--from", rootfs(), "--restart", "on-failure"})
          .status,
      0);
  // The host shutting down: SIGTERM to the supervisors, not through the gateway.
  for (const char* name : {"host", "onfail"}) {
    std::vector<int> s = pids("supervisor", name);
    ASSERT_EQ(s.size(), 1u);
    ::kill(s[0], SIGTERM);
  }
  EXPECT_TRUE(wait_phase("host", "Stopped"));
  EXPECT_TRUE(wait_phase("onfail", "Stopped"));
  EXPECT_THAT(os({"sandbox", "get", "host", "-o", "json"}).out, HasSubstr("SupervisorStopped"));
  // The gateway comes back: unless-stopped starts it again; on-failure
  // does not (a stop is no failure).
  for (int pid : pids("gateway")) kill_and_wait(pid);
  EXPECT_TRUE(wait_phase("host", "Ready"));
  EXPECT_EQ(field("host", "generation"), "2");
  EXPECT_EQ(phase("onfail"), "Stopped");
  EXPECT_EQ(field("onfail", "generation"), "1");
}

TEST_P(Gateway, StartAllStartsEveryFinishedSandbox) {
  for (const char* name : {"one", "two", "three"})
    ASSERT_EQ(os({"sandbox", "create", "--name", name, "--from", rootfs()}).status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "one"}).status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "two"}).status, 0);
  Result r = os({"sandbox", "start", "--all"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "one: Ready\ntwo: Ready\n");  // three was running
  EXPECT_EQ(phase("three"), "Ready");
  ASSERT_EQ(os({"sandbox", "stop", "three"}).status, 0);
  Result j = os({"sandbox", "start", "--all", "-o", "json"});
  EXPECT_EQ(j.status, 0) << j.err;
  EXPECT_THAT(j.out, StartsWith("[\n"));
  EXPECT_THAT(j.out, HasSubstr("\"name\": \"three\""));
  EXPECT_THAT(j.out, Not(HasSubstr("\"name\": \"one\"")));
  EXPECT_EQ(field("three", "generation"), "2");
  // Nothing to start: nothing printed, success.
  Result none = os({"sandbox", "start", "--all"});
  EXPECT_EQ(none.status, 0);
  EXPECT_EQ(none.out, "");
  Result both = os({"sandbox", "start", "--all", "one"});
  EXPECT_EQ(both.status, 125);
  EXPECT_EQ(both.err, "openshell: sandbox start: give a name or --all (not both)\n");
  Result bad = os({"sandbox", "create", "--name", "b", "--from", rootfs(), "--restart", "always"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr("--restart"));
}

}  // namespace
}  // namespace e2e
