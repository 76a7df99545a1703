// The sandbox policy: a TOML document whose field names follow OpenShell's
// policy schema (OpenShell's YAML is read too: policy/yaml.h). Filesystem, Landlock and process
// parts are fixed at launch; the network part may change on a live sandbox.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace openshell::policy {

enum class LandlockCompatibility {
  kBestEffort,       // use what the kernel offers, and say what is missing
  kHardRequirement,  // refuse to start without full Landlock support
};

struct FilesystemPolicy {
  bool include_workdir = true;
  std::vector<std::string> read_only;
  std::vector<std::string> read_write;
  bool operator==(const FilesystemPolicy&) const = default;
};

struct ProcessPolicy {
  // A name in the image, or a uid; root only with allow_root.
  std::optional<std::string> run_as_user;
  std::optional<std::string> run_as_group;
  // Whether a process of the sandbox may run as root in it (uid or gid 0):
  // `create --user 0`, `exec --user 0`, run_as_user = "root". Root in the
  // sandbox is an unprivileged id outside it, with no capabilities,
  // seccomp and no_new_privs as every process of the sandbox has.
  bool allow_root = false;
  bool operator==(const ProcessPolicy&) const = default;
};

// A query matcher of an HTTP rule: each value the request gives `key` must
// match `glob`, or one of the globs of `any` (exactly one of the two is
// set).
struct QueryMatcher {
  std::string key;
  std::string glob;
  std::vector<std::string> any;
  bool operator==(const QueryMatcher&) const = default;
};

// One of an endpoint's `rules` (written `{ allow = {...} }`) or
// `deny_rules` (`{ deny = {...} }`): a request matches when its method,
// path and query all do. Query matchers come sorted by key from parse().
struct HttpRule {
  std::string method;               // upper case; "*" or "": any
  std::string path;                 // a glob on the request's path; "": any
  std::vector<QueryMatcher> query;  // all must match
  bool operator==(const HttpRule&) const = default;
};

struct Endpoint {
  std::string host;  // "api.github.com" or "*.example.com"
  std::vector<uint16_t> ports;
  std::vector<std::string> allowed_ips;  // CIDRs a resolved address may fall in
  // Layer 7 (docs/policy.md): "" is layer 4 (a connection is allowed or
  // not, and its bytes relayed); "rest" or "websocket" judges every
  // request.
  std::string protocol;
  std::string access;           // "", "read-only", "read-write", "full"; excludes rules
  std::string tls;              // "" or "auto": inspected when it is TLS; "skip": opaque
  std::string enforcement;      // "" or "enforce"; "audit": allowed, logged as a would-be denial
  std::vector<HttpRule> rules;  // allow
  std::vector<HttpRule> deny_rules;  // deny wins
  bool allow_encoded_slash = false;  // a path may hold %2F
  std::string ca_file;               // absolute path of PEM: more trust for this upstream
  // Where a provider's placeholder may be filled in besides the headers:
  // "query", "body" (JSON or form). Elsewhere it is refused.
  std::vector<std::string> credentials_in;
  // parse() refuses rules with access, any of rules, deny_rules, access,
  // enforcement, allow_encoded_slash and credentials_in without protocol, and rules,
  // deny_rules or access with tls = "skip".
  bool operator==(const Endpoint&) const = default;
};

struct Binary {
  std::string path;  // absolute path or glob
  bool operator==(const Binary&) const = default;
};

struct NetworkPolicy {
  std::string name;
  std::vector<Endpoint> endpoints;
  std::vector<Binary> binaries;
  bool operator==(const NetworkPolicy&) const = default;
};

// [vm]: the guest's resources for a sandbox created with --vm, where the
// command line gives none (--cpu, --memory). A policy with [vm] does not
// make a sandbox a VM. Read at create only: the guest keeps what it got.
struct VmPolicy {
  std::optional<uint32_t> vcpus;       // 1..64
  std::optional<uint64_t> memory_mib;  // 64..65536
  bool operator==(const VmPolicy&) const = default;
};

struct Policy {
  int version = 1;
  bool has_filesystem_policy = false;  // false: the caller's defaults apply
  FilesystemPolicy filesystem;
  LandlockCompatibility landlock = LandlockCompatibility::kBestEffort;
  ProcessPolicy process;
  std::vector<NetworkPolicy> network;
  VmPolicy vm;
  bool operator==(const Policy&) const = default;
};

// Parses and validates. Throws Error whose message names the source, the line
// and the field at fault: "policy.toml:7: filesystem_policy.read_write[1]: ...".
// A YAML text (looks_like_yaml, or a source name ending in .yaml or .yml)
// is read as YAML, with the same checks and messages.
Policy parse(std::string_view text, const std::string& source_name);

// Reads and parses a file; a missing file is an Error naming it.
Policy load(const std::string& path);

// The policy as a TOML document in the layout of the design's example
// (endpoints and binaries as inline tables, one a line). A policy that
// parse() returned comes back equal from parse(to_toml(policy)). Network
// policies are written in the given order, but parse() returns them sorted
// by name (TOML tables keep no order); a name given twice is an Error.
// No other validation: what parse() would refuse, it refuses on reading.
std::string to_toml(const Policy& policy);

// The default for sandboxes: no network; system directories read-only; the
// workspace, /tmp and /dev/null writable.
Policy default_policy();

// A host pattern as endpoints take it; empty string when fine, else the reason.
std::string check_host_pattern(std::string_view host);

// An allowed_ips entry (an address or a CIDR) as the egress rules compile it;
// empty string when fine, else the reason. A policy that parse() returned
// always compiles into the egress proxy's rules.
std::string check_allowed_ip(std::string_view entry);

// A rule's method: an HTTP token (any case; parse() stores it upper case)
// or "*" for any; empty string when fine, else the reason.
std::string check_http_method(std::string_view method);

// A rule's path glob: starts with '/'; `*` matches within one segment,
// `**` (a whole segment) any number of segments, none included; no '?'
// (the query has its matchers), '#', spaces or control characters. Empty
// string when fine, else the reason.
std::string check_path_glob(std::string_view path);

}  // namespace openshell::policy
