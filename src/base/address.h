// IPv4 and IPv6 addresses and CIDR ranges: what the policy's allowed_ips,
// the egress rules, the DNS stub and the registry client all speak.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace openshell {

// An IPv4 or IPv6 address (IPv4 kept as v4, not mapped).
struct Address {
  int family = AF_INET;  // AF_INET or AF_INET6
  uint8_t bytes[16] = {};
  // inet_pton's forms: IPv4 only as four decimal parts without leading zeros
  // ("010.1.1.1", "1.2.3", "2130706433" are not addresses); IPv6 bare or in
  // brackets, without a zone id.
  static std::optional<Address> parse(std::string_view text);  // "1.2.3.4", "::1", "[::1]"
  // The IPv4 address of four bytes in network order.
  static Address v4(const uint8_t* four);
  std::string to_string() const;
  bool operator==(const Address& other) const;
  // ::ffff:a.b.c.d: what a dual-stack socket sends to a.b.c.d.
  bool is_v4_mapped() const;
  // a.b.c.d for ::ffff:a.b.c.d; any other address as it is.
  Address unmapped() const;
};

struct Cidr {
  Address base;
  int prefix = 0;
  // Host bits are accepted and cleared ("10.1.2.3/8" is 10.0.0.0/8).
  static std::optional<Cidr> parse(std::string_view text);  // "10.0.0.0/8", "::1/128", "1.2.3.4"
  // An IPv4-mapped address (::ffff:a.b.c.d) counts as its IPv4 address; an
  // IPv6 CIDR other than an IPv4-mapped one of /96 or longer contains no
  // IPv4 address (so "::/0" does not open IPv4).
  bool contains(const Address& address) const;
};

}  // namespace openshell
