// Changes to a policy that the CLI makes without a file (`policy update`),
// and the comparisons that say which part of a change can apply live.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/policy.h"

namespace openshell::policy {

struct EndpointRef {
  std::string host;  // as written, case kept
  uint16_t port = 0;
};

// An HTTP rule named on the command line: HOST:PORT:METHOD:PATH_GLOB.
struct RuleRef {
  EndpointRef endpoint;
  std::string method;  // upper case, or "*"
  std::string path;    // a path glob (check_path_glob)
};

// Reads HOST:PORT:METHOD:PATH_GLOB (an IPv6 host in brackets:
// "[2001:db8::1]:443:GET:/x"; the path may hold ':'). Throws Error naming
// `flag` and the text: "--add-allow api.github.com:443:GET: the path
// glob ...".
RuleRef parse_rule_ref(const std::string& flag, const std::string& text);

struct Update {
  std::vector<EndpointRef> remove;       // from every rule
  std::vector<EndpointRef> add;          // to `rule`
  std::vector<RuleRef> add_allow;        // to every endpoint of HOST:PORT, else a new one in `rule`
  std::vector<RuleRef> add_deny;         // to every endpoint of HOST:PORT, which must exist
  std::vector<RuleRef> remove_rules;     // METHOD and PATH off every endpoint of HOST:PORT
  std::vector<std::string> allowed_ips;  // for every added endpoint; empty: none given
  std::vector<std::string> binaries;     // added to `rule`
  std::string rule = "cli";
};

// What an update did, one line per change ("added localhost:9000 to rule
// cli", "localhost:9000 is already in rule cli"), and whether it changed
// anything at all.
struct UpdateResult {
  std::vector<std::string> notes;
  bool changed = false;
};

// Applies the update to `policy`, in this order: removals (PORT off every
// endpoint whose host is HOST, case aside; an endpoint left without ports
// goes, and a rule left without endpoints), then additions to the rule
// (created when missing): an endpoint of that rule with the same host and
// port is never added twice; with allowed_ips given, that endpoint's
// allowed_ips become them. Binaries already in the rule are not added again.
// Then the HTTP rules (docs/policy.md, "policy update"): --remove-rule
// takes every allow or deny rule with that method and path (whatever its
// query) off the endpoints of HOST:PORT; --add-allow and --add-deny add
// {method, path} to each endpoint of HOST:PORT in any network policy (one
// that serves other ports too leaves this port to an endpoint of its own),
// setting protocol = "rest" where none is set; an access preset becomes
// the rules it stands for, since access and rules exclude each other.
// --add-allow on a HOST:PORT no endpoint has adds one to `rule`; --add-deny
// there is an error (a new endpoint would allow the rest).
// Rules end sorted by name, as parse() returns them; a rule's endpoints keep
// their order, new ones at the end. Throws Error ("--remove-endpoint
// HOST:PORT: the policy has no such endpoint", a bad allowed_ips entry)
// before changing anything.
UpdateResult apply_update(Policy* policy, const Update& update);

// The parts of `b` that differ from `a` among those fixed at a sandbox's
// start: "filesystem_policy", "landlock", "process", in that order. Both
// are taken as they are: pass effective policies (spec::effective_policy)
// so that a section left out compares as the default it stands for.
std::vector<std::string> static_differences(const Policy& a, const Policy& b);

// Whether a text looks like a YAML policy (OpenShell's format) rather than
// TOML, and so is read as YAML: its first line that is not blank or a comment is a YAML mapping key
// ("version: 1", "network_policies:") or a document start ("---").
bool looks_like_yaml(std::string_view text);

}  // namespace openshell::policy
