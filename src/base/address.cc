#include "base/address.h"

#include <arpa/inet.h>

#include <cstring>

#include "base/text.h"

namespace openshell {

namespace {

int bits_of(int family) { return family == AF_INET ? 32 : 128; }

// Whether the first `prefix` bits of a and b agree.
bool same_prefix(const uint8_t* a, const uint8_t* b, int prefix) {
  int whole = prefix / 8;
  if (std::memcmp(a, b, whole) != 0) return false;
  int rest = prefix % 8;
  if (rest == 0) return true;
  auto mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace

// inet_pton's forms only: IPv4 as exactly four decimal parts 0-255 without
// leading zeros (so "010.1.1.1", "0x7f.1", "1.2.3" and "2130706433" are not
// addresses), IPv6 as RFC 4291 text, optionally in brackets; no zone ids.
std::optional<Address> Address::parse(std::string_view text) {
  if (text.find('\0') != std::string_view::npos || text.size() > 64) return std::nullopt;
  bool bracketed = text.size() >= 2 && text.front() == '[' && text.back() == ']';
  if (bracketed) text = text.substr(1, text.size() - 2);
  std::string copy(text);
  Address address;
  if (!bracketed && ::inet_pton(AF_INET, copy.c_str(), address.bytes) == 1) {
    address.family = AF_INET;
    return address;
  }
  if (::inet_pton(AF_INET6, copy.c_str(), address.bytes) == 1) {
    address.family = AF_INET6;
    return address;
  }
  return std::nullopt;
}

Address Address::v4(const uint8_t* four) {
  Address address;
  address.family = AF_INET;
  std::memcpy(address.bytes, four, 4);
  return address;
}

std::string Address::to_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (!::inet_ntop(family, bytes, text, sizeof text)) return "?";
  return text;
}

bool Address::operator==(const Address& other) const {
  return family == other.family && std::memcmp(bytes, other.bytes, bits_of(family) / 8) == 0;
}

bool Address::is_v4_mapped() const {
  if (family != AF_INET6) return false;
  for (int i = 0; i < 10; ++i)
    if (bytes[i] != 0) return false;
  return bytes[10] == 0xff && bytes[11] == 0xff;
}

Address Address::unmapped() const { return is_v4_mapped() ? v4(bytes + 12) : *this; }

// Host bits are accepted and cleared: "10.1.2.3/8" is 10.0.0.0/8.
std::optional<Cidr> Cidr::parse(std::string_view text) {
  size_t slash = text.find('/');
  auto address = Address::parse(text.substr(0, slash));
  if (!address) return std::nullopt;
  Cidr cidr;
  cidr.base = *address;
  int bits = bits_of(address->family);
  cidr.prefix = bits;
  if (slash != std::string_view::npos) {
    auto prefix = text::parse_uint(text.substr(slash + 1), bits);
    if (!prefix) return std::nullopt;
    cidr.prefix = static_cast<int>(*prefix);
  }
  for (int bit = cidr.prefix; bit < bits; ++bit)
    cidr.base.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
  return cidr;
}

// An IPv4-mapped address is its IPv4 address, and an IPv4-mapped CIDR of
// /96 or longer is the IPv4 CIDR it spells; other IPv6 CIDRs (::/0 too)
// never contain IPv4 addresses.
bool Cidr::contains(const Address& address) const {
  Address base_address = base;
  int bits = prefix;
  if (base.is_v4_mapped() && prefix >= 96) {
    base_address = base.unmapped();
    bits = prefix - 96;
  }
  Address candidate = address.unmapped();
  if (candidate.family != base_address.family) return false;
  if (bits < 0 || bits > bits_of(candidate.family)) return false;
  return same_prefix(base_address.bytes, candidate.bytes, bits);
}

}  // namespace openshell
