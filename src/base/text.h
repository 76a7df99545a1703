// Small parsers and string helpers shared by the command line and the policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace openshell::text {

// "64M", "1.5G", "512k", "4096", "2GiB", "512Mi" -> bytes (binary units). nullopt when
// malformed, zero, or too large.
std::optional<uint64_t> parse_size(std::string_view text);

// Decimal unsigned integer with no sign, no spaces and no trailing garbage.
std::optional<uint64_t> parse_uint(std::string_view text, uint64_t max = UINT64_MAX);

// "1.5" -> 1.5; positive finite numbers only.
std::optional<double> parse_positive_decimal(std::string_view text);

std::vector<std::string> split(std::string_view text, char sep);
std::string_view trim(std::string_view text);
std::string join(const std::vector<std::string>& parts, std::string_view sep);

// ASCII case only: protocol tokens, host and header names, capability names.
// Bytes outside A-Z (a-z for upper), UTF-8 included, are left as they are,
// whatever the locale.
constexpr char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
constexpr char upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }
std::string lower(std::string_view text);
std::string upper(std::string_view text);
// Equal but for ASCII case.
bool iequals(std::string_view a, std::string_view b);

// An absolute path with "//" and "." components removed: "/a//b/./c/" ->
// "/a/b/c", "//" -> "/". ".." is kept (callers refuse it).
std::string normalize_path(std::string_view path);

// Whether `path` is one a sandbox's file system may name (a policy's path,
// a bind destination, a working directory): "" when fine, else the reason
// ("must be an absolute path").
std::string check_absolute_path(std::string_view path);

// A DNS label: 1-63 of [a-z0-9-], not starting or ending with '-'.
bool is_dns_label(std::string_view text);

// Human form of a byte count: "64.0 MiB".
std::string format_bytes(uint64_t bytes);

// Milliseconds with two decimals, for -v timings: "12.34".
std::string format_ms(double ms);

// A hex digit's value (either case), or -1 for any other character.
int hex_value(char c);

// Lower-case hex, two digits a byte: {0x0a, 0xff} -> "0aff".
std::string hex(const unsigned char* data, size_t size);

// RFC 3986 percent-encoding, for URL path segments and query values: every
// byte but the unreserved A-Z a-z 0-9 - . _ ~ becomes %XX (upper-case hex),
// so "a b/c" -> "a%20b%2Fc" and UTF-8 "\xc3\xa9" -> "%C3%A9".
std::string percent_encode(std::string_view text);

// The reverse: "%41%2fb" -> "A/b", other bytes as they are ("+" stays "+").
// nullopt for a malformed escape ("%4", "%zz") and for an encoded NUL, which
// is never part of a valid name.
std::optional<std::string> percent_decode(std::string_view text);

}  // namespace openshell::text
