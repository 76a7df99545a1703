// The init's control channel: what arrives from inside the sandbox is parsed
// strictly (a malformed exec request is refused, never half-read). Its
// packets and their fds: tests/unit/packet_test.cc.
#include "runtime/init_protocol.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../fuzz/init_protocol_check.h"

namespace openshell::runtime {
namespace {

using Kind = InitMessage::Kind;

std::string msg(std::vector<std::string> parts) { return make_message(parts); }

TEST(InitProtocolParse, EachKindAndItsFields) {
  struct Case {
    std::string packet;
    Kind kind;
    std::vector<std::string> fields;
  };
  const std::vector<Case> cases = {
      {msg({"started", "3", "42"}), Kind::kStarted, {"3", "42"}},
      {msg({"failed", "3", "127", "2", "exec"}), Kind::kFailed, {"3", "127", "2", "exec"}},
      {msg({"exited", "3", "0"}), Kind::kExited, {"3", "0"}},
      {msg({"exec", "1"}), Kind::kExec, {"1"}},
      {msg({"kill", "3", "15"}), Kind::kKill, {"3", "15"}},
      {msg({"kill"}), Kind::kKill, {}},
      {msg({"socket", "7"}), Kind::kSocket, {"7"}},
      {msg({"socket", "7", "0"}), Kind::kSocket, {"7", "0"}},
      {msg({"kill", "", ""}), Kind::kKill, {"", ""}},
      {msg({"bogus", "1"}), Kind::kUnknown, {"1"}},
      {msg({""}), Kind::kUnknown, {}},
      {msg({"Exec", "1"}), Kind::kUnknown, {"1"}},
  };
  for (const auto& c : cases) {
    InitMessage m = parse_message(c.packet);
    EXPECT_EQ(m.kind, c.kind) << c.packet;
    EXPECT_EQ(m.fields, c.fields) << c.packet;
  }
}

TEST(InitProtocolParse, ShortOrUnterminatedPacketsAreUnknownAndEmpty) {
  for (std::string packet : {std::string(), std::string("exec"), std::string("kill\0003\00015", 9),
                             std::string("started\0", 8) + "3"}) {
    InitMessage m = parse_message(packet);
    EXPECT_EQ(m.kind, Kind::kUnknown) << packet.size();
    EXPECT_TRUE(m.fields.empty()) << packet.size();
  }
}

ExecRequest sample() {
  ExecRequest r;
  r.id = 18446744073709551615ull;
  r.tty = true;
  r.rows = 65535;
  r.cols = 1;
  r.workdir = "/work dir";
  r.argv = {"sh", "-c", "echo 'a b'", ""};
  r.env = {"PATH=/bin", "EMPTY="};
  return r;
}

TEST(InitProtocolExec, RoundTripKeepsEveryField) {
  auto r = decode_exec(parse_message(encode_exec(sample())));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, sample().id);
  EXPECT_TRUE(r->tty);
  EXPECT_EQ(r->rows, 65535);
  EXPECT_EQ(r->cols, 1);
  EXPECT_EQ(r->workdir, "/work dir");
  EXPECT_EQ(r->argv, sample().argv);
  EXPECT_EQ(r->env, sample().env);
}

TEST(InitProtocolExec, RoundTripKeepsTheUser) {
  ExecRequest request = sample();
  EXPECT_FALSE(decode_exec(parse_message(encode_exec(request)))->user);
  request.user = ExecUser{0, 0};
  EXPECT_EQ(decode_exec(parse_message(encode_exec(request)))->user, request.user);
  request.user = ExecUser{4294967294u, 1001};
  auto r = decode_exec(parse_message(encode_exec(request)));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->user, request.user);
  EXPECT_EQ(r->env, sample().env);
}

// "main": the same body, for the sandbox's main process (an OCI start).
TEST(InitProtocolExec, MainIsAnExecOfItsOwnKind) {
  ExecRequest request = sample();
  request.main = true;
  const std::string packet = encode_exec(request);
  EXPECT_EQ(packet.substr(0, 5), std::string("main\0", 5));
  InitMessage m = parse_message(packet);
  EXPECT_EQ(m.kind, InitMessage::Kind::kMain);
  auto decoded = decode_exec(m);
  ASSERT_TRUE(decoded);
  EXPECT_TRUE(decoded->main);
  EXPECT_EQ(decoded->argv, request.argv);
  EXPECT_FALSE(decode_exec(parse_message(encode_exec(sample())))->main);
}

TEST(InitProtocolExec, MalformedUsersAreRefused) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"uid without gid", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "0"}},
      {"three ids", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "0", "0", "0"}},
      {"uid not a number", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "root", "0"}},
      {"uid -1", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "4294967295", "0"}},
      {"gid with a sign", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "0", "+0"}},
      {"uid not canonical", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "00", "0"}},
      {"empty gid", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "0", ""}},
  };
  for (const auto& [what, parts] : cases)
    EXPECT_FALSE(decode_exec(parse_message(make_message(parts)))) << what;
  auto good = decode_exec(
      parse_message(msg({"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "0", "5"})));
  ASSERT_TRUE(good);
  EXPECT_EQ(good->user, (ExecUser{0, 5}));
}

// exec ID TTY ROWS COLS WORKDIR ARGC ARG... ENVC ENV... [UID GID]
TEST(InitProtocolExec, MalformedRequestsAreRefused) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"wrong kind", {"kill", "1", "0", "24", "80", "/", "1", "sh", "0"}},
      {"no fields", {"exec"}},
      {"no argc", {"exec", "1", "0", "24", "80", "/"}},
      {"no envc", {"exec", "1", "0", "24", "80", "/", "1", "sh"}},
      {"id not a number", {"exec", "x", "0", "24", "80", "/", "1", "sh", "0"}},
      {"negative id", {"exec", "-1", "0", "24", "80", "/", "1", "sh", "0"}},
      {"id past 64 bits", {"exec", "18446744073709551616", "0", "24", "80", "/", "1", "sh", "0"}},
      {"empty id", {"exec", "", "0", "24", "80", "/", "1", "sh", "0"}},
      {"tty 2", {"exec", "1", "2", "24", "80", "/", "1", "sh", "0"}},
      {"tty empty", {"exec", "1", "", "24", "80", "/", "1", "sh", "0"}},
      {"rows past 16 bits", {"exec", "1", "0", "65536", "80", "/", "1", "sh", "0"}},
      {"cols with a sign", {"exec", "1", "0", "24", "+80", "/", "1", "sh", "0"}},
      {"cols with a space", {"exec", "1", "0", "24", "80 ", "/", "1", "sh", "0"}},
      {"argc zero", {"exec", "1", "0", "24", "80", "/", "0", "0"}},
      {"argc past the packet", {"exec", "1", "0", "24", "80", "/", "3", "sh", "0"}},
      {"argc past the limit", {"exec", "1", "0", "24", "80", "/", "65537", "sh", "0"}},
      {"argc negative", {"exec", "1", "0", "24", "80", "/", "-1", "sh", "0"}},
      {"envc short", {"exec", "1", "0", "24", "80", "/", "1", "sh", "2", "A=1"}},
      {"envc long", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "A=1"}},
      {"envc not a number", {"exec", "1", "0", "24", "80", "/", "1", "sh", "one", "A=1"}},
      {"envc huge", {"exec", "1", "0", "24", "80", "/", "1", "sh", "18446744073709551615"}},
  };
  for (const auto& [what, parts] : cases)
    EXPECT_FALSE(decode_exec(parse_message(make_message(parts)))) << what;
  // The same shape with good values decodes, so each refusal above is the
  // field it names.
  EXPECT_TRUE(decode_exec(parse_message(msg({"exec", "1", "0", "24", "80", "/", "1", "sh", "0"}))));
  EXPECT_TRUE(
      decode_exec(parse_message(msg({"exec", "1", "1", "0", "0", "", "1", "sh", "1", "A=1"}))));
}

// The fuzz target's properties, over its committed corpus, on every build.
TEST(InitProtocolCorpus, EveryInputKeepsTheProtocolsProperties) {
  namespace fs = std::filesystem;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(OSH_INIT_PROTOCOL_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(fuzz::init_protocol_violation(data), "") << entry.path();
    ++count;
  }
  EXPECT_GE(count, 10) << "the corpus at " OSH_INIT_PROTOCOL_CORPUS " is missing";
}

}  // namespace
}  // namespace openshell::runtime
