#include "cli/base_image.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace openshell::cli::base_image {
namespace {

using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;

// A loopback port that refuses connections while this lives: bound by a
// socket that does not listen, so that no other program takes it.
class RefusedPort {
 public:
  RefusedPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RefusedPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

TEST(BaseImage, MirrorFromDeb822AndOneLineSources) {
  EXPECT_EQ(mirror_in_sources("Types: deb\nURIs: http://mirror.invalid/debian/\nSuites: bookworm\n"
                              "\nTypes: deb\nURIs: http://mirror.invalid/debian-security\n",
                              ""),
            "http://mirror.invalid/debian");
  EXPECT_EQ(mirror_in_sources("URIs: http://mirror.invalid/debian-security\n",
                              "# deb http://old.invalid/debian bookworm main\n"
                              "deb [arch=amd64 signed-by=/k.gpg] https://list.invalid/debian "
                              "bookworm main\n"),
            "https://list.invalid/debian");
  EXPECT_EQ(mirror_in_sources("", "deb-src http://src.invalid/debian bookworm main\n"),
            std::nullopt);
}

TEST(BaseImage, MirrorFromTheAptFilesUnderARoot) {
  TempDir root;
  EXPECT_EQ(apt_mirror(root.path()), std::nullopt);
  write_file(root / "etc/apt/sources.list.d/debian.sources", "URIs: file:///srv/mirror\n");
  EXPECT_EQ(apt_mirror(root.path()), "file:///srv/mirror");
}

TEST(BaseImage, NoMirrorSaysHowToBuildOrImport) {
  TempDir root, bin;
  Host host{root.path(), bin.path(), 0, ""};
  Plan p = plan(host);
  EXPECT_FALSE(p.ok());
  EXPECT_THAT(p.problem, HasSubstr("apt names no Debian mirror"));
  EXPECT_THAT(p.problem, HasSubstr("'openshell image build-base --mirror URL'"));
  EXPECT_THAT(p.problem, HasSubstr("'openshell image import FILE base'"));
  EXPECT_EQ(p.problem.find('\n'), std::string::npos);
}

TEST(BaseImage, NoToolOnPath) {
  TempDir bin;
  Host root_host{"", bin.path(), 0, "file:///"};
  Plan p = plan(root_host);
  EXPECT_THAT(p.problem, HasSubstr("neither debootstrap nor mmdebstrap is on PATH"));
  Host user_host{"", bin.path(), 1000, "file:///"};
  EXPECT_THAT(plan(user_host).problem, HasSubstr("it takes mmdebstrap, which is not on PATH"));
  // As root, debootstrap; as an ordinary user, mmdebstrap.
  write_file(bin / "debootstrap", "#!/bin/sh\n");
  write_file(bin / "mmdebstrap", "#!/bin/sh\n");
  ::chmod((bin / "debootstrap").c_str(), 0755);
  ::chmod((bin / "mmdebstrap").c_str(), 0755);
  EXPECT_EQ(plan(root_host).tool, "debootstrap");
  EXPECT_EQ(plan(user_host).tool, "mmdebstrap");
  EXPECT_TRUE(plan(user_host).ok()) << plan(user_host).problem;
}

TEST(BaseImage, UnreachableMirror) {
  TempDir bin;
  write_file(bin / "debootstrap", "#!/bin/sh\n");
  ::chmod((bin / "debootstrap").c_str(), 0755);
  RefusedPort refused;
  const std::string mirror = "http://127.0.0.1:" + std::to_string(refused.port()) + "/debian";
  Plan p = plan(Host{"", bin.path(), 0, mirror});
  EXPECT_FALSE(p.ok());
  EXPECT_THAT(p.problem, HasSubstr("nothing answers at the mirror 127.0.0.1:"));
  EXPECT_THAT(p.problem, HasSubstr("build-base --mirror URL"));
  EXPECT_TRUE(plan(Host{"", bin.path(), 0, mirror}, false).ok());
  EXPECT_THAT(mirror_unreachable("file:///nonexistent-mirror"), HasSubstr("does not exist"));
}

// Sets an environment variable for one test, and puts it back.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvVar() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(BaseImage, MirrorThroughProxy) {
  // A mirror that cannot resolve (.invalid never does) is reachable when
  // the proxy apt and wget would take answers; a proxy that refuses is
  // named, with the variable it came from.
  EnvVar no_proxy("no_proxy", nullptr), no_proxy_upper("NO_PROXY", nullptr);
  RefusedPort refused;
  const std::string closed = "http://127.0.0.1:" + std::to_string(refused.port());
  {
    EnvVar http("http_proxy", closed.c_str());
    EXPECT_EQ(mirror_proxy("http://mirror.invalid/debian"), closed);
    EXPECT_EQ(mirror_proxy("https://mirror.invalid/debian"), "");
    EXPECT_THAT(mirror_unreachable("http://mirror.invalid/debian"),
                AllOf(HasSubstr("nothing answers at the proxy 127.0.0.1:"), HasSubstr("http_proxy"),
                      HasSubstr("mirror.invalid")));
  }
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string open_proxy = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  {
    EnvVar http("http_proxy", open_proxy.c_str());
    EXPECT_EQ(mirror_unreachable("http://mirror.invalid/debian"), "");
    // no_proxy names the mirror: the mirror itself must answer.
    EnvVar exempt("no_proxy", "localhost, .invalid");
    EXPECT_EQ(mirror_proxy("http://mirror.invalid/debian"), "");
    EXPECT_THAT(mirror_unreachable("http://mirror.invalid/debian"),
                HasSubstr("the mirror's host mirror.invalid does not resolve"));
  }
  ::close(listener);
}

}  // namespace
}  // namespace openshell::cli::base_image
