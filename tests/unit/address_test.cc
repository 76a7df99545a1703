// Addresses and CIDRs (base/address.h): the forms inet_pton takes, and
// prefix containment with IPv4-mapped addresses counted as IPv4.
#include "base/address.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace openshell {
namespace {

Address addr(const char* text) {
  auto address = Address::parse(text);
  EXPECT_TRUE(address.has_value()) << text;
  return address.value_or(Address{});
}

Cidr cidr(const char* text) {
  auto parsed = Cidr::parse(text);
  EXPECT_TRUE(parsed.has_value()) << text;
  return parsed.value_or(Cidr{});
}

// ---- Address ---------------------------------------------------------------

TEST(AddressParse, IPv4) {
  auto a = Address::parse("1.2.3.4");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->family, AF_INET);
  EXPECT_EQ(a->bytes[0], 1);
  EXPECT_EQ(a->bytes[3], 4);
  EXPECT_EQ(a->to_string(), "1.2.3.4");
  EXPECT_EQ(addr("0.0.0.0").to_string(), "0.0.0.0");
  EXPECT_EQ(addr("255.255.255.255").to_string(), "255.255.255.255");
}

TEST(AddressParse, IPv6BareAndBracketed) {
  auto a = Address::parse("::1");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->family, AF_INET6);
  EXPECT_EQ(a->bytes[15], 1);
  EXPECT_EQ(a->to_string(), "::1");
  EXPECT_EQ(addr("[::1]"), addr("::1"));
  EXPECT_EQ(addr("2001:0DB8:0:0::1").to_string(), "2001:db8::1");
  EXPECT_EQ(addr("::ffff:127.0.0.1").to_string(), "::ffff:127.0.0.1");
  EXPECT_EQ(addr("::ffff:127.0.0.1").family, AF_INET6);  // kept as written, not unmapped
}

TEST(AddressParse, RefusesWhatIsNotAnAddress) {
  for (const char* text :
       {"",          "1.2.3",        "1.2.3.4.5",   "256.1.1.1",  "1.2.3.-4",
        "010.1.1.1", "01.2.3.4",     "0x7f.0.0.1",  "0x7f000001", "2130706433",
        "1.2.3.4 ",  " 1.2.3.4",     "[1.2.3.4]",   "[::1",       "::1]",
        "[]",        "fe80::1%eth0", "example.com", "::g",        "1:2:3:4:5:6:7:8:9",
        "1.2.3.4/32"})
    EXPECT_FALSE(Address::parse(text).has_value()) << text;
  // An embedded NUL must not cut the text short.
  EXPECT_FALSE(Address::parse(std::string_view("1.2.3.4\0evil", 12)).has_value());
}

TEST(AddressParse, Equality) {
  EXPECT_EQ(addr("::1"), addr("0:0:0:0:0:0:0:1"));
  EXPECT_FALSE(addr("1.2.3.4") == addr("1.2.3.5"));
  EXPECT_FALSE(addr("1.2.3.4") == addr("::ffff:1.2.3.4"));  // families differ
  EXPECT_FALSE(addr("::1") == addr("::2"));
}

TEST(AddressMapped, UnmappedIsTheIPv4Address) {
  EXPECT_TRUE(addr("::ffff:10.1.2.3").is_v4_mapped());
  EXPECT_EQ(addr("::ffff:10.1.2.3").unmapped(), addr("10.1.2.3"));
  EXPECT_FALSE(addr("10.1.2.3").is_v4_mapped());
  EXPECT_EQ(addr("10.1.2.3").unmapped(), addr("10.1.2.3"));
  // Not ::ffff:0:0/96: kept as they are.
  EXPECT_FALSE(addr("::1:ffff:10.1.2.3").is_v4_mapped());
  EXPECT_FALSE(addr("::10.1.2.3").is_v4_mapped());
  EXPECT_EQ(addr("64:ff9b::10.1.2.3").unmapped(), addr("64:ff9b::10.1.2.3"));
  const uint8_t four[4] = {192, 0, 2, 7};
  EXPECT_EQ(Address::v4(four), addr("192.0.2.7"));
}

// ---- Cidr ------------------------------------------------------------------

TEST(CidrParse, Forms) {
  Cidr c = cidr("10.0.0.0/8");
  EXPECT_EQ(c.base, addr("10.0.0.0"));
  EXPECT_EQ(c.prefix, 8);
  EXPECT_EQ(cidr("1.2.3.4").prefix, 32);
  EXPECT_EQ(cidr("::1").prefix, 128);
  EXPECT_EQ(cidr("fd00::/8").prefix, 8);
  EXPECT_EQ(cidr("0.0.0.0/0").prefix, 0);
  EXPECT_EQ(cidr("::/128").prefix, 128);
  EXPECT_EQ(cidr("[::1]/128").base, addr("::1"));
}

TEST(CidrParse, HostBitsAreCleared) {
  Cidr c = cidr("10.1.2.3/8");
  EXPECT_EQ(c.base, addr("10.0.0.0"));
  EXPECT_EQ(cidr("172.31.255.255/12").base, addr("172.16.0.0"));
  EXPECT_EQ(cidr("fd12:3456::1/16").base, addr("fd12::"));
  EXPECT_EQ(cidr("192.168.1.255/31").base, addr("192.168.1.254"));
}

TEST(CidrParse, Refuses) {
  for (const char* text : {"10.0.0.0/33", "::/129", "10.0.0.0/", "/8", "10.0.0.0/-1", "10.0.0.0/+8",
                           "10.0.0.0/8/8", "10.0.0.0/ 8", "10.0.0.0/x", "example.com/8", "10.0.0/8",
                           "", "10.0.0.0/99999999999999999999999"})
    EXPECT_FALSE(Cidr::parse(text).has_value()) << text;
}

TEST(CidrContains, IPv4PrefixEdges) {
  Cidr ten = cidr("10.0.0.0/8");
  EXPECT_TRUE(ten.contains(addr("10.0.0.0")));
  EXPECT_TRUE(ten.contains(addr("10.255.255.255")));
  EXPECT_FALSE(ten.contains(addr("9.255.255.255")));
  EXPECT_FALSE(ten.contains(addr("11.0.0.0")));

  Cidr cgnat = cidr("100.64.0.0/10");  // not on a byte boundary
  EXPECT_TRUE(cgnat.contains(addr("100.64.0.0")));
  EXPECT_TRUE(cgnat.contains(addr("100.127.255.255")));
  EXPECT_FALSE(cgnat.contains(addr("100.63.255.255")));
  EXPECT_FALSE(cgnat.contains(addr("100.128.0.0")));

  Cidr one = cidr("192.0.2.7");
  EXPECT_TRUE(one.contains(addr("192.0.2.7")));
  EXPECT_FALSE(one.contains(addr("192.0.2.6")));
  EXPECT_FALSE(one.contains(addr("192.0.2.8")));

  Cidr all = cidr("0.0.0.0/0");
  EXPECT_TRUE(all.contains(addr("0.0.0.0")));
  EXPECT_TRUE(all.contains(addr("255.255.255.255")));
  EXPECT_FALSE(all.contains(addr("::1")));
}

TEST(CidrContains, IPv6PrefixEdges) {
  Cidr ula = cidr("fc00::/7");
  EXPECT_TRUE(ula.contains(addr("fc00::")));
  EXPECT_TRUE(ula.contains(addr("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")));
  EXPECT_FALSE(ula.contains(addr("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")));
  EXPECT_FALSE(ula.contains(addr("fe00::")));

  Cidr pair = cidr("2001:db8::/127");
  EXPECT_TRUE(pair.contains(addr("2001:db8::")));
  EXPECT_TRUE(pair.contains(addr("2001:db8::1")));
  EXPECT_FALSE(pair.contains(addr("2001:db8::2")));

  // IPv6 CIDRs hold no IPv4 addresses, even ::/0 or one with the same bytes.
  EXPECT_FALSE(cidr("::/0").contains(addr("1.2.3.4")));
  EXPECT_FALSE(cidr("::/0").contains(addr("::ffff:1.2.3.4")));
  EXPECT_TRUE(cidr("::/0").contains(addr("2001:db8::1")));
  EXPECT_FALSE(cidr("a00::/8").contains(addr("10.0.0.1")));
}

TEST(CidrContains, IPv4MappedCountsAsIPv4) {
  Cidr ten = cidr("10.0.0.0/8");
  EXPECT_TRUE(ten.contains(addr("::ffff:10.1.2.3")));
  EXPECT_FALSE(ten.contains(addr("::ffff:11.1.2.3")));
  EXPECT_FALSE(ten.contains(addr("::10.1.2.3")));        // IPv4-compatible is not mapped
  EXPECT_FALSE(ten.contains(addr("64:ff9b::a01:203")));  // nor is NAT64

  Cidr mapped = cidr("::ffff:10.0.0.0/104");
  EXPECT_TRUE(mapped.contains(addr("10.1.2.3")));
  EXPECT_TRUE(mapped.contains(addr("::ffff:10.1.2.3")));
  EXPECT_FALSE(mapped.contains(addr("11.0.0.1")));
}

}  // namespace
}  // namespace openshell
