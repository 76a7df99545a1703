#include "vm/host_channel.h"

#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/packet.h"

namespace openshell::vm::host_channel {

namespace {

// Room for more fds than a message may carry, so that a datagram with too
// many is seen (and its fds closed) rather than cut short by the kernel.
constexpr size_t kMaxFdsSeen = 8;

std::vector<std::string_view> split(std::string_view text, size_t at_most) {
  std::vector<std::string_view> words;
  while (!text.empty() && words.size() + 1 < at_most) {
    const size_t space = text.find(' ');
    words.push_back(text.substr(0, space));
    if (space == std::string_view::npos) return words;
    text.remove_prefix(space + 1);
  }
  words.push_back(text);  // the rest, spaces and all (a refusal's reason)
  return words;
}

// Decimal digits only, as encode() writes them: no sign, no spaces, no
// leading zero, nothing past the type's range.
template <typename T>
bool number(std::string_view word, T& out) {
  if (word.empty() || word.size() > 20 || (word.size() > 1 && word[0] == '0')) return false;
  for (char c : word)
    if (c < '0' || c > '9') return false;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), out);
  return ec == std::errc() && end == word.data() + word.size();
}

bool printable(std::string_view text) {
  for (char c : text)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

std::string quoted(std::string_view word) {
  std::string out = "\"";
  for (char c : word.substr(0, 32)) out += (c >= 0x20 && c <= 0x7e) ? c : '?';
  return out + (word.size() > 32 ? "...\"" : "\"");
}

std::optional<Message> bad(std::string* why, std::string text) {
  if (why) *why = std::move(text);
  return std::nullopt;
}

}  // namespace

bool carries_fd(const Message& message) {
  return std::holds_alternative<Accepted>(message) || std::holds_alternative<Connected>(message);
}

std::string encode(const Message& message) {
  if (const auto* m = std::get_if<Accepted>(&message))
    return "accepted " + std::to_string(m->host_port) + " " + std::to_string(m->guest_port);
  if (const auto* m = std::get_if<Connect>(&message))
    return "connect " + std::to_string(m->id) + " " + std::to_string(m->guest_port);
  if (const auto* m = std::get_if<Connected>(&message)) return "connected " + std::to_string(m->id);
  const auto& m = std::get<Refused>(message);
  std::string text = "refused " + std::to_string(m.id) + " ";
  for (char c : m.reason.empty() ? std::string("no reason given") : m.reason) {
    if (text.size() >= kMaxMessage) break;
    text += (c >= 0x20 && c <= 0x7e) ? c : '?';
  }
  return text;
}

std::optional<Message> decode(std::string_view text, std::string* why) {
  if (text.empty()) return bad(why, "an empty message");
  if (text.size() > kMaxMessage)
    return bad(why, "a message of " + std::to_string(text.size()) + " bytes (at most " +
                        std::to_string(kMaxMessage) + ")");
  if (!printable(text)) return bad(why, "a message with bytes that are not printable ASCII");
  const std::string_view verb = text.substr(0, text.find(' '));
  if (verb == "accepted" || verb == "connect") {
    const auto words = split(text, 4);
    if (words.size() != 3)
      return bad(
          why, std::string(verb) + ": " + std::to_string(words.size() - 1) + " fields (2 wanted)");
    const bool accepted = verb == "accepted";
    uint64_t first = 0;
    uint32_t host_port = 0;
    uint32_t guest_port = 0;
    if (accepted ? !number(words[1], host_port) : !number(words[1], first))
      return bad(why, std::string(verb) + (accepted ? ": bad host port " : ": bad id ") +
                          quoted(words[1]));
    if (!number(words[2], guest_port))
      return bad(why, std::string(verb) + ": bad guest port " + quoted(words[2]));
    if (accepted) return Accepted{host_port, guest_port};
    return Connect{first, guest_port};
  }
  if (verb == "connected") {
    const auto words = split(text, 3);
    if (words.size() != 2)
      return bad(why, "connected: " + std::to_string(words.size() - 1) + " fields (1 wanted)");
    uint64_t id = 0;
    if (!number(words[1], id)) return bad(why, "connected: bad id " + quoted(words[1]));
    return Connected{id};
  }
  if (verb == "refused") {
    const auto words = split(text, 3);
    if (words.size() != 3 || words[2].empty()) return bad(why, "refused: no reason");
    uint64_t id = 0;
    if (!number(words[1], id)) return bad(why, "refused: bad id " + quoted(words[1]));
    return Refused{id, std::string(words[2])};
  }
  return bad(why, "unknown verb " + quoted(verb));
}

std::string send(int channel, std::string_view text, int fd_to_pass, bool* would_block) {
  if (would_block) *would_block = false;
  if (text.size() > kMaxMessage) return "a message of " + std::to_string(text.size()) + " bytes";
  // A SEQPACKET datagram goes whole or not at all.
  const int err = send_packet(channel, text, &fd_to_pass, fd_to_pass >= 0 ? 1 : 0,
                              would_block ? MSG_DONTWAIT : 0);
  if (err == -EAGAIN && would_block) {
    *would_block = true;
    return "";
  }
  return err == 0 ? "" : errno_message("sendmsg", -err);
}

Datagram receive(int channel) {
  Datagram out;
  char buffer[kMaxMessage + 1];
  iovec iov{buffer, sizeof buffer};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsSeen * sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return out;
    out.closed = true;
    out.problem = errno_message("recvmsg", errno);
    return out;
  }
  // Every fd that came is owned first, whatever is wrong with the datagram.
  std::vector<UniqueFd> fds;
  bool other_control = false;
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS ||
        cmsg->cmsg_len < CMSG_LEN(0)) {
      other_control = true;
      continue;
    }
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  // A SEQPACKET peer that closed reads as 0 bytes; an empty datagram
  // cannot be told from that, and the protocol has none.
  if (n == 0 && fds.empty() && !(msg.msg_flags & MSG_CTRUNC)) {
    out.closed = true;
    return out;
  }
  if (msg.msg_flags & MSG_TRUNC) {
    out.problem = "a datagram longer than " + std::to_string(kMaxMessage) + " bytes";
  } else if (msg.msg_flags & MSG_CTRUNC) {
    out.problem = "a datagram with more than " + std::to_string(kMaxFdsSeen) + " fds";
  } else if (other_control) {
    out.problem = "a datagram with a control message other than SCM_RIGHTS";
  } else if (fds.size() > 1) {
    out.problem = "a datagram with " + std::to_string(fds.size()) + " fds (at most 1)";
  } else if (n > static_cast<ssize_t>(kMaxMessage)) {
    out.problem = "a datagram longer than " + std::to_string(kMaxMessage) + " bytes";
  }
  if (!out.problem.empty()) return out;  // the fds close here
  out.text.assign(buffer, static_cast<size_t>(n));
  if (!fds.empty()) out.fd = std::move(fds.front());
  return out;
}

std::optional<Message> parse(Datagram& datagram, std::string* why) {
  UniqueFd fd = std::move(datagram.fd);
  std::optional<Message> message = decode(datagram.text, why);
  if (!message) return std::nullopt;
  if (carries_fd(*message) && !fd) return bad(why, quoted(datagram.text) + " without its fd");
  if (!carries_fd(*message) && fd)
    return bad(why, quoted(datagram.text) + " with an fd it does not take");
  datagram.fd = std::move(fd);
  return message;
}

}  // namespace openshell::vm::host_channel
