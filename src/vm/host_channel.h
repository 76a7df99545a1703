// The VMM's channel to its supervisor (docs/vm.md, "The VMM process"): one
// end of a SOCK_SEQPACKET socket pair the supervisor made, given to
// `openshell __vmm --channel-fd N`. One datagram a message, ASCII text, and
// at most one fd with it (SCM_RIGHTS) where the message says so:
//
//   VMM -> supervisor   accepted HOSTPORT GUESTPORT   + fd   a guest connected
//                                                            to a --host-port
//                       connected ID                  + fd   answers connect
//                       refused ID REASON                    answers connect
//   supervisor -> VMM   connect ID GUESTPORT                 a connection to
//                                                            the guest's port
//
// The supervisor is trusted more than the guest, but a message from it is
// still checked whole: a datagram that is too long, holds a verb or number
// that is not the protocol's, or carries the wrong count of fds is dropped
// (its fds closed) and said in a log line; the channel goes on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "base/unique_fd.h"

namespace openshell::vm::host_channel {

// The longest message; a refusal's reason is cut to fit.
inline constexpr size_t kMaxMessage = 256;

struct Accepted {
  uint32_t host_port = 0;
  uint32_t guest_port = 0;
};
struct Connect {
  uint64_t id = 0;
  uint32_t guest_port = 0;
};
struct Connected {
  uint64_t id = 0;
};
struct Refused {
  uint64_t id = 0;
  std::string reason;  // printable ASCII, one line
};
using Message = std::variant<Accepted, Connect, Connected, Refused>;

// Whether the message travels with an fd (accepted, connected).
bool carries_fd(const Message& message);

// The message's text. A refusal's reason has anything but printable ASCII
// written as '?' and is cut so that the whole stays within kMaxMessage.
std::string encode(const Message& message);
// The message `text` is, or nullopt with why not in *why ("unknown verb
// \"hello\"", "connect: bad guest port \"x\"").
std::optional<Message> decode(std::string_view text, std::string* why);

// Sends one datagram: `text` with `fd_to_pass` attached when it is >= 0.
// Returns "" or why not ("sendmsg: Broken pipe"); EPIPE and ECONNRESET mean
// the peer is gone. With `would_block`, the send does not wait: a full
// channel sets *would_block and returns "" with nothing sent.
std::string send(int channel, std::string_view text, int fd_to_pass = -1,
                 bool* would_block = nullptr);

struct Datagram {
  std::string text;
  UniqueFd fd;          // the one fd that came with it, if any
  bool closed = false;  // the peer closed its end (or the socket failed: see problem)
  std::string problem;  // not empty: the datagram was dropped, and why
};
// Receives one datagram (blocks unless `channel` is non-blocking; EAGAIN
// gives an empty Datagram with nothing set). Fds arrive close-on-exec; a
// datagram longer than kMaxMessage, with a truncated control message or
// with more than one fd is dropped with every fd it brought closed.
Datagram receive(int channel);

// A received datagram as a message: decoded, and with an fd exactly when the
// verb takes one. nullopt with why in *why (the datagram's fd is closed with it).
std::optional<Message> parse(Datagram& datagram, std::string* why);

}  // namespace openshell::vm::host_channel
