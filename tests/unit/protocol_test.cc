// The messages between the roles (src/protocol): each one's text is what
// docs/api.md shows, it comes back from its text as it was, and a missing,
// mistyped or unknown field is refused with one line that names it.
#include <string>
#include <string_view>
#include <variant>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/text.h"
#include "protocol/exec_handoff.h"
#include "protocol/exec_stream.h"
#include "protocol/supervisor_session.h"

namespace openshell::protocol {
namespace {

using nlohmann::json;

// The message's text is `wire` (as JSON, key order aside), and decoding it
// gives the message back.
template <class Variant, class Message>
void expect_wire(const Message& message, std::string_view wire,
                 Variant (*decode_text)(std::string_view)) {
  std::string text = encode(message);
  EXPECT_EQ(json::parse(text), json::parse(wire)) << text;
  Variant back = decode_text(text);
  ASSERT_TRUE(std::holds_alternative<Message>(back)) << text;
  EXPECT_EQ(json(std::get<Message>(back)), json(message)) << text;
}

template <class Variant>
std::string error_of(Variant (*decode_text)(std::string_view), std::string_view text) {
  try {
    decode_text(text);
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ExecStreamMessages, EachRoundTripsAsDocumented) {
  exec::Start start;
  start.argv = {"sh", "-c", "ls -l"};
  start.env = {"FOO=bar"};
  start.workdir = "/sandbox";
  expect_wire(start,
              R"({"type":"start","argv":["sh","-c","ls -l"],"env":["FOO=bar"],
                  "workdir":"/sandbox","tty":false,"rows":24,"cols":80})",
              exec::decode_client);
  exec::Start tty;
  tty.argv = {"sh"};
  tty.tty = true;
  tty.rows = 50;
  tty.cols = 132;
  expect_wire(tty, R"({"type":"start","argv":["sh"],"env":[],"tty":true,"rows":50,"cols":132})",
              exec::decode_client);
  exec::Start as_root;
  as_root.argv = {"id"};
  as_root.user = "0:0";
  expect_wire(as_root,
              R"({"type":"start","argv":["id"],"env":[],"user":"0:0","tty":false,"rows":24,
                  "cols":80})",
              exec::decode_client);
  expect_wire(exec::Eof{}, R"({"type":"eof"})", exec::decode_client);
  expect_wire(exec::Resize{50, 132}, R"({"type":"resize","rows":50,"cols":132})",
              exec::decode_client);
  expect_wire(exec::Signal{15}, R"({"type":"signal","signal":15})", exec::decode_client);
  expect_wire(exec::Started{}, R"({"type":"started"})", exec::decode_server);
  expect_wire(exec::Exit{4}, R"({"type":"exit","code":4})", exec::decode_server);
  expect_wire(exec::Failure{127, "exec: No such file or directory"},
              R"({"type":"error","code":127,"message":"exec: No such file or directory"})",
              exec::decode_server);
}

TEST(ExecStreamMessages, StartTakesTheDocumentedDefaults) {
  auto message = exec::decode_client(R"({"type":"start","argv":["true"]})");
  ASSERT_TRUE(std::holds_alternative<exec::Start>(message));
  const auto& start = std::get<exec::Start>(message);
  EXPECT_EQ(start.argv, std::vector<std::string>{"true"});
  EXPECT_TRUE(start.env.empty());
  EXPECT_FALSE(start.workdir.has_value());
  EXPECT_FALSE(start.user.has_value());
  EXPECT_FALSE(start.tty);
  EXPECT_EQ(start.rows, 24);
  EXPECT_EQ(start.cols, 80);
}

TEST(ExecStreamMessages, AWrongMessageIsOneLineNamingTheField) {
  struct Case {
    std::string_view text, error;
  } client[] = {
      {R"({"type":"start"})", R"(exec stream: "start" message: missing field "argv")"},
      {R"({"type":"start","argv":[]})", R"(exec stream: "start" message: field "argv" is empty)"},
      {R"({"type":"start","argv":["sh"],"tyy":true})",
       R"(exec stream: "start" message: unknown field "tyy")"},
      {R"({"type":"start","argv":"sh"})",
       R"(exec stream: "start" message: field "argv" must be a list of strings)"},
      {R"({"type":"start","argv":["sh"],"rows":70000})",
       R"(exec stream: "start" message: field "rows" must be an integer from 0 to 65535)"},
      {R"({"type":"start","argv":["sh"],"tty":1})",
       R"(exec stream: "start" message: field "tty" must be true or false)"},
      {R"({"type":"resize","rows":50})", R"(exec stream: "resize" message: missing field "cols")"},
      {R"({"type":"signal"})", R"(exec stream: "signal" message: missing field "signal")"},
      {R"({"type":"signal","signal":0})",
       R"(exec stream: "signal" message: field "signal" must be from 1 to 64)"},
      {R"({"type":"eof","now":true})", R"(exec stream: "eof" message: unknown field "now")"},
      {R"({"type":"exit","code":0})", R"(exec stream: unknown message type "exit")"},
      {R"({"argv":["sh"]})", R"(exec stream: a message has no "type" string)"},
      {R"(["start"])", "exec stream: a message is not a JSON object"},
      {"not json", "exec stream: a message is not a JSON object"},
  };
  for (const auto& c : client) EXPECT_EQ(error_of(exec::decode_client, c.text), c.error) << c.text;
  Case server[] = {
      {R"({"type":"exit"})", R"(exec stream: "exit" message: missing field "code")"},
      {R"({"type":"exit","code":"4"})",
       R"(exec stream: "exit" message: field "code" must be an integer from -2147483648 to 2147483647)"},
      {R"({"type":"error","code":125})",
       R"(exec stream: "error" message: missing field "message")"},
      {R"({"type":"error","message":"x"})",
       R"(exec stream: "error" message: missing field "code")"},
      {R"({"type":"started","pid":3})", R"(exec stream: "started" message: unknown field "pid")"},
  };
  for (const auto& c : server) EXPECT_EQ(error_of(exec::decode_server, c.text), c.error) << c.text;
}

TEST(SupervisorSessionMessages, EachRoundTripsAsDocumented) {
  namespace s = session;
  expect_wire(s::Hello{"LAUNCH", 1234}, R"({"type":"hello","launch":"LAUNCH","pid":1234})",
              s::decode_to_gateway);
  s::Status running;
  running.generation = 2;
  running.state = "running";
  running.init_pid = 5678;
  expect_wire(running, R"({"type":"status","generation":2,"state":"running","init_pid":5678})",
              s::decode_to_gateway);
  EXPECT_TRUE(running.running() && running.ready());
  // A micro-VM whose guest has not said `ready`: alive, not ready.
  s::Status starting = running;
  starting.state = "starting";
  expect_wire(starting, R"({"type":"status","generation":2,"state":"starting","init_pid":5678})",
              s::decode_to_gateway);
  EXPECT_TRUE(starting.running());
  EXPECT_FALSE(starting.ready());
  s::Status exited;
  exited.generation = 2;
  exited.state = "exited";
  exited.exit_code = 3;
  exited.reason = "MainProcessFailed";
  exited.message = "the main process exited with status 3";
  expect_wire(exited,
              R"({"type":"status","generation":2,"state":"exited","exit_code":3,
                  "reason":"MainProcessFailed","message":"the main process exited with status 3"})",
              s::decode_to_gateway);
  expect_wire(s::PolicyApplied{3, std::nullopt}, R"({"type":"policy_applied","revision":3})",
              s::decode_to_gateway);
  expect_wire(s::PolicyApplied{3, "bad rule"},
              R"({"type":"policy_applied","revision":3,"error":"bad rule"})", s::decode_to_gateway);
  expect_wire(s::Welcome{{"A=1", "B=2"}, {}, {}}, R"({"type":"welcome","env":["A=1","B=2"]})",
              s::decode_to_supervisor);
  expect_wire(
      s::Superseded{"launch generation 1 is superseded by generation 2"},
      R"({"type":"superseded","message":"launch generation 1 is superseded by generation 2"})",
      s::decode_to_supervisor);
  expect_wire(s::Rejected{"no such sandbox"}, R"({"type":"rejected","message":"no such sandbox"})",
              s::decode_to_supervisor);
  expect_wire(s::Stop{10000}, R"({"type":"stop","grace_ms":10000})", s::decode_to_supervisor);
  expect_wire(s::Policy{3, "version = 1\n"},
              R"({"type":"policy","revision":3,"text":"version = 1\n"})", s::decode_to_supervisor);
  const s::Credential gh{"GITHUB_TOKEN", "ghp_x", {"api.github.com:443", "github.com:443"}};
  expect_wire(s::Welcome{{"A=1"}, {gh}, {}},
              R"({"type":"welcome","env":["A=1"],"credentials":[{"key":"GITHUB_TOKEN",
                  "value":"ghp_x","endpoints":["api.github.com:443","github.com:443"]}]})",
              s::decode_to_supervisor);
  expect_wire(s::Credentials{{gh}},
              R"({"type":"credentials","credentials":[{"key":"GITHUB_TOKEN","value":"ghp_x",
                  "endpoints":["api.github.com:443","github.com:443"]}]})",
              s::decode_to_supervisor);
  expect_wire(s::Credentials{}, R"({"type":"credentials","credentials":[]})",
              s::decode_to_supervisor);
}

// The CA the gateway made for a launch rides in its welcome, both halves or
// none.
TEST(SupervisorSessionMessages, AWelcomeCarriesTheLaunchsCa) {
  namespace s = session;
  s::Welcome welcome{{"A=1"}, {}, {}};
  welcome.ca_cert = "CERT PEM";
  welcome.ca_key = "KEY PEM";
  expect_wire(welcome,
              R"({"type":"welcome","env":["A=1"],"ca":{"cert":"CERT PEM","key":"KEY PEM"}})",
              s::decode_to_supervisor);
  EXPECT_EQ(
      error_of(s::decode_to_supervisor, R"({"type":"welcome","env":[],"ca":{"cert":"CERT PEM"}})"),
      "supervisor session: \"welcome ca\" message: missing field \"key\"");
  EXPECT_EQ(error_of(s::decode_to_supervisor,
                     R"({"type":"welcome","env":[],"ca":{"cert":"C","key":"K","x":1}})"),
            "supervisor session: \"welcome ca\" message: unknown field \"x\"");
}

TEST(SupervisorSessionMessages, ForwardsAndTheirStatesRoundTrip) {
  namespace s = session;
  const s::Forward local{"127.0.0.1", 8080}, open{"0.0.0.0", 3000};
  expect_wire(s::Welcome{{"A=1"}, {}, {local}},
              R"({"type":"welcome","env":["A=1"],"forwards":[{"bind":"127.0.0.1","port":8080}]})",
              s::decode_to_supervisor);
  expect_wire(s::Forwards{{local, open}},
              R"({"type":"forwards","forwards":[{"bind":"127.0.0.1","port":8080},
                  {"bind":"0.0.0.0","port":3000}]})",
              s::decode_to_supervisor);
  expect_wire(s::Forwards{}, R"({"type":"forwards","forwards":[]})", s::decode_to_supervisor);
  expect_wire(
      s::ForwardStates{{{"127.0.0.1", 8080, "listening", ""},
                        {"0.0.0.0", 3000, "error", "0.0.0.0:3000: Address already in use"}}},
      R"({"type":"forward_states","forwards":[
                  {"bind":"127.0.0.1","port":8080,"state":"listening"},
                  {"bind":"0.0.0.0","port":3000,"state":"error",
                   "error":"0.0.0.0:3000: Address already in use"}]})",
      s::decode_to_gateway);
  EXPECT_EQ(error_of(s::decode_to_supervisor, R"({"type":"forwards"})"),
            "supervisor session: \"forwards\" message: missing field \"forwards\"");
  EXPECT_EQ(error_of(s::decode_to_supervisor,
                     R"({"type":"forwards","forwards":[{"bind":"127.0.0.1","port":70000}]})"),
            "supervisor session: \"forwards forward\" message: field \"port\" must be an integer "
            "from 0 to 65535");
  EXPECT_EQ(error_of(s::decode_to_supervisor,
                     R"({"type":"forwards","forwards":[{"bind":"127.0.0.1","port":0}]})"),
            "supervisor session: \"forwards forward\" message: port 0");
  EXPECT_EQ(
      error_of(s::decode_to_gateway,
               R"({"type":"forward_states","forwards":[{"bind":"::1","port":1,"state":"up"}]})"),
      "supervisor session: \"forward_states forward\" message: field \"state\" must be "
      "listening or error");
}

TEST(SupervisorSessionMessages, BadCredentialsAreRefusedNamingTheField) {
  namespace s = session;
  EXPECT_EQ(error_of(s::decode_to_supervisor, R"({"type":"credentials","credentials":{}})"),
            "supervisor session: \"credentials\" message: field \"credentials\" must be a list");
  EXPECT_EQ(error_of(s::decode_to_supervisor,
                     R"({"type":"credentials","credentials":[{"key":"K","value":"v"}]})"),
            "supervisor session: \"credentials credential\" message: missing field \"endpoints\"");
  EXPECT_EQ(error_of(s::decode_to_supervisor,
                     R"({"type":"welcome","env":[],"credentials":[{"key":"K","value":"v",
                         "endpoints":[],"extra":1}]})"),
            "supervisor session: \"welcome credential\" message: unknown field \"extra\"");
}

TEST(SupervisorSessionMessages, AWrongMessageIsOneLineNamingTheField) {
  namespace s = session;
  struct Case {
    std::string_view text, error;
  } to_gateway[] = {
      {R"({"type":"hello","pid":1})",
       R"(supervisor session: "hello" message: missing field "launch")"},
      {R"({"type":"hello","launch":"x"})",
       R"(supervisor session: "hello" message: missing field "pid")"},
      {R"({"type":"status","state":"running","init_pid":1})",
       R"(supervisor session: "status" message: missing field "generation")"},
      {R"({"type":"status","generation":1,"state":"running"})",
       R"(supervisor session: "status" message: missing field "init_pid")"},
      {R"({"type":"status","generation":1,"state":"starting"})",
       R"(supervisor session: "status" message: missing field "init_pid")"},
      {R"({"type":"status","generation":1,"state":"exited","reason":"x"})",
       R"(supervisor session: "status" message: missing field "exit_code")"},
      {R"({"type":"status","generation":1,"state":"exited","exit_code":1})",
       R"(supervisor session: "status" message: missing field "reason")"},
      {R"({"type":"status","generation":1,"state":"gone"})",
       R"(supervisor session: "status" message: field "state" must be starting, running, exited or stopped)"},
      {R"({"type":"status","generation":1,"state":"running","init_pid":1,"exit_code":0})",
       R"(supervisor session: "status" message: unknown field "exit_code")"},
      {R"({"type":"policy_applied"})",
       R"(supervisor session: "policy_applied" message: missing field "revision")"},
      {R"({"type":"welcome","env":[]})", R"(supervisor session: unknown message type "welcome")"},
  };
  for (const auto& c : to_gateway)
    EXPECT_EQ(error_of(s::decode_to_gateway, c.text), c.error) << c.text;
  Case to_supervisor[] = {
      {R"({"type":"welcome"})", R"(supervisor session: "welcome" message: missing field "env")"},
      {R"({"type":"welcome","env":[1]})",
       R"(supervisor session: "welcome" message: field "env" must be a list of strings)"},
      {R"({"type":"superseded"})",
       R"(supervisor session: "superseded" message: missing field "message")"},
      {R"({"type":"rejected"})",
       R"(supervisor session: "rejected" message: missing field "message")"},
      {R"({"type":"stop"})", R"(supervisor session: "stop" message: missing field "grace_ms")"},
      {R"({"type":"stop","grace_ms":-1})",
       R"(supervisor session: "stop" message: field "grace_ms" is negative)"},
      {R"({"type":"policy","revision":3})",
       R"(supervisor session: "policy" message: missing field "text")"},
      {R"({"type":"policy","text":""})",
       R"(supervisor session: "policy" message: missing field "revision")"},
      {R"({"type":"hello","launch":"x","pid":1})",
       R"(supervisor session: unknown message type "hello")"},
  };
  for (const auto& c : to_supervisor)
    EXPECT_EQ(error_of(s::decode_to_supervisor, c.text), c.error) << c.text;
}

TEST(SupervisorExitFile, IsTheFinalStatusWithoutItsType) {
  session::Status stopped;
  stopped.generation = 1;
  stopped.state = "stopped";
  stopped.exit_code = 143;
  stopped.reason = "Stopped";
  stopped.message = "stopped";
  std::string text = session::encode_exit_file(stopped);
  EXPECT_EQ(json::parse(text), json::parse(R"({"generation":1,"state":"stopped","exit_code":143,
                                               "reason":"Stopped","message":"stopped"})"));
  EXPECT_EQ(json(session::decode_exit_file(text)), json(stopped));
  try {
    session::decode_exit_file(R"({"generation":1,"state":"stopped","reason":"Stopped"})");
    ADD_FAILURE() << "an exit file without exit_code was taken";
  } catch (const ProtocolError& e) {
    EXPECT_STREQ(e.what(), R"(exit file: "status" message: missing field "exit_code")");
  }
  EXPECT_THROW(session::decode_exit_file("{"), ProtocolError);
}

TEST(ExecHandoffPacket, IsTheTagThenTheRequestByteForByte) {
  const std::string request = std::string("GET / HTTP/1.1\r\nX: \xff\r\n\r\n") + '\0';
  std::string packet = encode_exec_handoff(request);
  EXPECT_EQ(packet, "openshell exec-handoff 1\n" + request);
  EXPECT_EQ(decode_exec_handoff(packet), request);
  auto error = [](std::string_view p) {
    try {
      decode_exec_handoff(p);
    } catch (const ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error(std::string("handoff") + '\0' + request + '\0'),
            "exec handoff: the packet does not start with \"openshell exec-handoff 1\"");
  EXPECT_EQ(error("openshell exec-handoff 1\n"), "exec handoff: the packet holds no request");
  EXPECT_EQ(error("openshell exec-handoff 2\nGET"),
            "exec handoff: the packet does not start with \"openshell exec-handoff 1\"");
}

}  // namespace
}  // namespace openshell::protocol

namespace openshell::protocol::exec {
namespace {

// The start message in an upgrade request's header field: what a client
// puts there, the supervisor reads back; anything else is not a start.
TEST(ExecStartHeader, RoundTripsAndRefusesWhatIsNoStart) {
  Start start;
  start.argv = {"sh", "-c", "echo \"a b\"; exit 3"};
  start.env = {"K=v w", "UNI=\xc3\xa9"};
  start.workdir = "/tmp";
  start.tty = true;
  auto value = start_header(start);
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(value->find_first_of(" \r\n\":"), std::string::npos) << *value;
  const std::string request =
      "GET /v1/sandboxes/x/exec HTTP/1.1\r\nHost: localhost\r\n"
      "openshell-exec-start:  " +
      *value + "\r\nUpgrade: websocket\r\n\r\n";
  auto back = start_in_request(request);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->argv, start.argv);
  EXPECT_EQ(back->env, start.env);
  EXPECT_EQ(back->workdir, start.workdir);
  EXPECT_TRUE(back->tty);

  auto with = [](const std::string& field) {
    return start_in_request("GET / HTTP/1.1\r\n" + field + "\r\nHost: x\r\n\r\n");
  };
  EXPECT_FALSE(with("Host: y"));
  EXPECT_FALSE(with("Openshell-Exec-Start: %7Bnot json"));
  EXPECT_FALSE(with("Openshell-Exec-Start: %zz"));
  EXPECT_FALSE(with("Openshell-Exec-Start: " + text::percent_encode(encode(Eof{}))));
  EXPECT_FALSE(
      with("Openshell-Exec-Start: " + text::percent_encode(R"({"type":"start","argv":[]})")));
  EXPECT_FALSE(with("Openshell-Exec-Start-Not: " + *value));
  // After the head, nothing is a field.
  EXPECT_FALSE(start_in_request("GET / HTTP/1.1\r\nHost: x\r\n\r\nOpenshell-Exec-Start: " + *value +
                                "\r\n"));

  Start big;
  big.argv = {std::string(kStartHeaderMax, 'x')};
  EXPECT_FALSE(start_header(big).has_value());
}

}  // namespace
}  // namespace openshell::protocol::exec
