// The proxy's audit lines (one JSON object each: time, sandbox, kind,
// binary, pid, host, port, decision, rule, reason, address; method and path
// for a request judged at layer 7) as OCSF 1.x events, or as one human line.
//
//  - kind "connect" is Network Activity (class_uid 4001): Open when
//    allowed, Refuse when denied, Close when a new policy closed it.
//  - a line with "method" is HTTP Activity (4002), its activity the method.
//  - kind "dns" is DNS Activity (4003), a Query.
//  - decision "allow" (and the DNS stub's local, cached, upstream) is
//    disposition Allowed; "deny", "closed", "rate_limited" Blocked; "audit"
//    (let through by an endpoint in audit mode, a would-be denial) Logged.
//  - A path is written without its query: a query's values may be secrets.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace openshell::egress::ocsf {

inline constexpr const char* kSchemaVersion = "1.3.0";

// The event for one audit line; nullopt when it is not an audit line (not
// an object with a kind and a decision).
std::optional<nlohmann::json> event(const nlohmann::json& line);

// "12:00:01 deny curl(pid 7) -> example.com:443  no rule allows it" (the
// time in UTC, as the line has it); nullopt as for event().
std::optional<std::string> text(const nlohmann::json& line);

enum class Format { kJson, kOcsf, kText };

// Some of a stream of audit lines, in the format asked for; an unfinished
// last line waits in *carry for the next chunk. A line that is not an
// audit line is passed on as it is.
std::string convert(std::string_view chunk, Format format, std::string* carry);

}  // namespace openshell::egress::ocsf
