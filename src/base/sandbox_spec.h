// What a sandbox is made of, as the user asked for it: the gateway stores it,
// signs it into the launch file, and the supervisor builds the container
// from it. JSON on the wire and on disk.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace openshell {

struct SandboxSpec {
  std::string from = "host";          // "host", or an absolute directory (the root's lower layer)
  std::vector<std::string> command;   // the main process; empty: none (the sandbox idles)
  std::vector<std::string> env;       // KEY=VALUE
  std::optional<double> cpus;
  std::optional<uint64_t> memory_bytes;
  std::optional<uint64_t> pids;
  std::map<std::string, std::string> labels;
  bool no_keep = false;               // delete the sandbox once the main process exits
  std::string policy;                 // policy TOML text; empty: the default policy
  std::string policy_source;          // the file it came from, for messages

  // Throws Error naming the field at fault.
  void validate() const;
  std::string to_json() const;
  static SandboxSpec from_json(const std::string& text);  // throws Error
};

// k=v with a DNS-label-like key: checks one label; returns the reason or "".
std::string check_label(const std::string& key, const std::string& value);

}  // namespace openshell
