// Providers: a sandbox given one holds KEY=openshell:resolve:env:KEY, never
// the value, which no process of the sandbox, no answer of the API and no
// file under OPENSHELL_HOME (database, launch file, logs) holds either.
// As root and rootless.
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

class ProviderCli : public GatewayTest {
 protected:
  ProviderCli() : GatewayTest("provhome", false) {}
};

std::string random_secret(const std::string& prefix) {
  std::random_device random;
  return prefix + std::to_string(random()) + std::to_string(random());
}

TEST_P(ProviderCli, CreateListGetUpdateDelete) {
  GatewayGuard gateway(mode(), home_);
  const std::string secret = random_secret("tok-");
  Options with_token;
  with_token.env.push_back("PROV_TOKEN=" + secret);
  Result create =
      os({"provider", "create", "--name", "gh", "--type", "github", "--credential", "PROV_TOKEN"},
         with_token);
  ASSERT_EQ(create.status, 0) << create.err;
  EXPECT_THAT(create.out, HasSubstr("api.github.com:443, github.com:443"));
  EXPECT_THAT(create.out, Not(HasSubstr(secret)));

  Result list = os({"provider", "list"});
  EXPECT_EQ(list.status, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("gh     github   PROV_TOKEN"));
  Result get = os({"provider", "get", "gh", "-o", "json"});
  EXPECT_EQ(get.status, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("\"PROV_TOKEN\""));
  EXPECT_THAT(get.out, Not(HasSubstr(secret)));

  const std::string rotated = random_secret("rot-");
  Result update = os({"provider", "update", "gh", "--credential", "PROV_TOKEN=" + rotated,
                      "--endpoint", "api.example.test:8443", "-o", "json"});
  EXPECT_EQ(update.status, 0) << update.err;
  EXPECT_THAT(update.out, HasSubstr("\"api.example.test:8443\""));
  EXPECT_THAT(update.out, Not(HasSubstr("github.com:443")));
  EXPECT_THAT(update.out, Not(HasSubstr(rotated)));

  Result gone = os({"provider", "delete", "gh"});
  EXPECT_EQ(gone.status, 0) << gone.err;
  Result missing = os({"provider", "get", "gh"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_EQ(missing.err, "openshell: no provider named 'gh'\n");
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{});
  EXPECT_EQ(files_holding(home_, rotated), std::vector<std::string>{});
}

TEST_P(ProviderCli, ErrorsNameWhatIsWrong) {
  GatewayGuard gateway(mode(), home_);
  auto err = [&](const std::vector<std::string>& args) {
    Result r = os(args);
    EXPECT_EQ(r.status, 125) << r.out;
    return r.err;
  };
  EXPECT_EQ(err({"provider", "create", "--name", "x", "--type", "gitlab", "--credential", "A=b"}),
            "openshell: unknown provider type 'gitlab' (one of generic, github, anthropic, "
            "openai)\n");
  EXPECT_EQ(err({"provider", "create", "--name", "x", "--type", "openai", "--credential",
                 "OSH_E2E_UNSET_VARIABLE"}),
            "openshell: --credential OSH_E2E_UNSET_VARIABLE: $OSH_E2E_UNSET_VARIABLE is not set "
            "(give KEY=VALUE, or export it first)\n");
  EXPECT_EQ(err({"provider", "create", "--name", "x", "--type", "generic", "--credential", "A=b"}),
            "openshell: a generic provider needs at least one endpoint (HOST:PORT)\n");
  EXPECT_EQ(err({"provider", "create", "--name", "x", "--type", "generic", "--credential", "A=b",
                 "--endpoint", "no-port"}),
            "openshell: endpoint 'no-port' is not HOST:PORT\n");
  EXPECT_EQ(
      err({"provider", "create", "--name", "x", "--type", "openai", "--credential", "1BAD=v"}),
      "openshell: credential key '1BAD' is not an environment variable's name (letters, "
      "digits and '_', not starting with a digit)\n");
  ASSERT_EQ(
      os({"provider", "create", "--name", "ai", "--type", "openai", "--credential", "K=v"}).status,
      0);
  EXPECT_EQ(err({"provider", "create", "--name", "ai", "--type", "openai", "--credential", "K=v"}),
            "openshell: provider 'ai' already exists\n");
  EXPECT_EQ(err({"sandbox", "create", "--name", "nope", "--from", rootfs(), "--provider", "none",
                 "-d", "--", "sleep", "60"}),
            "openshell: no provider named 'none'\n");
}

TEST_P(ProviderCli, TheSandboxHoldsOnlyThePlaceholder) {
  GatewayGuard gateway(mode(), home_);
  const std::string secret = random_secret("sk-");
  ASSERT_EQ(os({"provider", "create", "--name", "ai", "--type", "anthropic", "--credential",
                "ANTHROPIC_API_KEY=" + secret})
                .status,
            0);
  Result create = os({"sandbox", "create", "--name", "agent", "--from", rootfs(), "--provider",
                      "ai", "-d", "--", "sleep", "600"});
  ASSERT_EQ(create.status, 0) << create.err;
  Result env = os({"sandbox", "exec", "agent", "--", "env"});
  EXPECT_EQ(env.status, 0) << env.err;
  EXPECT_THAT(env.out, HasSubstr("ANTHROPIC_API_KEY=openshell:resolve:env:ANTHROPIC_API_KEY\n"));
  EXPECT_THAT(env.out, Not(HasSubstr(secret)));
  // Every process the sandbox can see: its main process and the exec's.
  Result environ = os({"sandbox", "exec", "agent", "--", "sh", "-c",
                       "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"});
  EXPECT_THAT(environ.out, HasSubstr("ANTHROPIC_API_KEY=openshell:resolve:env:"));
  EXPECT_THAT(environ.out, Not(HasSubstr(secret)));
  Result get = os({"sandbox", "get", "agent", "-o", "json"});
  EXPECT_EQ(get.status, 0) << get.err;
  EXPECT_THAT(get.out, Not(HasSubstr(secret)));
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{})
      << "gateway.db, the launch file and the logs hold no value";

  // Attached: the provider stays until it is detached.
  Result refused = os({"provider", "delete", "ai"});
  EXPECT_EQ(refused.status, 125);
  EXPECT_EQ(refused.err, "openshell: provider 'ai' is attached to agent (detach it first)\n");
  Result detach = os({"provider", "detach", "agent", "ai"});
  EXPECT_EQ(detach.status, 0) << detach.err;
  EXPECT_EQ(detach.out, "agent: provider ai detached\n");
  EXPECT_EQ(os({"provider", "delete", "ai"}).status, 0);
  EXPECT_EQ(os({"sandbox", "delete", "agent"}).status, 0);
}

// Attached to a running sandbox: its placeholder comes with its next start
// (its environment is fixed once it runs), and detached, it goes then.
TEST_P(ProviderCli, AttachAndDetachApplyAtTheNextStart) {
  GatewayGuard gateway(mode(), home_);
  const std::string secret = random_secret("gk-");
  ASSERT_EQ(os({"provider", "create", "--name", "svc", "--type", "generic", "--credential",
                "SVC_KEY=" + secret, "--endpoint", "api.example.test:443"})
                .status,
            0);
  ASSERT_EQ(os({"sandbox", "create", "--name", "late", "--from", rootfs(), "-e", "KEEP=1", "-d",
                "--", "sleep", "600"})
                .status,
            0);
  auto env = [&] { return os({"sandbox", "exec", "late", "--", "env"}).out; };
  Result attach = os({"provider", "attach", "late", "svc"});
  EXPECT_EQ(attach.status, 0) << attach.err;
  EXPECT_EQ(attach.out, "late: provider svc attached\n");
  EXPECT_THAT(env(), Not(HasSubstr("SVC_KEY=")));
  EXPECT_THAT(os({"provider", "get", "svc"}).out, HasSubstr("Sandboxes:    late\n"));
  ASSERT_EQ(os({"sandbox", "stop", "late"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "late"}).status, 0);
  std::string started = env();
  EXPECT_THAT(started, HasSubstr("SVC_KEY=openshell:resolve:env:SVC_KEY\n"));
  EXPECT_THAT(started, HasSubstr("KEEP=1\n"));
  EXPECT_THAT(started, Not(HasSubstr(secret)));

  ASSERT_EQ(os({"provider", "detach", "late", "svc"}).status, 0);
  Result again = os({"provider", "detach", "late", "svc"});
  EXPECT_EQ(again.status, 125);
  EXPECT_EQ(again.err, "openshell: provider 'svc' is not attached to sandbox 'late'\n");
  ASSERT_EQ(os({"sandbox", "stop", "late"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "late"}).status, 0);
  std::string detached = env();
  EXPECT_THAT(detached, Not(HasSubstr("SVC_KEY=")));
  EXPECT_THAT(detached, HasSubstr("KEEP=1\n"));
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{});
  EXPECT_EQ(os({"sandbox", "delete", "late"}).status, 0);
  EXPECT_EQ(os({"provider", "delete", "svc"}).status, 0);
}

E2E_ALL_MODES(ProviderCli);

}  // namespace
}  // namespace e2e
