// The DNS wire format (RFC 1035): queries and responses parsed and built.
// The stub parses queries and builds answers; the resolver the reverse.
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/text.h"
#include "net/dns_internal.h"

namespace openshell::net::dns {
namespace detail {
namespace {

constexpr size_t kHeaderSize = 12;
constexpr size_t kMaxLabel = 63;
constexpr size_t kMaxNameOctets = 255;  // on the wire: length octets and the final zero
constexpr size_t kMaxUdpMessage = 512;  // RFC 1035 without EDNS
constexpr uint16_t kTypeCname = 5;
constexpr uint16_t kFlagResponse = 0x8000;
constexpr uint16_t kFlagRecursionDesired = 0x0100;
constexpr uint16_t kFlagRecursionAvailable = 0x0080;
constexpr uint16_t kPointerToQuestion = 0xC000 | kHeaderSize;
constexpr int kMaxCnameHops = 16;

uint16_t get16(std::string_view m, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(m[at]) << 8) |
                               static_cast<uint8_t>(m[at + 1]));
}

uint32_t get32(std::string_view m, size_t at) {
  return (static_cast<uint32_t>(get16(m, at)) << 16) | get16(m, at + 2);
}

void put16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value >> 8));
  out.push_back(static_cast<char>(value & 0xFF));
}

void put32(std::string& out, uint32_t value) {
  put16(out, static_cast<uint16_t>(value >> 16));
  put16(out, static_cast<uint16_t>(value & 0xFFFF));
}

// Host names only: letters, digits, '-' and '_' (service labels). Anything
// else, a '.' inside a label above all, would make the dotted text of a name
// ambiguous, and the dotted text is what the egress rules compare.
bool is_host_name_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

using text::lower;

// Reads the name at *offset and moves *offset past it. Queries carry no
// compression pointers; in responses a pointer must point before the part
// of the name that holds it, so following pointers always ends. plain is
// false when a label holds a character outside is_host_name_char (the name
// then matches nothing, but the message is still well formed).
std::optional<std::string> read_name(std::string_view message, size_t* offset, bool allow_pointers,
                                     bool* plain) {
  std::string name;
  size_t octets = 0;
  size_t at = *offset;
  size_t segment_start = at;
  bool jumped = false;
  *plain = true;
  for (;;) {
    if (at >= message.size()) return std::nullopt;
    uint8_t length = static_cast<uint8_t>(message[at]);
    if ((length & 0xC0) == 0xC0) {
      if (!allow_pointers || at + 1 >= message.size()) return std::nullopt;
      size_t target = get16(message, at) & 0x3FFF;
      if (target >= segment_start) return std::nullopt;
      if (!jumped) *offset = at + 2;
      jumped = true;
      segment_start = at = target;
      continue;
    }
    if (length & 0xC0) return std::nullopt;  // 0x40 and 0x80: obsolete label types
    octets += 1 + length;
    if (octets > kMaxNameOctets) return std::nullopt;
    if (length == 0) {
      if (!jumped) *offset = at + 1;
      return name;
    }
    if (length > kMaxLabel || at + 1 + length > message.size()) return std::nullopt;
    if (!name.empty()) name.push_back('.');
    for (size_t i = at + 1; i <= at + length; ++i) {
      if (!is_host_name_char(static_cast<unsigned char>(message[i]))) *plain = false;
      name.push_back(lower(message[i]));
    }
    at += 1 + length;
  }
}

// Appends name in wire form; false when it is not a valid host name.
bool write_name(std::string& out, std::string_view name) {
  if (name.empty()) {  // the root
    out.push_back('\0');
    return true;
  }
  if (name.size() > kMaxNameOctets - 2) return false;
  for (const std::string& label : text::split(name, '.')) {
    if (label.empty() || label.size() > kMaxLabel) return false;
    for (char c : label)
      if (!is_host_name_char(static_cast<unsigned char>(c))) return false;
    out.push_back(static_cast<char>(label.size()));
    out += label;
  }
  out.push_back('\0');
  return true;
}

size_t address_length(int family) { return family == AF_INET ? 4 : 16; }

Address address_from_bytes(int family, const char* bytes) {
  Address address;
  address.family = family;
  std::memcpy(address.bytes, bytes, address_length(family));
  return address;
}

}  // namespace

// Lower case, no trailing dot; nullopt when not a host name.
std::optional<std::string> normalize_host_name(std::string_view host) {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  if (host.empty()) return std::nullopt;
  std::string name;
  for (char c : host) name.push_back(lower(c));
  std::string probe;
  if (!write_name(probe, name)) return std::nullopt;
  return name;
}

std::string rcode_name(uint8_t rcode) {
  switch (rcode) {
    case kRcodeFormErr:
      return "FORMERR";
    case kRcodeServFail:
      return "SERVFAIL";
    case kRcodeNxDomain:
      return "NXDOMAIN";
    case kRcodeNotImp:
      return "NOTIMP";
    case kRcodeRefused:
      return "REFUSED";
    default:
      return "rcode " + std::to_string(rcode);
  }
}

std::optional<Response> parse_response(std::string_view message) {
  if (message.size() < kHeaderSize) return std::nullopt;
  Response response;
  response.id = get16(message, 0);
  response.flags = get16(message, 2);
  if (!(response.flags & kFlagResponse) || ((response.flags >> 11) & 0x0F) != 0)
    return std::nullopt;
  if (get16(message, 4) != 1) return std::nullopt;
  uint16_t answer_count = get16(message, 6);
  size_t at = kHeaderSize;
  bool plain = true;
  auto name = read_name(message, &at, true, &plain);
  if (!name || !plain || at + 4 > message.size()) return std::nullopt;
  response.question = {*name, get16(message, at), get16(message, at + 2)};
  at += 4;
  for (uint16_t i = 0; i < answer_count; ++i) {
    Record record;
    auto owner = read_name(message, &at, true, &plain);
    if (!owner || at + 10 > message.size()) return std::nullopt;
    if (plain) record.name = *owner;
    record.type = get16(message, at);
    record.klass = get16(message, at + 2);
    record.ttl = get32(message, at + 4);
    size_t length = get16(message, at + 8);
    at += 10;
    if (at + length > message.size()) return std::nullopt;
    if (record.klass == kClassIN && (record.type == kTypeA || record.type == kTypeAAAA)) {
      if (length != address_length(record.type == kTypeA ? AF_INET : AF_INET6)) return std::nullopt;
      record.data.assign(message.substr(at, length));
    } else if (record.klass == kClassIN && record.type == kTypeCname) {
      size_t target_at = at;
      auto target = read_name(message, &target_at, true, &plain);
      if (!target || target_at != at + length) return std::nullopt;
      if (plain) record.data = *target;
    }
    at += length;
    response.answers.push_back(std::move(record));
  }
  return response;
}

std::vector<Address> addresses_for(const std::vector<Record>& answers, std::string name,
                                   uint16_t type, uint32_t* ttl) {
  int family = type == kTypeA ? AF_INET : AF_INET6;
  uint32_t least = UINT32_MAX;
  for (int hop = 0; hop <= kMaxCnameHops && !name.empty(); ++hop) {
    std::vector<Address> addresses;
    std::string alias;
    uint32_t alias_ttl = UINT32_MAX;
    for (const Record& record : answers) {
      if (record.name != name || record.klass != kClassIN) continue;
      if (record.type == type) {
        Address address = address_from_bytes(family, record.data.data());
        least = std::min(least, record.ttl);
        if (std::find(addresses.begin(), addresses.end(), address) == addresses.end())
          addresses.push_back(address);
      } else if (record.type == kTypeCname && alias.empty()) {
        alias = record.data;
        alias_ttl = record.ttl;
      }
    }
    if (!addresses.empty() || alias.empty()) {
      *ttl = least;
      return addresses;
    }
    least = std::min(least, alias_ttl);
    name = alias;
  }
  *ttl = least;
  return {};
}

std::string build_query(uint16_t id, const std::string& name, uint16_t type) {
  std::string out;
  put16(out, id);
  put16(out, kFlagRecursionDesired);
  put16(out, 1);  // one question, no other records
  put16(out, 0);
  put16(out, 0);
  put16(out, 0);
  write_name(out, name);
  put16(out, type);
  put16(out, kClassIN);
  return out;
}

}  // namespace detail

using namespace detail;

std::optional<Query> parse_query(std::string_view message) {
  if (message.size() < kHeaderSize) return std::nullopt;
  uint16_t flags = get16(message, 2);
  if (flags & kFlagResponse) return std::nullopt;
  if (((flags >> 11) & 0x0F) != 0) return std::nullopt;  // only standard queries
  if (get16(message, 4) != 1) return std::nullopt;
  size_t at = kHeaderSize;
  bool plain = true;
  auto name = read_name(message, &at, false, &plain);
  if (!name || !plain || at + 4 > message.size()) return std::nullopt;
  Query query;
  query.id = get16(message, 0);
  query.recursion_desired = flags & kFlagRecursionDesired;
  query.question = {*name, get16(message, at), get16(message, at + 2)};
  return query;
}

std::string build_response(const Query& query, uint8_t rcode, const std::vector<Address>& answers,
                           uint32_t ttl) {
  std::string question;
  bool question_ok = write_name(question, query.question.name);
  if (!question_ok) rcode = kRcodeFormErr;
  put16(question, query.question.type);
  put16(question, query.question.klass);

  std::string records;
  uint16_t count = 0;
  int family = query.question.type == kTypeA ? AF_INET : AF_INET6;
  bool answerable = question_ok && rcode == kRcodeNoError && query.question.klass == kClassIN &&
                    (query.question.type == kTypeA || query.question.type == kTypeAAAA);
  for (const Address& address : answers) {
    if (!answerable || address.family != family) continue;
    size_t length = address_length(family);
    if (kHeaderSize + question.size() + records.size() + 12 + length > kMaxUdpMessage) break;
    put16(records, kPointerToQuestion);
    put16(records, query.question.type);
    put16(records, kClassIN);
    put32(records, ttl);
    put16(records, static_cast<uint16_t>(length));
    records.append(reinterpret_cast<const char*>(address.bytes), length);
    ++count;
  }

  std::string out;
  put16(out, query.id);
  uint16_t flags = kFlagResponse | kFlagRecursionAvailable | (rcode & 0x0F);
  if (query.recursion_desired) flags |= kFlagRecursionDesired;
  put16(out, flags);
  put16(out, question_ok ? 1 : 0);
  put16(out, count);
  put16(out, 0);
  put16(out, 0);
  if (question_ok) out += question;
  out += records;
  return out;
}

}  // namespace openshell::net::dns
