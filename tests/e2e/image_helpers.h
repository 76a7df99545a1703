// Small helpers of the image tests (pull, build, push, commit): shell
// commands as root, loopback ports, a docker-registry on loopback that logs
// its requests, and the busybox image as an OCI layout, built once a run.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"

namespace e2e::image_helpers {

struct Shell {
  int status;
  std::string out;
};

// A shell command as root (the test process): its output, and its status.
inline Shell sh(const std::string& command) {
  Shell r{-1, ""};
  FILE* p = ::popen(("(" + command + ") 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

inline std::string q(const std::string& s) { return "'" + s + "'"; }

inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool wait_listening(uint16_t port, int ms) {
  for (int i = 0; i < ms / 20; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return true;
    ::usleep(20000);
  }
  return false;
}

// Debian's docker-registry on loopback, logging every request to log(); one
// per test (its repositories are the test's), stopped at its end.
class LoggingRegistry {
 public:
  LoggingRegistry() {
    static int n = 0;
    dir_ = scratch() + "/push-registry-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
    sh("rm -rf " + q(dir_) + " && mkdir -p " + q(dir_ + "/data"));
    port_ = free_port();
    FILE* f = std::fopen((dir_ + "/config.yml").c_str(), "w");
    if (!f) return;
    std::fprintf(f,
                 "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: "
                 "%s/data\nhttp:\n  addr: 127.0.0.1:%u\n",
                 dir_.c_str(), port_);
    std::fclose(f);
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open((dir_ + "/log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execlp("docker-registry", "docker-registry", "serve", (dir_ + "/config.yml").c_str(),
               nullptr);
      ::_exit(127);
    }
    ok_ = wait_listening(port_, 30000);
  }
  ~LoggingRegistry() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status;
      ::waitpid(pid_, &status, 0);
    }
    sh("rm -rf " + q(dir_));
  }
  LoggingRegistry(const LoggingRegistry&) = delete;
  LoggingRegistry& operator=(const LoggingRegistry&) = delete;

  bool ok() const { return ok_; }
  std::string host() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return file_contents(dir_ + "/log"); }

 private:
  std::string dir_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
  bool ok_ = false;
};

// The busybox image as an OCI layout directory, built once ("" when it
// cannot be).
inline const std::string& busybox_layout() {
  static std::string layout = [] {
    const char* script_env = std::getenv("OSH_IMAGE_SCRIPT");
    std::string script =
        script_env && *script_env ? script_env : "rootfs-tools/build-busybox-image";
    std::string dir = scratch() + "/busybox-layout";
    Shell r = sh(q(script) + " " + q(dir) + " >/dev/null && chmod -R a+rX " + q(dir));
    if (r.status != 0) {
      std::fprintf(stderr, "e2e: %s failed: %s\n", script.c_str(), r.out.c_str());
      return std::string();
    }
    return dir;
  }();
  return layout;
}

// The Debian base image's layout (OSH_BASE_LAYOUT), copied once a run into
// the scratch directory: it may lie where the test users cannot read it (a
// clone under a 0700 /root). "" when the variable is unset or the copy
// fails; base_layout_source() says which.
inline const std::string& base_layout_source() {
  static const std::string source = [] {
    const char* v = std::getenv("OSH_BASE_LAYOUT");
    return std::string(v && *v ? v : "");
  }();
  return source;
}
inline const std::string& readable_base_layout() {
  static const std::string readable = [] {
    if (base_layout_source().empty()) return std::string();
    std::string path = scratch() + "/base-image.tar";
    std::error_code ec;
    std::filesystem::copy_file(base_layout_source(), path,
                               std::filesystem::copy_options::overwrite_existing, ec);
    ::chmod(path.c_str(), 0644);
    return ec ? std::string() : path;
  }();
  return readable;
}

// The string value of "key" in pretty-printed JSON text; "" when absent.
inline std::string field_of(const std::string& json, const std::string& key) {
  auto pos = json.find("\"" + key + "\": \"");
  if (pos == std::string::npos) return "";
  pos += key.size() + 5;
  return json.substr(pos, json.find('"', pos) - pos);
}

}  // namespace e2e::image_helpers
