// The default image "base": Debian minbase with bash, coreutils, curl,
// ca-certificates, git, python3 (pip, venv), iproute2, procps, less and a
// user "sandbox" (1000:1000). It is built on this host from the host's own
// package mirror (its apt sources, or --mirror) the first time a sandbox
// needs it, and never fetched from a registry: as root with debootstrap, as
// an ordinary user with mmdebstrap --mode=unshare.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace openshell::cli::base_image {

// What decides whether and how this host can build the image.
struct Host {
  std::string apt_root;  // the apt sources are read under it ("" for /)
  std::string path;      // the PATH the tools are looked for on
  uid_t euid = 0;
  std::string mirror;  // --mirror; "" reads the apt sources
};

// This process's: OPENSHELL_APT_ROOT (tests fake the sources with it), PATH,
// geteuid().
Host this_host(const std::string& mirror);

// The first Debian archive URI (http, https or file; not a -security one)
// of deb822 .sources text, then of one-line sources.list text.
std::optional<std::string> mirror_in_sources(std::string_view deb822, std::string_view list);
// The same from the files under apt_root: etc/apt/sources.list.d/*.sources,
// etc/apt/sources.list, etc/apt/sources.list.d/*.list.
std::optional<std::string> apt_mirror(const std::string& apt_root);

// "" when the mirror answers a TCP connection (a file:// one: its directory
// exists), else why not ("nothing answers at the mirror 127.0.0.1:9:
// Connection refused"). Through the proxy mirror_proxy() names, the proxy
// must answer instead.
std::string mirror_unreachable(const std::string& mirror);

// The proxy that apt and wget (and so debootstrap and mmdebstrap) take to
// an http(s) mirror, from the environment: http_proxy for http (not
// HTTP_PROXY, as they read it), https_proxy or HTTPS_PROXY for https; ""
// when none is set or no_proxy (NO_PROXY) names the mirror's host.
std::string mirror_proxy(const std::string& mirror);

struct Plan {
  std::string tool;     // "debootstrap" or "mmdebstrap"; "" when none can build
  std::string mirror;   // where the packages come from
  std::string problem;  // when it cannot: one line, why, and the command to run instead
  bool ok() const { return problem.empty(); }
};

// Whether and how this host can build the image. check_reachable: also try
// the mirror (the build would fail at once without it).
Plan plan(const Host& host, bool check_reachable = true);

// Builds the image as `name` into the store at images_dir, with a progress
// display on stderr; with `output`, writes it there instead, as an OCI image
// layout tar archive (what scripts/test keeps for the tests). Throws Error
// (one line; the tool's log tail before it).
void build(const Plan& plan, const std::string& images_dir, const std::string& name,
           const std::string& output = "");

// The program on a colon-separated PATH; "" when none.
std::string find_on_path(std::string_view path, const std::string& program);

}  // namespace openshell::cli::base_image
