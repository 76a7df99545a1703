// `sandbox connect`: this terminal joined to a sandbox's main process, until
// the detach keys, another terminal taking over, or the process's end.
#pragma once

#include <string>
#include <string_view>

namespace openshell::cli {

class GatewayClient;

// docker's --detach-keys: a comma-separated sequence of single characters
// and ctrl-X (X a letter, or one of @ [ \ ] ^ _). Returns the bytes; throws
// Error naming what is wrong.
std::string parse_detach_keys(std::string_view text);
inline constexpr const char* kDefaultDetachKeys = "ctrl-p,ctrl-q";

// Finds the detach sequence in input as it comes. Bytes that could begin it
// are held back until the next byte tells; a sequence broken off is passed
// on whole, as typed.
class DetachMatcher {
 public:
  explicit DetachMatcher(std::string keys) : keys_(std::move(keys)) {}
  // The bytes to pass on; *detached once the whole sequence was typed (what
  // followed it is dropped).
  std::string feed(std::string_view input, bool* detached);

 private:
  std::string keys_;
  size_t matched_ = 0;
};

struct ConnectOptions {
  std::string detach_keys = kDefaultDetachKeys;  // as parse_detach_keys reads it
  bool replay = true;                            // the kept output first
};

// Attaches stdin and stdout to the main process of a Ready sandbox; returns
// this command's exit status: 0 when detached or taken over, the main
// process's status when it ended. Throws Error.
int connect_console(const GatewayClient& client, const std::string& name,
                    const ConnectOptions& options);

}  // namespace openshell::cli
