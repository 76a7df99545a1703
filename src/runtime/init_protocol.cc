#include "runtime/init_protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/text.h"

namespace openshell::runtime {

std::string make_message(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& part : parts) {
    out += part;
    out += '\0';
  }
  return out;
}

InitMessage parse_message(std::string_view packet) {
  InitMessage message;
  if (packet.empty() || packet.back() != '\0') return message;
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < packet.size()) {
    size_t end = packet.find('\0', start);
    parts.emplace_back(packet.substr(start, end - start));
    start = end + 1;
  }
  const std::string& kind = parts[0];
  if (kind == "started")
    message.kind = InitMessage::Kind::kStarted;
  else if (kind == "failed")
    message.kind = InitMessage::Kind::kFailed;
  else if (kind == "exited")
    message.kind = InitMessage::Kind::kExited;
  else if (kind == "exec")
    message.kind = InitMessage::Kind::kExec;
  else if (kind == "kill")
    message.kind = InitMessage::Kind::kKill;
  message.fields.assign(parts.begin() + 1, parts.end());
  return message;
}

std::string encode_exec(const ExecRequest& r) {
  std::vector<std::string> parts = {"exec",
                                    std::to_string(r.id),
                                    r.tty ? "1" : "0",
                                    std::to_string(r.rows),
                                    std::to_string(r.cols),
                                    r.workdir,
                                    std::to_string(r.argv.size())};
  parts.insert(parts.end(), r.argv.begin(), r.argv.end());
  parts.push_back(std::to_string(r.env.size()));
  parts.insert(parts.end(), r.env.begin(), r.env.end());
  return make_message(parts);
}

std::optional<ExecRequest> decode_exec(const InitMessage& m) {
  if (m.kind != InitMessage::Kind::kExec || m.fields.size() < 6) return std::nullopt;
  ExecRequest r;
  auto id = text::parse_uint(m.fields[0]);
  auto rows = text::parse_uint(m.fields[2], 65535);
  auto cols = text::parse_uint(m.fields[3], 65535);
  auto argc = text::parse_uint(m.fields[5], 65536);
  if (!id || !rows || !cols || !argc || (m.fields[1] != "0" && m.fields[1] != "1"))
    return std::nullopt;
  r.id = *id;
  r.tty = m.fields[1] == "1";
  r.rows = static_cast<uint16_t>(*rows);
  r.cols = static_cast<uint16_t>(*cols);
  r.workdir = m.fields[4];
  size_t at = 6;
  if (m.fields.size() < at + *argc + 1 || *argc == 0) return std::nullopt;
  r.argv.assign(m.fields.begin() + at, m.fields.begin() + at + *argc);
  at += *argc;
  auto envc = text::parse_uint(m.fields[at++], 65536);
  if (!envc || m.fields.size() != at + *envc) return std::nullopt;
  r.env.assign(m.fields.begin() + at, m.fields.end());
  return r;
}

int send_packet(int socket_fd, std::string_view packet, const int* fds, int fd_count) {
  iovec iov{const_cast<char*>(packet.data()), packet.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd_count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fd_count * sizeof(int));
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fd_count * sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), fds, fd_count * sizeof(int));
  }
  for (;;) {
    ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return 0;
    if (errno != EINTR) return -errno;
  }
}

long receive_packet(int socket_fd, std::string* packet, int fds[3]) {
  fds[0] = fds[1] = fds[2] = -1;
  packet->resize(kMaxControlMessage);
  iovec iov{packet->data(), packet->size()};
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    packet->clear();
    return -errno;
  }
  packet->resize(static_cast<size_t>(n));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (i < 3)
        fds[i] = fd;
      else
        ::close(fd);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (int i = 0; i < 3; ++i)
      if (fds[i] >= 0) ::close(fds[i]), fds[i] = -1;
    return -EMSGSIZE;
  }
  return n;
}

}  // namespace openshell::runtime
