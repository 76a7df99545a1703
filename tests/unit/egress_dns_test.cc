#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/ip/udp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/unique_fd.h"
#include "egress/proxy.h"
#include "net/dns.h"
#include "policy/policy.h"
#include "supervisor/network_rules.h"
#include "test_util.h"

namespace openshell::egress {
namespace {

namespace asio = boost::asio;
using asio::ip::udp;
using namespace net::dns;
using namespace std::chrono_literals;
using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// ---- building messages by hand ------------------------------------------------

void put16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value >> 8));
  out.push_back(static_cast<char>(value & 0xFF));
}

void put32(std::string& out, uint32_t value) {
  put16(out, static_cast<uint16_t>(value >> 16));
  put16(out, static_cast<uint16_t>(value));
}

uint16_t get16(const std::string& m, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(m.at(at)) << 8) |
                               static_cast<uint8_t>(m.at(at + 1)));
}

uint32_t get32(const std::string& m, size_t at) {
  return (static_cast<uint32_t>(get16(m, at)) << 16) | get16(m, at + 2);
}

std::string header(uint16_t id, uint16_t flags, uint16_t questions, uint16_t answers = 0,
                   uint16_t authority = 0, uint16_t additional = 0) {
  std::string out;
  put16(out, id);
  put16(out, flags);
  put16(out, questions);
  put16(out, answers);
  put16(out, authority);
  put16(out, additional);
  return out;
}

// Labels exactly as given (no checks: tests build bad names too).
std::string wire_name(const std::string& dotted) {
  std::string out;
  size_t start = 0;
  while (start < dotted.size()) {
    size_t dot = dotted.find('.', start);
    if (dot == std::string::npos) dot = dotted.size();
    out.push_back(static_cast<char>(dot - start));
    out += dotted.substr(start, dot - start);
    start = dot + 1;
  }
  out.push_back('\0');
  return out;
}

std::string question(const std::string& name_wire, uint16_t type, uint16_t klass = kClassIN) {
  std::string out = name_wire;
  put16(out, type);
  put16(out, klass);
  return out;
}

std::string query_message(uint16_t id, const std::string& name, uint16_t type,
                          uint16_t flags = 0x0100) {
  return header(id, flags, 1) + question(wire_name(name), type);
}

std::string record(const std::string& owner_wire, uint16_t type, const std::string& data,
                   uint32_t ttl = 60) {
  std::string out = owner_wire;
  put16(out, type);
  put16(out, kClassIN);
  put32(out, ttl);
  put16(out, static_cast<uint16_t>(data.size()));
  return out + data;
}

std::string pointer(uint16_t offset) {
  std::string out;
  put16(out, static_cast<uint16_t>(0xC000 | offset));
  return out;
}

std::string address_bytes(const std::string& text) {
  auto address = Address::parse(text);
  EXPECT_TRUE(address) << text;
  if (!address) return "";
  return std::string(reinterpret_cast<const char*>(address->bytes),
                     address->family == AF_INET ? 4 : 16);
}

Address addr(const std::string& text) {
  auto address = Address::parse(text);
  EXPECT_TRUE(address) << text;
  return address.value_or(Address{});
}

// "PREFIX" + i + ".example" (built so that GCC 12 sees no overlapping copy).
std::string numbered(const char* prefix, int i) {
  std::string name(prefix);
  name += std::to_string(i);
  name += ".example";
  return name;
}

std::vector<std::string> texts(const std::vector<Address>& addresses) {
  std::vector<std::string> out;
  for (const Address& address : addresses) out.push_back(address.to_string());
  return out;
}

std::string lower(std::string text) {
  for (char& c : text)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c | 0x20);
  return text;
}

// ---- parse_query --------------------------------------------------------------

TEST(EgressDnsParseQuery, AcceptsAnAQuery) {
  auto query = parse_query(query_message(0x1234, "api.github.com", kTypeA));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->id, 0x1234);
  EXPECT_TRUE(query->recursion_desired);
  EXPECT_EQ(query->question.name, "api.github.com");
  EXPECT_EQ(query->question.type, kTypeA);
  EXPECT_EQ(query->question.klass, kClassIN);
}

TEST(EgressDnsParseQuery, AcceptsAnAaaaQueryWithoutRecursionDesired) {
  auto query = parse_query(query_message(0xBEEF, "example.com", kTypeAAAA, 0));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->id, 0xBEEF);
  EXPECT_FALSE(query->recursion_desired);
  EXPECT_EQ(query->question.name, "example.com");
  EXPECT_EQ(query->question.type, kTypeAAAA);
}

TEST(EgressDnsParseQuery, LowerCasesTheName) {
  auto query = parse_query(query_message(1, "WWW.Example.COM", kTypeA));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->question.name, "www.example.com");
}

TEST(EgressDnsParseQuery, NamesHaveNoTrailingDot) {
  // On the wire every name ends in the root label; the text has no dot for it.
  auto query = parse_query(query_message(1, "example.com.", kTypeA));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->question.name, "example.com");
  auto root = parse_query(header(1, 0, 1) + question(std::string(1, '\0'), 2));
  ASSERT_TRUE(root);
  EXPECT_EQ(root->question.name, "");
}

TEST(EgressDnsParseQuery, AcceptsAnEdnsRecordAfterTheQuestion) {
  // dig and most stubs add an OPT record in the additional section.
  std::string opt = std::string(1, '\0');
  put16(opt, 41);    // OPT
  put16(opt, 1232);  // UDP payload size
  put32(opt, 0);
  put16(opt, 0);
  auto query = parse_query(header(7, 0x0100, 1, 0, 0, 1) +
                           question(wire_name("x.example"), kTypeAAAA) + opt);
  ASSERT_TRUE(query);
  EXPECT_EQ(query->question.name, "x.example");
}

TEST(EgressDnsParseQuery, KeepsOtherTypesAndClassesForTheCaller) {
  auto query = parse_query(header(1, 0, 1) + question(wire_name("example.com"), 65, 3));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->question.type, 65);
  EXPECT_EQ(query->question.klass, 3);
}

TEST(EgressDnsParseQuery, RefusesEveryTruncation) {
  std::string message = query_message(0x4242, "api.github.com", kTypeAAAA);
  ASSERT_TRUE(parse_query(message));
  for (size_t n = 0; n < message.size(); ++n)
    EXPECT_FALSE(parse_query(std::string_view(message.data(), n))) << "first " << n << " bytes";
}

TEST(EgressDnsParseQuery, RefusesResponses) {
  EXPECT_FALSE(parse_query(query_message(1, "example.com", kTypeA, 0x8100)));
}

TEST(EgressDnsParseQuery, RefusesOtherOpcodes) {
  EXPECT_FALSE(parse_query(query_message(1, "example.com", kTypeA, 2 << 11)));  // STATUS
  EXPECT_FALSE(parse_query(query_message(1, "example.com", kTypeA, 5 << 11)));  // UPDATE
}

TEST(EgressDnsParseQuery, RefusesQuestionCountsOtherThanOne) {
  std::string q = question(wire_name("example.com"), kTypeA);
  EXPECT_FALSE(parse_query(header(1, 0, 0)));
  EXPECT_FALSE(parse_query(header(1, 0, 0) + q));
  EXPECT_FALSE(parse_query(header(1, 0, 2) + q + q));
  EXPECT_TRUE(parse_query(header(1, 0, 1) + q));
}

TEST(EgressDnsParseQuery, LabelsHoldAtMost63Octets) {
  std::string label63(63, 'a');
  EXPECT_TRUE(parse_query(query_message(1, label63 + ".com", kTypeA)));
  EXPECT_FALSE(parse_query(query_message(1, label63 + "a.com", kTypeA)));
}

TEST(EgressDnsParseQuery, NamesHoldAtMost255Octets) {
  std::string l63(63, 'a');
  // 3 * 64 + 62 + 1 = 255 octets on the wire: the longest name.
  std::string longest = l63 + "." + l63 + "." + l63 + "." + std::string(61, 'b');
  auto query = parse_query(query_message(1, longest, kTypeA));
  ASSERT_TRUE(query);
  EXPECT_EQ(query->question.name.size(), 253u);
  EXPECT_FALSE(parse_query(query_message(1, longest + "b", kTypeA)));
  EXPECT_FALSE(parse_query(query_message(1, l63 + "." + l63 + "." + l63 + "." + l63, kTypeA)));
}

TEST(EgressDnsParseQuery, RefusesCompressionPointersInTheQuestion) {
  // "www" then a pointer back to... anything: queries carry no compression.
  std::string name = std::string("\3www", 4) + pointer(12);
  EXPECT_FALSE(parse_query(header(1, 0, 1) + question(name, kTypeA)));
  EXPECT_FALSE(parse_query(header(1, 0, 1) + question(pointer(12), kTypeA)));
  // The obsolete label types 0x40 and 0x80 too.
  EXPECT_FALSE(parse_query(header(1, 0, 1) + question(std::string("\x41x\0", 3), kTypeA)));
  EXPECT_FALSE(parse_query(header(1, 0, 1) + question(std::string("\x81x\0", 3), kTypeA)));
}

TEST(EgressDnsParseQuery, RefusesNamesThatAreNotHostNames) {
  // A dot inside a label would make "a.b" (one label) read as two.
  EXPECT_FALSE(parse_query(header(1, 0, 1) + question(std::string("\3a.b\3com\0", 9), kTypeA)));
  EXPECT_FALSE(parse_query(query_message(1, "exa mple.com", kTypeA)));
  EXPECT_FALSE(parse_query(query_message(1, "caf\xc3\xa9.com", kTypeA)));
  EXPECT_FALSE(parse_query(header(1, 0, 1) + question(std::string("\3a\0b\0", 5), kTypeA)));
  EXPECT_TRUE(parse_query(query_message(1, "_dmarc.my-host.example", kTypeA)));
}

// What an accepted message must look like: a query header, one question,
// and the question's bytes exactly those of the parsed name (case aside).
void expect_consistent(const std::string& message, const Query& query) {
  ASSERT_GE(message.size(), 12u);
  uint16_t flags = get16(message, 2);
  EXPECT_EQ(flags & 0x8000, 0);
  EXPECT_EQ((flags >> 11) & 0xF, 0);
  EXPECT_EQ(get16(message, 4), 1);
  EXPECT_EQ(query.id, get16(message, 0));
  EXPECT_EQ(query.recursion_desired, (flags & 0x0100) != 0);
  EXPECT_LE(query.question.name.size(), 253u);
  for (char c : query.question.name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    EXPECT_TRUE(ok) << "byte " << int(static_cast<uint8_t>(c)) << " in " << query.question.name;
  }
  std::string name =
      query.question.name.empty() ? std::string(1, '\0') : wire_name(query.question.name);
  std::string type_and_class;
  put16(type_and_class, query.question.type);
  put16(type_and_class, query.question.klass);
  ASSERT_GE(message.size(), 12 + name.size() + 4);
  EXPECT_EQ(lower(message.substr(12, name.size())), name);
  EXPECT_EQ(message.substr(12 + name.size(), 4), type_and_class);
}

TEST(EgressDnsParseQuery, RandomBytesNeverCrashNorPassAsQueries) {
  std::mt19937 random(20240607);
  int accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string message(random() % 80, '\0');
    for (char& c : message) c = static_cast<char>(random());
    if (i % 2 == 0 && message.size() >= 12) {  // plausible headers reach the name parser
      message[2] = static_cast<char>(message[2] & 0x07);
      message[4] = 0;
      message[5] = 1;
    }
    auto query = parse_query(message);
    if (!query) continue;
    ++accepted;
    expect_consistent(message, *query);
    if (HasFailure()) FAIL() << "iteration " << i;
  }
  RecordProperty("accepted", accepted);
}

TEST(EgressDnsParseQuery, MutatedQueriesParseConsistentlyOrNotAtAll) {
  std::mt19937 random(7);
  const std::string valid = query_message(0x0102, "Www.Example-1.com", kTypeAAAA) +
                            std::string("\0\0\x29\x04\xd0\0\0\0\0\0\0", 11);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string message = valid;
    int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = random() % message.size();
      switch (random() % 3) {
        case 0:
          message[at] = static_cast<char>(random());
          break;
        case 1:
          message.erase(at, 1);
          break;
        default:
          message.insert(at, 1, static_cast<char>(random()));
          break;
      }
    }
    auto query = parse_query(message);
    if (!query) {
      ++refused;
      continue;
    }
    ++accepted;
    expect_consistent(message, *query);
    if (HasFailure()) FAIL() << "iteration " << i;
  }
  // Both outcomes happen, or the test says nothing.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

// ---- build_response -----------------------------------------------------------

struct ParsedAnswer {
  uint16_t name = 0;  // the compression pointer
  uint16_t type = 0, klass = 0;
  uint32_t ttl = 0;
  std::string data;
};

struct ParsedResponse {
  uint16_t id = 0, flags = 0, qdcount = 0, ancount = 0, nscount = 0, arcount = 0;
  std::string question;  // name, type and class as bytes
  std::vector<ParsedAnswer> answers;
};

// By hand, expecting what build_response promises: the question uncompressed
// at offset 12, answer names as two-byte pointers, nothing after the answers.
ParsedResponse parse_by_hand(const std::string& m) {
  ParsedResponse r;
  r.id = get16(m, 0);
  r.flags = get16(m, 2);
  r.qdcount = get16(m, 4);
  r.ancount = get16(m, 6);
  r.nscount = get16(m, 8);
  r.arcount = get16(m, 10);
  size_t at = 12;
  if (r.qdcount == 1) {
    while (m.at(at) != 0) at += 1 + static_cast<uint8_t>(m.at(at));
    at += 5;
    r.question = m.substr(12, at - 12);
  }
  for (int i = 0; i < r.ancount; ++i) {
    ParsedAnswer a;
    a.name = get16(m, at);
    a.type = get16(m, at + 2);
    a.klass = get16(m, at + 4);
    a.ttl = get32(m, at + 6);
    uint16_t length = get16(m, at + 10);
    a.data = m.substr(at + 12, length);
    EXPECT_EQ(a.data.size(), length);
    at += 12 + length;
    r.answers.push_back(a);
  }
  EXPECT_EQ(at, m.size()) << "bytes after the answers";
  return r;
}

TEST(EgressDnsBuildResponse, AnswersARecordsAndSkipsIpv6) {
  std::string query_bytes = query_message(0xA1B2, "Api.Example.com", kTypeA);
  auto query = parse_query(query_bytes);
  ASSERT_TRUE(query);
  std::string message = build_response(
      *query, kRcodeNoError, {addr("192.0.2.1"), addr("2001:db8::1"), addr("198.51.100.7")}, 300);
  ParsedResponse r = parse_by_hand(message);
  EXPECT_EQ(r.id, 0xA1B2);
  EXPECT_TRUE(r.flags & 0x8000) << "QR";
  EXPECT_EQ((r.flags >> 11) & 0xF, 0) << "opcode";
  EXPECT_FALSE(r.flags & 0x0400) << "AA";
  EXPECT_FALSE(r.flags & 0x0200) << "TC";
  EXPECT_TRUE(r.flags & 0x0100) << "RD";
  EXPECT_TRUE(r.flags & 0x0080) << "RA";
  EXPECT_EQ(r.flags & 0xF, kRcodeNoError);
  EXPECT_EQ(r.qdcount, 1);
  EXPECT_EQ(r.nscount, 0);
  EXPECT_EQ(r.arcount, 0);
  EXPECT_EQ(r.question, question(wire_name("api.example.com"), kTypeA));
  ASSERT_EQ(r.ancount, 2);
  ASSERT_EQ(r.answers.size(), 2u);
  for (const ParsedAnswer& a : r.answers) {
    EXPECT_EQ(a.name, 0xC00C);
    EXPECT_EQ(a.type, kTypeA);
    EXPECT_EQ(a.klass, kClassIN);
    EXPECT_EQ(a.ttl, 300u);
  }
  EXPECT_EQ(r.answers[0].data, address_bytes("192.0.2.1"));
  EXPECT_EQ(r.answers[1].data, address_bytes("198.51.100.7"));
}

TEST(EgressDnsBuildResponse, AnswersAaaaRecordsAndSkipsIpv4) {
  auto query = parse_query(query_message(9, "v6.example", kTypeAAAA, 0));
  ASSERT_TRUE(query);
  ParsedResponse r = parse_by_hand(build_response(
      *query, kRcodeNoError, {addr("192.0.2.1"), addr("2001:db8::1"), addr("::1")}, 5));
  EXPECT_EQ(r.id, 9);
  EXPECT_FALSE(r.flags & 0x0100) << "RD as in the query";
  EXPECT_TRUE(r.flags & 0x0080) << "RA";
  ASSERT_EQ(r.answers.size(), 2u);
  EXPECT_EQ(r.answers[0].type, kTypeAAAA);
  EXPECT_EQ(r.answers[0].ttl, 5u);
  EXPECT_EQ(r.answers[0].data, address_bytes("2001:db8::1"));
  EXPECT_EQ(r.answers[1].data, address_bytes("::1"));
}

TEST(EgressDnsBuildResponse, NxDomainHasTheRcodeAndNoAnswers) {
  auto query = parse_query(query_message(77, "blocked.example", kTypeA));
  ASSERT_TRUE(query);
  ParsedResponse r = parse_by_hand(build_response(*query, kRcodeNxDomain, {}, 0));
  EXPECT_EQ(r.id, 77);
  EXPECT_EQ(r.flags & 0xF, kRcodeNxDomain);
  EXPECT_EQ(r.ancount, 0);
  EXPECT_EQ(r.question, question(wire_name("blocked.example"), kTypeA));
}

TEST(EgressDnsBuildResponse, OtherTypesGetAnEmptyAnswer) {
  auto query = parse_query(header(3, 0x0100, 1) + question(wire_name("example.com"), 65));
  ASSERT_TRUE(query);
  ParsedResponse r = parse_by_hand(build_response(*query, kRcodeNoError, {addr("192.0.2.1")}, 60));
  EXPECT_EQ(r.flags & 0xF, kRcodeNoError);
  EXPECT_EQ(r.ancount, 0);
  EXPECT_EQ(r.question, question(wire_name("example.com"), 65));
}

TEST(EgressDnsBuildResponse, StaysWithin512Bytes) {
  auto query = parse_query(query_message(3, "many.example", kTypeAAAA));
  ASSERT_TRUE(query);
  std::vector<Address> many;
  for (int i = 1; i <= 100; ++i) many.push_back(addr("2001:db8::" + std::to_string(i)));
  std::string message = build_response(*query, kRcodeNoError, many, 60);
  EXPECT_LE(message.size(), 512u);
  ParsedResponse r = parse_by_hand(message);
  EXPECT_GT(r.ancount, 10);
  EXPECT_EQ(r.answers.back().data, address_bytes("2001:db8::" + std::to_string(r.ancount)));
}

TEST(EgressDnsBuildResponse, ABadNameInAHandMadeQueryGivesFormErr) {
  Query query;
  query.id = 5;
  query.question = {"a..b", kTypeA, kClassIN};
  ParsedResponse r = parse_by_hand(build_response(query, kRcodeNoError, {addr("192.0.2.1")}, 60));
  EXPECT_EQ(r.id, 5);
  EXPECT_EQ(r.flags & 0xF, kRcodeFormErr);
  EXPECT_EQ(r.qdcount, 0);
  EXPECT_EQ(r.ancount, 0);
}

// ---- the resolver against a fake nameserver on 127.0.0.1 ----------------------

// A nameserver on 127.0.0.1 driven by the test's io_context. reply gives the
// datagrams to send back for each query, in order (none: silence).
class FakeDnsServer {
 public:
  using Reply = std::function<std::vector<std::string>(const Query& query, const std::string& raw)>;

  FakeDnsServer(asio::io_context& io, Reply reply, uint16_t port = 0)
      : socket_(io, udp::endpoint(asio::ip::make_address("127.0.0.1"), port)),
        reply_(std::move(reply)) {
    receive();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
  uint16_t port() const { return socket_.local_endpoint().port(); }

  std::vector<Query> queries;
  std::vector<udp::endpoint> clients;
  std::function<void(const udp::endpoint& client)> on_query;  // before reply

 private:
  void receive() {
    socket_.async_receive_from(asio::buffer(buffer_), client_,
                               [this](boost::system::error_code ec, size_t size) {
                                 if (ec) return;
                                 std::string raw(buffer_.data(), size);
                                 auto query = parse_query(raw);
                                 if (query) {
                                   queries.push_back(*query);
                                   clients.push_back(client_);
                                   if (on_query) on_query(client_);
                                   for (const std::string& datagram : reply_(*query, raw)) {
                                     boost::system::error_code ignored;
                                     socket_.send_to(asio::buffer(datagram), client_, 0, ignored);
                                   }
                                 }
                                 receive();
                               });
  }

  udp::socket socket_;
  Reply reply_;
  udp::endpoint client_;
  std::array<char, 4096> buffer_;
};

// Answers from a table: name -> addresses (both families); other names NXDOMAIN.
FakeDnsServer::Reply table(std::map<std::string, std::vector<std::string>> names) {
  return [names](const Query& query, const std::string&) -> std::vector<std::string> {
    auto it = names.find(query.question.name);
    if (it == names.end()) return {build_response(query, kRcodeNxDomain, {}, 0)};
    std::vector<Address> addresses;
    for (const std::string& text : it->second) addresses.push_back(addr(text));
    return {build_response(query, kRcodeNoError, addresses, 60)};
  };
}

FakeDnsServer::Reply silence() {
  return [](const Query&, const std::string&) { return std::vector<std::string>{}; };
}

struct Outcome {
  int calls = 0;
  std::vector<std::string> addresses;
  std::string error;
  std::chrono::milliseconds elapsed{0};
};

// Waits (up to 30 s) until the datagram that SENDER (a UDP socket connected
// to local port PORT) sent has met its end: it waits in the receive queue
// of the socket on that port (as /proc/net/udp shows it), or the kernel
// refused it (no socket would take it: the sender gets ECONNREFUSED).
void wait_delivered_or_refused(int sender, uint16_t port) {
  char local[32];
  std::snprintf(local, sizeof local, ":%04X", port);
  for (int i = 0; i < 30000; ++i, std::this_thread::sleep_for(1ms)) {
    char byte;
    if (::recv(sender, &byte, 1, MSG_DONTWAIT) < 0 && errno == ECONNREFUSED) return;
    std::ifstream table("/proc/net/udp");
    for (std::string line; std::getline(table, line);) {
      std::istringstream fields(line);
      std::string slot, address, remote, state, queues;
      fields >> slot >> address >> remote >> state >> queues;
      if (address.ends_with(local) && queues.size() > 9 &&
          std::stoul(queues.substr(9), nullptr, 16) > 0)
        return;
    }
  }
  ADD_FAILURE() << "the datagram to port " << port << " was neither delivered nor refused";
}

// Runs the loop until the callback came (and a little longer, to see a second
// call), or gives up after limit. Tests that an answer comes without waiting
// for a timeout set a timeout longer than the limit: a lookup that waited
// would miss it, however loaded the machine.
constexpr auto kLongTimeoutMs = 120000;
Outcome resolve_and_wait(asio::io_context& io, Resolver& resolver, const std::string& host,
                         std::chrono::milliseconds limit = 60000ms) {
  auto outcome = std::make_shared<Outcome>();
  auto start = std::chrono::steady_clock::now();
  resolver.resolve(host, [outcome, start](std::vector<Address> addresses, std::string error) {
    ++outcome->calls;
    outcome->addresses = texts(addresses);
    outcome->error = error;
    outcome->elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
  });
  EXPECT_EQ(outcome->calls, 0) << "called back from inside resolve()";
  auto deadline = start + limit;
  while (outcome->calls == 0 && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(5ms);
  }
  io.restart();
  io.run_for(20ms);
  EXPECT_EQ(outcome->calls, 1) << host;
  return *outcome;
}

class ResolverTest : public ::testing::Test {
 protected:
  ResolverConfig config_with(const std::vector<std::string>& servers) {
    ResolverConfig config;
    config.hosts_file = dir_ / "hosts-missing";
    config.resolv_conf = dir_ / "resolv-missing";
    config.servers = servers;
    config.timeout_ms = 1000;
    config.attempts = 2;
    return config;
  }

  asio::io_context io_;
  TempDir dir_;
};

TEST_F(ResolverTest, AAndAaaaAnswersFromTheServer) {
  FakeDnsServer server(io_, table({{"api.example.com", {"192.0.2.10", "2001:db8::10"}}}));
  Resolver resolver(io_, config_with({server.address()}));
  Outcome out = resolve_and_wait(io_, resolver, "api.example.com");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.10", "2001:db8::10"));
  ASSERT_EQ(server.queries.size(), 2u);
  std::set<uint16_t> types;
  for (const Query& query : server.queries) {
    types.insert(query.question.type);
    EXPECT_EQ(query.question.name, "api.example.com");
    EXPECT_EQ(query.question.klass, kClassIN);
    EXPECT_TRUE(query.recursion_desired);
  }
  EXPECT_THAT(types, UnorderedElementsAre(kTypeA, kTypeAAAA));
}

TEST_F(ResolverTest, NamesAreAskedInLowerCaseWithoutTheTrailingDot) {
  FakeDnsServer server(io_, table({{"www.example.org", {"192.0.2.11"}}}));
  Resolver resolver(io_, config_with({server.address()}));
  Outcome out = resolve_and_wait(io_, resolver, "WWW.Example.ORG.");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.11"));  // AAAA: no data
}

TEST_F(ResolverTest, FollowsACnameChainInsideTheAnswer) {
  // www.example.com -> cdn.example.com -> edge.example.net -> addresses, the
  // names compressed; plus a record for a name off the chain.
  FakeDnsServer server(io_, [](const Query& query, const std::string& raw) {
    std::string m = header(query.id, 0x8180, 1, 4) + raw.substr(12, raw.size() - 12);
    // question name "www.example.com" at 12; "example.com" at 16
    size_t cdn_at = m.size() + 12;
    m += record(pointer(12), 5, std::string("\3cdn", 4) + pointer(16));
    size_t edge_at = m.size() + 12;
    m += record(pointer(static_cast<uint16_t>(cdn_at)), 5, wire_name("edge.example.net"));
    m += record(wire_name("evil.example.org"), query.question.type,
                address_bytes(query.question.type == kTypeA ? "6.6.6.6" : "2001:db8::666"));
    m += record(pointer(static_cast<uint16_t>(edge_at)), query.question.type,
                address_bytes(query.question.type == kTypeA ? "203.0.113.7" : "2001:db8::7"));
    return std::vector<std::string>{m};
  });
  Resolver resolver(io_, config_with({server.address()}));
  Outcome out = resolve_and_wait(io_, resolver, "www.example.com");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("203.0.113.7", "2001:db8::7"));
}

TEST_F(ResolverTest, CompressionLoopsAreRefusedNotFollowed) {
  int replies = 0;
  FakeDnsServer server(io_, [&](const Query& query, const std::string& raw) {
    ++replies;
    std::string q = raw.substr(12);
    // A CNAME whose target points at itself, then one pointing forward.
    std::string looped = header(query.id, 0x8180, 1, 1) + q;
    size_t rdata_at = looped.size() + 12;
    looped += record(pointer(12), 5, pointer(static_cast<uint16_t>(rdata_at)));
    std::string forward = header(query.id, 0x8180, 1, 1) + q;
    forward += record(pointer(static_cast<uint16_t>(forward.size() + 20)), query.question.type,
                      address_bytes(query.question.type == kTypeA ? "6.6.6.6" : "::6"));
    std::string good =
        build_response(query, kRcodeNoError, {addr("192.0.2.44"), addr("2001:db8::44")}, 60);
    return std::vector<std::string>{looped, forward, good};
  });
  Resolver resolver(io_, config_with({server.address()}));
  Outcome out = resolve_and_wait(io_, resolver, "loop.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.44", "2001:db8::44"));
  EXPECT_EQ(replies, 2);
}

TEST_F(ResolverTest, NxDomainIsNoSuchHost) {
  FakeDnsServer server(io_, table({}));
  ResolverConfig config = config_with({server.address()});
  config.timeout_ms = kLongTimeoutMs;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "nope.example");
  EXPECT_EQ(out.error, "nope.example: no such host")
      << "NXDOMAIN is final: no waiting for a timeout";
  EXPECT_THAT(out.addresses, IsEmpty());
  EXPECT_EQ(server.queries.size(), 2u);
}

TEST_F(ResolverTest, ASilentServerTimesOutAfterEveryAttempt) {
  FakeDnsServer server(io_, silence());
  ResolverConfig config = config_with({server.address()});
  config.timeout_ms = 100;
  config.attempts = 3;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "slow.example");
  EXPECT_EQ(out.error, "slow.example: DNS servers did not answer");
  EXPECT_THAT(out.addresses, IsEmpty());
  EXPECT_EQ(server.queries.size(), 6u) << "an A and an AAAA query per attempt";
  EXPECT_GE(out.elapsed, 300ms);
}

TEST_F(ResolverTest, TheNextServerIsAskedWhenOneIsSilent) {
  FakeDnsServer silent(io_, silence());
  FakeDnsServer answering(io_, table({{"two.example", {"192.0.2.2"}}}));
  ResolverConfig config = config_with({silent.address(), answering.address()});
  config.timeout_ms = 150;
  config.attempts = 1;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "two.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.2"));
  EXPECT_EQ(silent.queries.size(), 2u);
  EXPECT_EQ(answering.queries.size(), 2u);
  EXPECT_GE(out.elapsed, 150ms);
}

TEST_F(ResolverTest, ServfailMovesOnAtOnce) {
  FakeDnsServer failing(io_, [](const Query& query, const std::string&) {
    return std::vector<std::string>{build_response(query, kRcodeServFail, {}, 0)};
  });
  FakeDnsServer answering(io_, table({{"sf.example", {"192.0.2.3", "2001:db8::3"}}}));
  ResolverConfig config = config_with({failing.address(), answering.address()});
  config.timeout_ms = kLongTimeoutMs;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "sf.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.3", "2001:db8::3"));
}

TEST_F(ResolverTest, OnlyServfailEverywhereSaysSo) {
  FakeDnsServer failing(io_, [](const Query& query, const std::string&) {
    return std::vector<std::string>{build_response(query, kRcodeServFail, {}, 0)};
  });
  ResolverConfig config = config_with({failing.address()});
  config.timeout_ms = kLongTimeoutMs;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "broken.example");
  EXPECT_THAT(out.error, HasSubstr("broken.example: DNS lookup failed"));
  EXPECT_THAT(out.error, HasSubstr("SERVFAIL"));
  EXPECT_EQ(failing.queries.size(), 4u);
}

TEST_F(ResolverTest, AClosedPortFailsFast) {
  // A port that stays closed while the test runs: a socket holds it, bound
  // and connected elsewhere, so that the kernel delivers it nothing from
  // the resolver and answers port unreachable (a port merely closed could
  // be taken by another program meanwhile).
  udp::socket holder(io_, udp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  holder.connect(udp::endpoint(asio::ip::make_address("127.0.0.1"), 9));
  const uint16_t port = holder.local_endpoint().port();
  ResolverConfig config = config_with({"127.0.0.1:" + std::to_string(port)});
  config.timeout_ms = kLongTimeoutMs;
  config.attempts = 1;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "closed.example");
  EXPECT_THAT(out.error, HasSubstr("closed.example: DNS lookup failed"));
  EXPECT_THAT(out.error, HasSubstr("127.0.0.1:" + std::to_string(port)));
}

TEST_F(ResolverTest, AnswersWithAWrongIdOrQuestionAreIgnored) {
  FakeDnsServer server(io_, [](const Query& query, const std::string&) {
    Query wrong_id = query;
    wrong_id.id = static_cast<uint16_t>(query.id ^ 0x5555);
    Query wrong_name = query;
    wrong_name.question.name = "other.example";
    Query wrong_type = query;
    wrong_type.question.type = query.question.type == kTypeA ? kTypeAAAA : kTypeA;
    std::vector<Address> bad = {addr("6.6.6.6"), addr("2001:db8::666")};
    return std::vector<std::string>{
        build_response(wrong_id, kRcodeNoError, bad, 60),
        build_response(wrong_name, kRcodeNoError, bad, 60),
        build_response(wrong_type, kRcodeNoError, bad, 60),
        build_response(wrong_id, kRcodeNxDomain, {}, 60),
        build_response(query, kRcodeNoError, {addr("192.0.2.5"), addr("2001:db8::5")}, 60)};
  });
  Resolver resolver(io_, config_with({server.address()}));
  Outcome out = resolve_and_wait(io_, resolver, "id.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.5", "2001:db8::5"));
}

TEST_F(ResolverTest, AnswersFromAnotherAddressAreIgnored) {
  // A forger on another port of 127.0.0.1 answers first, correctly in every
  // other respect; the real answer follows.
  udp::socket forger(io_, udp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::vector<udp::endpoint> clients;
  FakeDnsServer server(io_, [&](const Query& query, const std::string&) {
    std::string forged = build_response(query, kRcodeNoError, {addr("6.6.6.6"), addr("::6")}, 60);
    boost::system::error_code ignored;
    forger.connect(clients.back(), ignored);
    forger.send(asio::buffer(forged), 0, ignored);
    // The forged datagram arrives first (or is refused by the kernel).
    wait_delivered_or_refused(forger.native_handle(), clients.back().port());
    return std::vector<std::string>{
        build_response(query, kRcodeNoError, {addr("192.0.2.6"), addr("2001:db8::6")}, 60)};
  });
  server.on_query = [&](const udp::endpoint& client) { clients.push_back(client); };
  Resolver resolver(io_, config_with({server.address()}));
  Outcome out = resolve_and_wait(io_, resolver, "forged.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.6", "2001:db8::6"));
  EXPECT_EQ(clients.size(), 2u);
}

TEST_F(ResolverTest, OneFamilyAnsweringIsEnoughInTheEnd) {
  FakeDnsServer server(io_, [](const Query& query, const std::string&) {
    if (query.question.type != kTypeA) return std::vector<std::string>{};
    return std::vector<std::string>{build_response(query, kRcodeNoError, {addr("192.0.2.8")}, 60)};
  });
  ResolverConfig config = config_with({server.address()});
  config.timeout_ms = 100;
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "v4only.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.8"));
  // The AAAA query is asked again; the A query, answered, is not.
  EXPECT_EQ(server.queries.size(), 3u);
}

TEST_F(ResolverTest, QueryIdsAndSourcePortsAreRandom) {
  std::map<std::string, std::vector<std::string>> names;
  for (int i = 0; i < 8; ++i) names[numbered("r", i)] = {"192.0.2.9"};
  FakeDnsServer server(io_, table(names));
  Resolver resolver(io_, config_with({server.address()}));
  for (int i = 0; i < 8; ++i) {  // names of their own: each is a lookup, not the cache
    Outcome out = resolve_and_wait(io_, resolver, numbered("r", i));
    EXPECT_EQ(out.error, "");
  }
  std::set<uint16_t> ids, ports;
  std::vector<uint16_t> a_ids;
  for (size_t i = 0; i < server.queries.size(); ++i) {
    ids.insert(server.queries[i].id);
    ports.insert(server.clients[i].port());
    if (server.queries[i].question.type == kTypeA) a_ids.push_back(server.queries[i].id);
  }
  ASSERT_EQ(server.queries.size(), 16u);
  EXPECT_GE(ids.size(), 14u);
  EXPECT_GE(ports.size(), 4u) << "a fresh socket per lookup";
  int sequential = 0;
  for (size_t i = 1; i < a_ids.size(); ++i)
    if (static_cast<uint16_t>(a_ids[i] - a_ids[i - 1]) <= 2) ++sequential;
  EXPECT_LT(sequential, 3);
}

TEST_F(ResolverTest, IpLiteralsNeedNoQuery) {
  FakeDnsServer server(io_, table({}));
  Resolver resolver(io_, config_with({server.address()}));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "192.0.2.77").addresses, ElementsAre("192.0.2.77"));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "2001:db8::77").addresses,
              ElementsAre("2001:db8::77"));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "[::1]").addresses, ElementsAre("::1"));
  EXPECT_TRUE(server.queries.empty());
}

TEST_F(ResolverTest, InvalidNamesAreRefusedWithoutAQuery) {
  FakeDnsServer server(io_, table({}));
  Resolver resolver(io_, config_with({server.address()}));
  for (const std::string& name : std::vector<std::string>{"", ".", "exa mple.com", "a..b", "x/y",
                                                          std::string(64, 'a') + ".com"}) {
    Outcome out = resolve_and_wait(io_, resolver, name);
    EXPECT_THAT(out.error, HasSubstr("not a valid host name")) << name;
    EXPECT_THAT(out.addresses, IsEmpty());
  }
  EXPECT_TRUE(server.queries.empty());
}

TEST_F(ResolverTest, HostsFileWinsOverDns) {
  write_file(dir_ / "hosts",
             "# a comment\n"
             "127.0.0.1\tlocalhost\n"
             "10.1.2.3   MyHost.Test  alias.test   # trailing comment\n"
             "2001:db8::5 myhost.test\n"
             "fe80::1%eth0 scoped.test\n"
             "not-an-address other.test\n"
             "10.9.9.9 dotted.test.\n"
             "   \n");
  FakeDnsServer server(io_, table({{"myhost.test", {"192.0.2.100"}},
                                   {"scoped.test", {"192.0.2.101"}},
                                   {"dns.test", {"192.0.2.102"}}}));
  ResolverConfig config = config_with({server.address()});
  config.hosts_file = dir_ / "hosts";
  Resolver resolver(io_, config);
  EXPECT_THAT(resolve_and_wait(io_, resolver, "myhost.test").addresses,
              ElementsAre("10.1.2.3", "2001:db8::5"));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "ALIAS.Test.").addresses, ElementsAre("10.1.2.3"));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "dotted.test").addresses, ElementsAre("10.9.9.9"));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "localhost").addresses, ElementsAre("127.0.0.1"));
  EXPECT_TRUE(server.queries.empty());

  EXPECT_THAT(resolve_and_wait(io_, resolver, "dns.test").addresses, ElementsAre("192.0.2.102"));
  EXPECT_THAT(resolve_and_wait(io_, resolver, "scoped.test").addresses, ElementsAre("192.0.2.101"));
  EXPECT_EQ(server.queries.size(), 4u);

  // A changed file is read again.
  write_file(dir_ / "hosts", "10.4.4.4 myhost.test\n");
  EXPECT_THAT(resolve_and_wait(io_, resolver, "myhost.test").addresses, ElementsAre("10.4.4.4"));
  EXPECT_EQ(server.queries.size(), 4u);
}

TEST_F(ResolverTest, ServersComeFromResolvConf) {
  // resolv.conf has no syntax for a port: this needs 127.0.0.1:53.
  std::unique_ptr<FakeDnsServer> server;
  try {
    server = std::make_unique<FakeDnsServer>(io_, table({{"rc.example", {"192.0.2.53"}}}), 53);
  } catch (const boost::system::system_error& e) {
    GTEST_SKIP() << "cannot listen on 127.0.0.1:53: " << e.what();
  }
  write_file(dir_ / "resolv.conf",
             "# generated\n"
             "search corp.example\n"
             "nameserver 127.0.0.1 ; local\n"
             "options ndots:2\n");
  ResolverConfig config = config_with({});
  config.resolv_conf = dir_ / "resolv.conf";
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "rc.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.53"));
  EXPECT_EQ(server->queries.size(), 2u);
}

TEST_F(ResolverTest, NoNameserverAnywhereIsAnError) {
  write_file(dir_ / "resolv.conf", "# nameserver 192.0.2.1\nsearch example\nnameserver bogus\n");
  ResolverConfig config = config_with({});
  config.resolv_conf = dir_ / "resolv.conf";
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "x.example");
  EXPECT_THAT(out.error, HasSubstr("x.example: no DNS servers"));
  EXPECT_THAT(out.error, HasSubstr(config.resolv_conf));
}

TEST_F(ResolverTest, ConfiguredServersOverrideResolvConf) {
  FakeDnsServer server(io_, table({{"o.example", {"192.0.2.12"}}}));
  write_file(dir_ / "resolv.conf", "nameserver 192.0.2.1\n");  // never asked
  ResolverConfig config = config_with({server.address()});
  config.resolv_conf = dir_ / "resolv.conf";
  config.timeout_ms = kLongTimeoutMs;  // an ask of 192.0.2.1 would wait for it
  Resolver resolver(io_, config);
  Outcome out = resolve_and_wait(io_, resolver, "o.example");
  EXPECT_EQ(out.error, "");
  EXPECT_THAT(out.addresses, ElementsAre("192.0.2.12"));
}

TEST_F(ResolverTest, MalformedServersAreRefused) {
  for (const char* bad : {"", "dns.google", "1.2.3.4:0", "1.2.3.4:70000", "[::1", "1.2.3.4:x"})
    EXPECT_THROW(Resolver(io_, config_with({bad})), Error) << bad;
  EXPECT_NO_THROW(Resolver(io_, config_with({"127.0.0.1", "[::1]:5353", "::1", "1.2.3.4:53"})));
}

TEST_F(ResolverTest, DestroyingTheResolverDropsPendingLookups) {
  FakeDnsServer server(io_, silence());
  int calls = 0;
  {
    Resolver resolver(io_, config_with({server.address()}));
    resolver.resolve("pending.example", [&](std::vector<Address>, std::string) { ++calls; });
    resolver.resolve("10.0.0.1", [&](std::vector<Address>, std::string) { ++calls; });
    io_.run_for(50ms);
    EXPECT_EQ(calls, 1);  // the literal
  }
  io_.restart();
  io_.run_for(200ms);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(server.queries.size(), 2u);
}

// ---- the cache and the rate limit ------------------------------------------------

struct Looked {
  int calls = 0;
  Resolution result;
};

// Starts a lookup; the caller runs the loop.
std::shared_ptr<Looked> start_lookup(Resolver& resolver, const std::string& host) {
  auto looked = std::make_shared<Looked>();
  resolver.lookup(host, [looked](Resolution result) {
    ++looked->calls;
    looked->result = std::move(result);
  });
  return looked;
}

Resolution lookup_and_wait(asio::io_context& io, Resolver& resolver, const std::string& host) {
  auto looked = start_lookup(resolver, host);
  EXPECT_EQ(looked->calls, 0) << "called back from inside lookup()";
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (looked->calls == 0 && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(5ms);
  }
  EXPECT_EQ(looked->calls, 1) << host;
  return looked->result;
}

// Answers every name with 192.0.2.1 (and 2001:db8::1) with this TTL.
FakeDnsServer::Reply with_ttl(uint32_t ttl) {
  return [ttl](const Query& query, const std::string&) {
    return std::vector<std::string>{
        build_response(query, kRcodeNoError, {addr("192.0.2.1"), addr("2001:db8::1")}, ttl)};
  };
}

class ResolverCacheTest : public ResolverTest {
 protected:
  // A clock the test moves.
  ResolverConfig config_for(const FakeDnsServer& server) {
    ResolverConfig config = config_with({server.address()});
    config.now = [this] { return now_; };
    return config;
  }
  std::chrono::steady_clock::time_point now_ = std::chrono::steady_clock::now();
};

TEST_F(ResolverCacheTest, ACachedNameIsNotAskedAgain) {
  FakeDnsServer server(io_, with_ttl(60));
  Resolver resolver(io_, config_for(server));
  Resolution first = lookup_and_wait(io_, resolver, "same.example.test");
  EXPECT_EQ(first.source, Source::kUpstream);
  EXPECT_EQ(first.error, "");
  EXPECT_THAT(texts(first.addresses), ElementsAre("192.0.2.1", "2001:db8::1"));
  for (int i = 0; i < 20; ++i) {
    Resolution again =
        lookup_and_wait(io_, resolver, i % 2 ? "SAME.example.test." : "same.example.test");
    EXPECT_EQ(again.source, Source::kCached);
    EXPECT_THAT(texts(again.addresses), ElementsAre("192.0.2.1", "2001:db8::1"));
  }
  EXPECT_EQ(server.queries.size(), 2u) << "one lookup: an A and an AAAA query";
}

TEST_F(ResolverCacheTest, AnAnswerExpiresWithItsTtl) {
  FakeDnsServer server(io_, with_ttl(60));
  Resolver resolver(io_, config_for(server));
  EXPECT_EQ(lookup_and_wait(io_, resolver, "ttl.example").source, Source::kUpstream);
  now_ += 59s;
  EXPECT_EQ(lookup_and_wait(io_, resolver, "ttl.example").source, Source::kCached);
  now_ += 2s;
  EXPECT_EQ(lookup_and_wait(io_, resolver, "ttl.example").source, Source::kUpstream);
  EXPECT_EQ(server.queries.size(), 4u);
}

TEST_F(ResolverCacheTest, TheTtlIsHeldBetweenTheFloorAndTheCeiling) {
  FakeDnsServer zero(io_, with_ttl(0));
  Resolver short_lived(io_, config_for(zero));
  EXPECT_EQ(lookup_and_wait(io_, short_lived, "zero.example").source, Source::kUpstream);
  now_ += 4s;
  EXPECT_EQ(lookup_and_wait(io_, short_lived, "zero.example").source, Source::kCached)
      << "a TTL of 0 is kept for the 5 s floor";
  now_ += 2s;
  EXPECT_EQ(lookup_and_wait(io_, short_lived, "zero.example").source, Source::kUpstream);

  FakeDnsServer week(io_, with_ttl(7 * 24 * 3600));
  Resolver long_lived(io_, config_for(week));
  EXPECT_EQ(lookup_and_wait(io_, long_lived, "week.example").source, Source::kUpstream);
  now_ += 299s;
  EXPECT_EQ(lookup_and_wait(io_, long_lived, "week.example").source, Source::kCached);
  now_ += 2s;
  EXPECT_EQ(lookup_and_wait(io_, long_lived, "week.example").source, Source::kUpstream)
      << "a week's TTL is kept for the 300 s ceiling only";
}

TEST_F(ResolverCacheTest, TheTtlIsTheLeastOfTheChain) {
  // A CNAME with TTL 10 to addresses with TTL 3600: the answer is good for 10 s.
  FakeDnsServer server(io_, [](const Query& query, const std::string& raw) {
    std::string m = header(query.id, 0x8180, 1, 2) + raw.substr(12);
    m += record(pointer(12), 5, wire_name("target.example"), 10);
    m += record(wire_name("target.example"), query.question.type,
                address_bytes(query.question.type == kTypeA ? "192.0.2.7" : "2001:db8::7"), 3600);
    return std::vector<std::string>{m};
  });
  Resolver resolver(io_, config_for(server));
  EXPECT_EQ(lookup_and_wait(io_, resolver, "alias.example").error, "");
  now_ += 9s;
  EXPECT_EQ(lookup_and_wait(io_, resolver, "alias.example").source, Source::kCached);
  now_ += 2s;
  EXPECT_EQ(lookup_and_wait(io_, resolver, "alias.example").source, Source::kUpstream);
}

TEST_F(ResolverCacheTest, NxDomainIsCachedToo) {
  FakeDnsServer server(io_, table({}));
  Resolver resolver(io_, config_for(server));
  Resolution first = lookup_and_wait(io_, resolver, "gone.example");
  EXPECT_EQ(first.error, "gone.example: no such host");
  EXPECT_EQ(first.source, Source::kUpstream);
  size_t asked = server.queries.size();
  Resolution again = lookup_and_wait(io_, resolver, "gone.example");
  EXPECT_EQ(again.error, "gone.example: no such host");
  EXPECT_EQ(again.source, Source::kCached);
  EXPECT_EQ(server.queries.size(), asked);
  now_ += 31s;  // negative_ttl_s
  EXPECT_EQ(lookup_and_wait(io_, resolver, "gone.example").source, Source::kUpstream);
}

TEST_F(ResolverCacheTest, FailuresAreNotCached) {
  FakeDnsServer server(io_, silence());
  ResolverConfig config = config_for(server);
  config.timeout_ms = 30;
  config.attempts = 1;
  Resolver resolver(io_, config);
  EXPECT_THAT(lookup_and_wait(io_, resolver, "silent.example").error, HasSubstr("did not answer"));
  EXPECT_THAT(lookup_and_wait(io_, resolver, "silent.example").error, HasSubstr("did not answer"));
  EXPECT_EQ(server.queries.size(), 4u);
}

TEST_F(ResolverCacheTest, LookupsOfANameUnderWayShareOneQuery) {
  FakeDnsServer server(io_, with_ttl(60));
  Resolver resolver(io_, config_for(server));
  std::vector<std::shared_ptr<Looked>> all;
  for (int i = 0; i < 5; ++i) all.push_back(start_lookup(resolver, "busy.example"));
  for (int i = 0; i < 100 && all.back()->calls == 0; ++i) {
    io_.restart();
    io_.run_for(5ms);
  }
  int upstream = 0;
  for (const auto& looked : all) {
    EXPECT_EQ(looked->calls, 1);
    EXPECT_THAT(texts(looked->result.addresses), ElementsAre("192.0.2.1", "2001:db8::1"));
    if (looked->result.source == Source::kUpstream) ++upstream;
  }
  EXPECT_EQ(upstream, 1);
  EXPECT_EQ(server.queries.size(), 2u);
}

TEST_F(ResolverCacheTest, TheCacheHoldsAtMostItsEntriesDroppingTheLeastRecent) {
  FakeDnsServer server(io_, with_ttl(60));
  ResolverConfig config = config_for(server);
  config.cache_entries = 2;
  Resolver resolver(io_, config);
  lookup_and_wait(io_, resolver, "a.example");
  lookup_and_wait(io_, resolver, "b.example");
  EXPECT_EQ(lookup_and_wait(io_, resolver, "a.example").source, Source::kCached);  // a: recent
  lookup_and_wait(io_, resolver, "c.example");                                     // drops b
  EXPECT_EQ(lookup_and_wait(io_, resolver, "a.example").source, Source::kCached);
  EXPECT_EQ(lookup_and_wait(io_, resolver, "c.example").source, Source::kCached);
  EXPECT_EQ(lookup_and_wait(io_, resolver, "b.example").source, Source::kUpstream);
}

TEST_F(ResolverCacheTest, TheRateLimitRefusesLookupsOverItWithoutAQuery) {
  FakeDnsServer server(io_, with_ttl(60));
  ResolverConfig config = config_for(server);
  config.query_rate = 10;
  config.query_burst = 5;
  Resolver resolver(io_, config);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(lookup_and_wait(io_, resolver, numbered("n", i)).source, Source::kUpstream)
        << "the burst";
  Resolution over = lookup_and_wait(io_, resolver, "n5.example");
  EXPECT_EQ(over.source, Source::kRateLimited);
  EXPECT_EQ(over.error, "n5.example: too many DNS lookups (over 10 a second)");
  EXPECT_THAT(over.addresses, IsEmpty());
  EXPECT_EQ(server.queries.size(), 10u);
  // Cached names are still answered: the limit is on what goes upstream.
  EXPECT_EQ(lookup_and_wait(io_, resolver, "n0.example").source, Source::kCached);
  // 10 a second: a tenth of a second later, one more.
  now_ += 100ms;
  EXPECT_EQ(lookup_and_wait(io_, resolver, "n6.example").source, Source::kUpstream);
  EXPECT_EQ(lookup_and_wait(io_, resolver, "n7.example").source, Source::kRateLimited);
  // A long pause refills the bucket up to its burst, no more.
  now_ += 1h;
  int allowed = 0;
  for (int i = 0; i < 20; ++i)
    if (lookup_and_wait(io_, resolver, numbered("m", i)).source == Source::kUpstream) ++allowed;
  EXPECT_EQ(allowed, 5);
  EXPECT_EQ(server.queries.size(), 2u * (5 + 1 + 5));
}

TEST_F(ResolverCacheTest, ARateOfZeroIsNoLimit) {
  FakeDnsServer server(io_, with_ttl(60));
  ResolverConfig config = config_for(server);
  config.query_rate = 0;
  config.query_burst = 1;
  Resolver resolver(io_, config);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(lookup_and_wait(io_, resolver, numbered("z", i)).source, Source::kUpstream);
}

TEST_F(ResolverCacheTest, TheHostsFileAndLiteralsAreLocal) {
  write_file(dir_ / "hosts", "10.1.2.3 local.test\n");
  FakeDnsServer server(io_, with_ttl(60));
  ResolverConfig config = config_for(server);
  config.hosts_file = dir_ / "hosts";
  config.query_rate = 1;
  config.query_burst = 1;
  Resolver resolver(io_, config);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lookup_and_wait(io_, resolver, "local.test").source, Source::kLocal);
    EXPECT_EQ(lookup_and_wait(io_, resolver, "192.0.2.5").source, Source::kLocal);
  }
  EXPECT_TRUE(server.queries.empty());
  EXPECT_STREQ(source_name(Source::kRateLimited), "rate_limited");
  EXPECT_STREQ(source_name(Source::kUpstream), "upstream");
}

// ---- the proxy's DNS stub and its audit lines ---------------------------------------

// A Proxy serving a DNS stub and a proxy listener on 127.0.0.1, with the
// rules of a policy that allows *.example.test, resolving through upstream.
class StubTest : public ::testing::Test {
 protected:
  // serve: with the listener and the UDP socket; without, a proxy as a
  // micro-VM's guest has it (init_pid 0, fds handed over only).
  void start(ResolverConfig config, bool serve = true) {
    Proxy::Options options;
    options.sandbox = "stub-test";
    options.init_pid = serve ? ::getpid() : 0;
    options.audit = [this](const std::string& line) { lines_.push_back(line); };
    config.hosts_file = dir_ / "hosts-missing";
    proxy_ = std::make_unique<Proxy>(io_, options, config);
    proxy_->set_rules(std::make_shared<NetworkRules>(supervisor::network_rules(policy::parse(
        "version = 1\n[network_policies.t]\nendpoints = [ { host = \"*.example.test\", port = 443, "
        "allowed_ips = [\"192.0.2.0/24\", \"2001:db8::/32\"] } ]\n",
        "test.toml"))));
    if (!serve) return;
    int dns = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof stub_;
    EXPECT_EQ(::bind(dns, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
    EXPECT_EQ(::getsockname(dns, reinterpret_cast<sockaddr*>(&stub_), &length), 0);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
    EXPECT_EQ(::listen(listener, 16), 0);
    length = sizeof proxy_address_;
    EXPECT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&proxy_address_), &length), 0);
    proxy_->serve(UniqueFd(listener), UniqueFd(dns), UniqueFd());
  }

  // Sends one datagram to the stub; its answer, or nullopt after WAIT.
  std::optional<std::string> ask(const std::string& message,
                                 std::chrono::milliseconds wait = 30000ms) {
    int client = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ::sendto(client, message.data(), message.size(), 0, reinterpret_cast<sockaddr*>(&stub_),
             sizeof stub_);
    std::optional<std::string> answer;
    auto deadline = std::chrono::steady_clock::now() + wait;
    while (!answer && std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(2ms);
      char buffer[1500];
      ssize_t n = ::recv(client, buffer, sizeof buffer, 0);
      if (n > 0) answer = std::string(buffer, static_cast<size_t>(n));
    }
    ::close(client);
    return answer;
  }
  std::optional<std::string> ask(const std::string& name, uint16_t type) {
    return ask(query_message(static_cast<uint16_t>(++id_), name, type));
  }
  // A guest's DNS stream to the stub: the test's end of a socket pair whose
  // other end the proxy serves.
  UniqueFd open_stream() {
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair), 0);
    proxy_->serve_dns_stream(UniqueFd(pair[1]));
    return UniqueFd(pair[0]);
  }
  static std::string framed(const std::string& message) {
    std::string out;
    put16(out, static_cast<uint16_t>(message.size()));
    return out + message;
  }
  void send_all(int fd, const std::string& bytes) {
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Runs the loop until `count` whole answers came on the stream (each
  // without its length), or its end, or 30 s; *ended: whether it ended.
  std::vector<std::string> answers_on(int fd, size_t count, bool* ended = nullptr,
                                      std::chrono::milliseconds wait = 30000ms) {
    std::vector<std::string> answers;
    std::string in;
    auto deadline = std::chrono::steady_clock::now() + wait;
    while (answers.size() < count && std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(2ms);
      char buffer[4096];
      ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n == 0) {
        if (ended) *ended = true;
        break;
      }
      if (n > 0) in.append(buffer, static_cast<size_t>(n));
      while (in.size() >= 2 && in.size() >= 2u + get16(in, 0)) {
        answers.push_back(in.substr(2, get16(in, 0)));
        in.erase(0, 2 + answers.back().size());
      }
    }
    EXPECT_EQ(in, "") << "a partial answer";
    return answers;
  }
  static int rcode(const std::optional<std::string>& answer) {
    return answer ? static_cast<uint8_t>((*answer)[3]) & 0x0F : -1;
  }
  nlohmann::json line(size_t index) {
    EXPECT_LT(index, lines_.size());
    if (index >= lines_.size()) return {};
    return nlohmann::json::parse(lines_[index]);  // throws when not valid JSON or UTF-8
  }

  asio::io_context io_;
  TempDir dir_;
  std::unique_ptr<Proxy> proxy_;
  sockaddr_in stub_{}, proxy_address_{};
  std::vector<std::string> lines_;
  int id_ = 0;
};

TEST_F(StubTest, UpstreamCachedAndRateLimitedQueriesAreAuditedWithoutFloodingTheLog) {
  FakeDnsServer upstream(io_, with_ttl(60));
  ResolverConfig config;
  config.servers = {upstream.address()};
  config.query_rate = 1;
  config.query_burst = 2;
  // The rate's clock stands still: no token comes back however slowly the
  // queries below go.
  config.now = [frozen = std::chrono::steady_clock::now()] { return frozen; };
  start(config);

  EXPECT_EQ(rcode(ask("a.example.test", kTypeA)), kRcodeNoError);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(line(0)["kind"], "dns");
  EXPECT_EQ(line(0)["host"], "a.example.test");
  EXPECT_EQ(line(0)["qtype"], "A");
  EXPECT_EQ(line(0)["decision"], "upstream");
  EXPECT_EQ(line(0)["answers"], 1);
  EXPECT_EQ(line(0)["sandbox"], "stub-test");
  EXPECT_EQ(upstream.queries.size(), 2u);

  EXPECT_EQ(rcode(ask("a.example.test", kTypeAAAA)), kRcodeNoError);
  EXPECT_EQ(line(1)["decision"], "cached");
  EXPECT_EQ(line(1)["qtype"], "AAAA");
  EXPECT_EQ(line(1)["answers"], 1);
  EXPECT_EQ(upstream.queries.size(), 2u) << "the cache answered";

  EXPECT_EQ(rcode(ask("b.example.test", kTypeA)), kRcodeNoError);  // the burst's second token
  EXPECT_EQ(line(2)["decision"], "upstream");

  // Over the limit: refused here, nothing sent, one line for the lot (a
  // line a second, by the real clock: a slow machine may take longer).
  auto start_refused = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(rcode(ask(numbered("x", i) + ".test", kTypeA)), kRcodeRefused);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::steady_clock::now() - start_refused)
                           .count();
  EXPECT_EQ(upstream.queries.size(), 4u);
  ASSERT_GE(lines_.size(), 4u);
  ASSERT_LE(lines_.size(), 4u + static_cast<size_t>(seconds))
      << "one rate_limited line a second, not one a query";
  const size_t deny_line = lines_.size();
  EXPECT_EQ(line(3)["decision"], "rate_limited");
  EXPECT_EQ(line(3)["host"], "x0.example.test");
  EXPECT_EQ(line(3)["refused"], 1);
  EXPECT_THAT(line(3)["reason"].get<std::string>(), HasSubstr("too many DNS lookups"));
  // Names no rule names are refused here as before, and never asked.
  EXPECT_EQ(rcode(ask("other.org", kTypeA)), kRcodeNxDomain);
  EXPECT_EQ(line(deny_line)["decision"], "deny");
  EXPECT_EQ(upstream.queries.size(), 4u);
}

TEST_F(StubTest, ANameOfBytesThatAreNotAHostNameIsDroppedNotAsked) {
  FakeDnsServer upstream(io_, with_ttl(60));
  ResolverConfig config;
  config.servers = {upstream.address()};
  start(config);
  std::string bad =
      header(7, 0x0100, 1) +
      question(std::string("\x02\xff\xfe\x07") + "example\x04test" + std::string(1, '\0'), kTypeA);
  EXPECT_EQ(ask(bad, 300ms), std::nullopt);
  EXPECT_TRUE(upstream.queries.empty());
  EXPECT_TRUE(lines_.empty());
  EXPECT_EQ(rcode(ask("after.example.test", kTypeA)), kRcodeNoError) << "the stub still serves";
}

TEST_F(StubTest, AConnectToAHostThatIsNotUtf8IsAuditedAsValidJson) {
  ResolverConfig config;
  config.servers = {"127.0.0.1:9"};
  start(config);
  for (const std::string& request :
       {std::string("CONNECT \xff\xfe.example:443 HTTP/1.1\r\n\r\n"),
        std::string("GET http://\xff.example.test/ HTTP/1.1\r\nHost: \xfe\xff\r\n\r\n"),
        "CONNECT " + std::string(16000, '\xff') + ".example:443 HTTP/1.1\r\n\r\n"}) {
    size_t before = lines_.size();
    int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(
        ::connect(client, reinterpret_cast<sockaddr*>(&proxy_address_), sizeof proxy_address_), 0);
    ASSERT_EQ(::send(client, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::string reply;
    auto deadline = std::chrono::steady_clock::now() + 2s;
    while (reply.find("\r\n\r\n") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(2ms);  // a handler that threw would end the test here
      char buffer[4096];
      ssize_t n = ::recv(client, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n > 0) reply.append(buffer, static_cast<size_t>(n));
    }
    ::close(client);
    EXPECT_THAT(reply, HasSubstr(" 403 "));
    ASSERT_EQ(lines_.size(), before + 1);
    nlohmann::json audit = line(before);
    EXPECT_EQ(audit["decision"], "deny");
    EXPECT_THAT(audit["host"].get<std::string>(), HasSubstr("\xEF\xBF\xBD"));  // U+FFFD
    EXPECT_LT(lines_.back().size(), 4096u) << "the host is clipped";
  }
}

// ---- a guest's DNS stream ----------------------------------------------------------

TEST_F(StubTest, AStreamCarriesManyQueriesEachAnsweredAsTheStubAnswersADatagram) {
  FakeDnsServer upstream(io_, with_ttl(60));
  ResolverConfig config;
  config.servers = {upstream.address()};
  start(config, /*serve=*/false);
  UniqueFd stream = open_stream();
  // Three queries in one write: one a rule names, one no rule names, and
  // localhost; a fourth split across writes, its length apart from its bytes.
  send_all(stream.get(), framed(query_message(1, "a.example.test", kTypeA)) +
                             framed(query_message(2, "other.org", kTypeA)) +
                             framed(query_message(3, "localhost", kTypeA)));
  const std::string fourth = framed(query_message(4, "b.example.test", kTypeAAAA));
  send_all(stream.get(), fourth.substr(0, 1));
  answers_on(stream.get(), 0, nullptr, 50ms);
  send_all(stream.get(), fourth.substr(1, 7));
  answers_on(stream.get(), 0, nullptr, 50ms);
  send_all(stream.get(), fourth.substr(8));
  std::vector<std::string> answers = answers_on(stream.get(), 4);
  ASSERT_EQ(answers.size(), 4u);
  std::map<uint16_t, std::string> by_id;
  for (const auto& answer : answers) by_id[get16(answer, 0)] = answer;
  ASSERT_EQ(by_id.size(), 4u) << "one answer a query";
  EXPECT_EQ(rcode(by_id[1]), kRcodeNoError);
  EXPECT_EQ(get16(by_id[1], 6), 1) << "one A record";
  EXPECT_EQ(rcode(by_id[2]), kRcodeNxDomain);
  EXPECT_EQ(rcode(by_id[3]), kRcodeNoError);
  EXPECT_EQ(rcode(by_id[4]), kRcodeNoError);
  EXPECT_EQ(get16(by_id[4], 6), 1) << "one AAAA record";
  // Only the names a rule names went upstream, and each is audited.
  for (const auto& q : upstream.queries) EXPECT_THAT(q.question.name, HasSubstr(".example.test"));
  bool denied = false, upstreamed = false;
  for (size_t i = 0; i < lines_.size(); ++i) {
    denied = denied || (line(i)["host"] == "other.org" && line(i)["decision"] == "deny");
    upstreamed = upstreamed || (line(i)["host"] == "a.example.test" && line(i)["kind"] == "dns");
  }
  EXPECT_TRUE(denied) << "other.org's refusal is audited";
  EXPECT_TRUE(upstreamed) << "a.example.test's lookup is audited";
  // The guest ends its side: the stub ends the stream, nothing left unsaid.
  ::shutdown(stream.get(), SHUT_WR);
  bool ended = false;
  EXPECT_TRUE(answers_on(stream.get(), 1, &ended).empty());
  EXPECT_TRUE(ended);
}

TEST_F(StubTest, AStreamEndsAnswersFirst) {
  FakeDnsServer upstream(io_, with_ttl(60));
  ResolverConfig config;
  config.servers = {upstream.address()};
  start(config, /*serve=*/false);
  UniqueFd stream = open_stream();
  // The last query and the end of the guest's side together: the answer
  // still comes, then the end.
  send_all(stream.get(), framed(query_message(9, "c.example.test", kTypeA)));
  ::shutdown(stream.get(), SHUT_WR);
  bool ended = false;
  std::vector<std::string> answers = answers_on(stream.get(), 2, &ended);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(get16(answers[0], 0), 9);
  EXPECT_EQ(rcode(answers[0]), kRcodeNoError);
  EXPECT_TRUE(ended);
}

TEST_F(StubTest, AnOversizedOrEmptyMessageClosesTheStreamWithAnAuditLine) {
  ResolverConfig config;
  config.servers = {"127.0.0.1:9"};
  start(config, /*serve=*/false);
  for (uint16_t length : {uint16_t{1501}, uint16_t{0xFFFF}, uint16_t{0}}) {
    lines_.clear();
    UniqueFd stream = open_stream();
    std::string bytes;
    put16(bytes, length);
    send_all(stream.get(), bytes + std::string(100, 'x'));
    bool ended = false;
    EXPECT_TRUE(answers_on(stream.get(), 1, &ended).empty());
    EXPECT_TRUE(ended) << length;
    ASSERT_EQ(lines_.size(), 1u) << length;
    EXPECT_EQ(line(0)["kind"], "dns");
    EXPECT_EQ(line(0)["decision"], "deny");
    EXPECT_THAT(line(0)["reason"].get<std::string>(),
                HasSubstr("a DNS message of " + std::to_string(length) + " bytes"));
  }
  // A message of the longest size is read (and, not being a query, dropped
  // as the UDP stub drops it): the stream stays open.
  UniqueFd stream = open_stream();
  std::string bytes;
  put16(bytes, 1500);
  send_all(stream.get(), bytes + std::string(1500, '\0'));
  bool ended = false;
  EXPECT_TRUE(answers_on(stream.get(), 1, &ended, 200ms).empty());
  EXPECT_FALSE(ended);
  send_all(stream.get(), framed(query_message(5, "localhost", kTypeA)));
  EXPECT_EQ(answers_on(stream.get(), 1).size(), 1u) << "the stream still serves";
}

TEST_F(StubTest, StreamsBeyondTheLimitAreRefusedAndCloseEndsTheRest) {
  ResolverConfig config;
  config.servers = {"127.0.0.1:9"};
  start(config, /*serve=*/false);
  std::vector<UniqueFd> held;
  for (int i = 0; i < 16; ++i) held.push_back(open_stream());
  UniqueFd extra = open_stream();
  bool ended = false;
  EXPECT_TRUE(answers_on(extra.get(), 1, &ended).empty());
  EXPECT_TRUE(ended) << "the 17th stream is closed";
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_THAT(line(0)["reason"].get<std::string>(), HasSubstr("too many DNS streams"));
  send_all(held[0].get(), framed(query_message(6, "localhost", kTypeA)));
  EXPECT_EQ(answers_on(held[0].get(), 1).size(), 1u) << "the held ones are served";
  proxy_->close();
  for (auto& fd : held) {
    ended = false;
    answers_on(fd.get(), 1, &ended);
    EXPECT_TRUE(ended) << "open after close()";
  }
}

// ---- ResolverConfig::from_environment -------------------------------------------

TEST(ResolverConfigTest, DefaultsWithoutTheEnvironment) {
  ScopedEnv hosts("OPENSHELL_HOSTS_FILE", nullptr);
  ScopedEnv resolv("OPENSHELL_RESOLV_CONF", nullptr);
  ScopedEnv servers("OPENSHELL_DNS_SERVERS", nullptr);
  ResolverConfig config = ResolverConfig::from_environment();
  EXPECT_EQ(config.hosts_file, "/etc/hosts");
  EXPECT_EQ(config.resolv_conf, "/etc/resolv.conf");
  EXPECT_THAT(config.servers, IsEmpty());
  EXPECT_EQ(config.timeout_ms, 2000);
  EXPECT_EQ(config.attempts, 2);
}

TEST(ResolverConfigTest, CacheAndRateLimitDefaults) {
  ScopedEnv rate("OPENSHELL_DNS_QUERY_RATE", nullptr);
  ScopedEnv burst("OPENSHELL_DNS_QUERY_BURST", nullptr);
  ResolverConfig config = ResolverConfig::from_environment();
  EXPECT_EQ(config.cache_entries, 4096u);
  EXPECT_EQ(config.min_ttl_s, 5u);
  EXPECT_EQ(config.max_ttl_s, 300u);
  EXPECT_EQ(config.query_rate, 20);
  EXPECT_EQ(config.query_burst, 50);
}

TEST(ResolverConfigTest, TheRateLimitComesFromTheEnvironment) {
  {
    ScopedEnv rate("OPENSHELL_DNS_QUERY_RATE", "2.5");
    ScopedEnv burst("OPENSHELL_DNS_QUERY_BURST", "7");
    ResolverConfig config = ResolverConfig::from_environment();
    EXPECT_EQ(config.query_rate, 2.5);
    EXPECT_EQ(config.query_burst, 7);
  }
  {
    ScopedEnv rate("OPENSHELL_DNS_QUERY_RATE", "0");
    EXPECT_EQ(ResolverConfig::from_environment().query_rate, 0);
  }
  for (const char* bad : {"x", "-1", "nan", "inf", "5/s", "1e999"}) {
    ScopedEnv rate("OPENSHELL_DNS_QUERY_RATE", bad);
    try {
      ResolverConfig::from_environment();
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("OPENSHELL_DNS_QUERY_RATE=") + bad +
                                           ": not a number of DNS lookups a second (like 20; 0 "
                                           "for no limit)");
    }
  }
  for (const char* bad : {"0", "0.5", "many"}) {
    ScopedEnv burst("OPENSHELL_DNS_QUERY_BURST", bad);
    EXPECT_THROW(ResolverConfig::from_environment(), Error) << bad;
  }
}

TEST(ResolverConfigTest, TheEnvironmentOverrides) {
  ScopedEnv hosts("OPENSHELL_HOSTS_FILE", "/tmp/h");
  ScopedEnv resolv("OPENSHELL_RESOLV_CONF", "/tmp/r");
  ScopedEnv servers("OPENSHELL_DNS_SERVERS", "192.0.2.1, 192.0.2.2:5353,,[::1]:53");
  ResolverConfig config = ResolverConfig::from_environment();
  EXPECT_EQ(config.hosts_file, "/tmp/h");
  EXPECT_EQ(config.resolv_conf, "/tmp/r");
  EXPECT_THAT(config.servers, ElementsAre("192.0.2.1", "192.0.2.2:5353", "[::1]:53"));
}

}  // namespace
}  // namespace openshell::egress
