#include "gateway/restart_policy.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "spec/sandbox_spec.h"

namespace openshell::gateway {
namespace {

SandboxRecord record(Phase phase, const std::string& intent = "", const std::string& reason = "") {
  SandboxRecord r;
  r.phase = phase;
  r.intent = intent;
  if (!reason.empty()) r.conditions.push_back(Condition{"Ready", "False", reason, "", 0});
  return r;
}

TEST(RestartPolicy, Names) {
  EXPECT_EQ(parse_restart_policy(""), RestartPolicy::kUnlessStopped);
  EXPECT_EQ(parse_restart_policy("unless-stopped"), RestartPolicy::kUnlessStopped);
  EXPECT_EQ(parse_restart_policy("on-failure"), RestartPolicy::kOnFailure);
  EXPECT_EQ(parse_restart_policy("no"), RestartPolicy::kNo);
  EXPECT_FALSE(parse_restart_policy("always"));
  EXPECT_EQ(restart_policy_name(RestartPolicy::kOnFailure), "on-failure");
  SandboxSpec spec;
  spec.restart = "always";
  try {
    spec.validate();
    ADD_FAILURE() << "accepted --restart always";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--restart always: must be no, on-failure or unless-stopped");
  }
  spec.restart = "on-failure";
  EXPECT_EQ(SandboxSpec::from_json(spec.to_json()).restart, "on-failure");
}

TEST(RestartPolicy, MeantToRunIsWhatRanAndNoUserStopped) {
  EXPECT_TRUE(meant_to_run(record(Phase::kReady)));
  EXPECT_TRUE(meant_to_run(record(Phase::kProvisioning)));
  EXPECT_TRUE(meant_to_run(record(Phase::kStarting, "launch")));
  EXPECT_TRUE(meant_to_run(record(Phase::kStopped, "", "SupervisorStopped")));
  EXPECT_FALSE(meant_to_run(record(Phase::kReady, "stop")));
  EXPECT_FALSE(meant_to_run(record(Phase::kStopping, "stop")));
  EXPECT_FALSE(meant_to_run(record(Phase::kStopped, "", "Stopped")));
  EXPECT_FALSE(meant_to_run(record(Phase::kError, "", "MainProcessFailed")));
  EXPECT_FALSE(meant_to_run(record(Phase::kCompleted)));
  EXPECT_FALSE(meant_to_run(record(Phase::kDeleting, "delete")));
}

TEST(RestartPolicy, WhatEachPolicyStartsAgain) {
  for (auto policy : {RestartPolicy::kUnlessStopped, RestartPolicy::kOnFailure}) {
    EXPECT_TRUE(restarts(policy, Phase::kError, "SupervisorLost"));
    EXPECT_TRUE(restarts(policy, Phase::kError, "MainProcessFailed"));
    EXPECT_FALSE(restarts(policy, Phase::kCompleted, "MainProcessCompleted"));
  }
  EXPECT_TRUE(restarts(RestartPolicy::kUnlessStopped, Phase::kStopped, "SupervisorStopped"));
  EXPECT_FALSE(restarts(RestartPolicy::kOnFailure, Phase::kStopped, "SupervisorStopped"));
  EXPECT_FALSE(restarts(RestartPolicy::kUnlessStopped, Phase::kStopped, "Stopped"));
  EXPECT_FALSE(restarts(RestartPolicy::kNo, Phase::kError, "SupervisorLost"));
}

}  // namespace
}  // namespace openshell::gateway
