#include "cli/base_image.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "image/digest.h"
#include "image/pull.h"
#include "image/store.h"

namespace openshell::cli::base_image {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSuite = "bookworm";
constexpr const char* kPackages =
    "bash,coreutils,curl,ca-certificates,git,python3,python3-pip,python3-venv,iproute2,procps,"
    "less";

// What an image needs beyond the packages, and loses of what it does not
// need (package caches and lists, documentation, locales). A shell script
// with the root as $1, as mmdebstrap's hooks take it, so both tools run the
// same one. Device nodes go too (sandboxes get their own /dev): after
// debootstrap by kDropDevices, from mmdebstrap's archive by its
// --skip=output/dev (its hooks run with /dev bound in, which they cannot
// remove).
constexpr const char* kFinish = R"(set -e
chroot "$1" /usr/sbin/groupadd --gid 1000 sandbox
chroot "$1" /usr/sbin/useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash sandbox
mkdir -p "$1/sandbox"
chown 1000:1000 "$1/sandbox"
rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* \
  "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* \
  "$1"/var/log/*.log "$1"/var/log/apt/* "$1"/var/cache/debconf/*-old \
  "$1"/var/cache/ldconfig/aux-cache
find "$1/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
printf 'sandbox\n' >"$1/etc/hostname"
: >"$1/etc/resolv.conf"
)";

constexpr const char* kDropDevices = R"(find "$1/dev" -mindepth 1 -delete)";

bool is_archive_uri(std::string_view uri) {
  if (!(uri.starts_with("http://") || uri.starts_with("https://") || uri.starts_with("file://")))
    return false;
  return uri.find("-security") == std::string_view::npos;
}

std::string without_trailing_slash(std::string uri) {
  const size_t scheme = uri.find("://");
  const size_t keep = scheme == std::string::npos ? 1 : scheme + 4;  // "file:///" stays
  while (uri.size() > keep && uri.back() == '/') uri.pop_back();
  return uri;
}

std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename();
    if (name.ends_with(suffix)) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The "why" of a plan that fails, made into the one line that says what to
// run instead.
std::string cannot(const std::string& why) {
  return "the default image base cannot be built here: " + why +
         "; build it with 'openshell image build-base --mirror URL' (URL: a Debian mirror), "
         "or import one with 'openshell image import FILE base'";
}

std::string oci_architecture() {
  struct utsname u {};
  ::uname(&u);
  const std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  if (m.starts_with("arm")) return "arm";
  return m;
}

// Runs argv with its output into log, showing the progress line (elapsed
// seconds, redrawn on a terminal). Returns the exit status.
int run_logged(const std::vector<std::string>& argv, const std::string& log,
               const std::string& line) {
  const bool tty = ::isatty(2) == 1;
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork for " + argv[0], errno);
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || null < 0) _exit(127);
    ::dup2(null, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  const auto began = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) throw_errno("wait for " + argv[0], errno);
    if (tty) {
      auto s =
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - began)
              .count();
      std::fprintf(stderr, "\r%s: %llds", line.c_str(), static_cast<long long>(s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (tty) std::fprintf(stderr, "\r%s: done\n", line.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void fail_with_log(const std::string& what, const std::string& log) {
  std::string text = files::try_read(log).value_or("");
  std::vector<std::string> lines = text::split(text, '\n');
  size_t from = lines.size() > 20 ? lines.size() - 20 : 0;
  for (size_t i = from; i < lines.size(); ++i)
    if (!lines[i].empty()) std::fprintf(stderr, "  %s\n", lines[i].c_str());
  throw Error("building the default image base: " + what + " failed (its log's end above)");
}

// The OCI image layout of one uncompressed layer (layer_tar, moved into
// it) that openshell's import reads.
void write_layout(const std::string& dir, const std::string& layer_tar) {
  fs::create_directories(dir + "/blobs/sha256");
  image::Sha256 hash;
  {
    std::FILE* f = std::fopen(layer_tar.c_str(), "rb");
    if (!f) throw_errno("read " + layer_tar, errno);
    std::vector<char> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) hash.update(buf.data(), n);
    std::fclose(f);
  }
  const std::string layer_digest = hash.digest();
  const uint64_t layer_size = fs::file_size(layer_tar);
  auto blob = [&](const std::string& digest) { return dir + "/blobs/sha256/" + digest.substr(7); };
  fs::rename(layer_tar, blob(layer_digest));

  auto put = [&](const json& j) {
    const std::string text = j.dump();
    const std::string digest = image::sha256_digest(text);
    files::write_atomically(blob(digest), text, 0644);
    return json{{"digest", digest}, {"size", text.size()}};
  };
  char created[32];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &utc);
  json config = {
      {"created", created},
      {"architecture", oci_architecture()},
      {"os", "linux"},
      {"config",
       {{"Env",
         {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}},
        {"Labels",
         {{"org.opencontainers.image.title", "openshell base"},
          {"org.opencontainers.image.description",
           std::string("Debian ") + kSuite +
               " with bash, coreutils, curl, ca-certificates, git, python3 (pip, venv), "
               "iproute2, procps and less"}}}}},
      {"rootfs", {{"type", "layers"}, {"diff_ids", {layer_digest}}}},
  };
  json config_desc = put(config);
  config_desc["mediaType"] = "application/vnd.oci.image.config.v1+json";
  json manifest = {
      {"schemaVersion", 2},
      {"mediaType", "application/vnd.oci.image.manifest.v1+json"},
      {"config", config_desc},
      {"layers",
       {{{"mediaType", "application/vnd.oci.image.layer.v1.tar"},
         {"digest", layer_digest},
         {"size", layer_size}}}},
  };
  json manifest_desc = put(manifest);
  manifest_desc["mediaType"] = "application/vnd.oci.image.manifest.v1+json";
  manifest_desc["annotations"] = {{"org.opencontainers.image.ref.name", "latest"}};
  files::write_atomically(dir + "/index.json",
                          json{{"schemaVersion", 2}, {"manifests", {manifest_desc}}}.dump(), 0644);
  files::write_atomically(dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})", 0644);
}

}  // namespace

Host this_host(const std::string& mirror) {
  Host host;
  const char* root = std::getenv("OPENSHELL_APT_ROOT");
  host.apt_root = root ? root : "";
  const char* path = std::getenv("PATH");
  host.path = path ? path : "/usr/local/bin:/usr/bin:/bin";
  host.euid = ::geteuid();
  host.mirror = mirror;
  return host;
}

std::optional<std::string> mirror_in_sources(std::string_view deb822, std::string_view list) {
  for (const auto& raw : text::split(deb822, '\n')) {
    std::string_view line = text::trim(raw);
    if (!line.starts_with("URIs:")) continue;
    for (const auto& uri : text::split(text::trim(line.substr(5)), ' '))
      if (is_archive_uri(uri)) return without_trailing_slash(uri);
  }
  for (const auto& raw : text::split(list, '\n')) {
    std::string_view line = text::trim(raw);
    if (!line.starts_with("deb ") && !line.starts_with("deb\t")) continue;
    std::vector<std::string> words;
    for (const auto& w : text::split(line, ' '))
      if (!w.empty()) words.push_back(w);
    size_t i = 1;
    if (i < words.size() && words[i].starts_with("[")) {
      while (i < words.size() && words[i].find(']') == std::string::npos) ++i;
      ++i;
    }
    if (i < words.size() && is_archive_uri(words[i])) return without_trailing_slash(words[i]);
  }
  return std::nullopt;
}

std::optional<std::string> apt_mirror(const std::string& apt_root) {
  const std::string apt = apt_root + "/etc/apt";
  std::string deb822, list;
  for (const auto& f : files_in(apt + "/sources.list.d", ".sources"))
    deb822 += files::try_read(f).value_or("") + "\n";
  list += files::try_read(apt + "/sources.list").value_or("") + "\n";
  for (const auto& f : files_in(apt + "/sources.list.d", ".list"))
    list += files::try_read(f).value_or("") + "\n";
  return mirror_in_sources(deb822, list);
}

namespace {

struct HostPort {
  std::string host, port;
};

// "http://HOST[:PORT]/..." or "https://[V6]:PORT/..." -> its host and port.
HostPort host_port(const std::string& url) {
  const bool https = url.starts_with("https://");
  std::string rest = url.substr(url.find("://") + 3);
  rest = rest.substr(0, rest.find('/'));
  if (size_t at = rest.rfind('@'); at != std::string::npos) rest = rest.substr(at + 1);
  HostPort hp{rest, https ? "443" : "80"};
  if (rest.starts_with("[")) {
    size_t close = rest.find(']');
    hp.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') hp.port = rest.substr(close + 2);
  } else if (size_t colon = rest.rfind(':'); colon != std::string::npos) {
    hp.host = rest.substr(0, colon);
    hp.port = rest.substr(colon + 1);
  }
  return hp;
}

// "" when something accepts a TCP connection at hp within 3 s, else why
// not, for `what` ("the mirror", "the proxy").
std::string unreachable(const HostPort& hp, const std::string& what) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &found); rc != 0)
    return what + "'s host " + hp.host + " does not resolve (offline?): " + ::gai_strerror(rc);
  std::string why;
  for (addrinfo* a = found; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 3000) == 1) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    ::close(fd);
    if (err == 0) {
      ::freeaddrinfo(found);
      return "";
    }
    why = std::strerror(err);
  }
  ::freeaddrinfo(found);
  return "nothing answers at " + what + " " + hp.host + ":" + hp.port + " (offline?): " + why;
}

// Whether no_proxy (or NO_PROXY) exempts host, as apt and wget read it: a
// comma-separated list of names or domain suffixes, "*" for all.
bool proxy_exempt(const std::string& host) {
  const char* list = std::getenv("no_proxy");
  if (!list || !*list) list = std::getenv("NO_PROXY");
  if (!list) return false;
  for (std::string entry : text::split(list, ',')) {
    entry = std::string(text::trim(entry));
    if (entry == "*") return true;
    if (entry.starts_with(".")) entry.erase(0, 1);
    if (entry.empty()) continue;
    if (host == entry || (host.size() > entry.size() && host.ends_with("." + entry))) return true;
  }
  return false;
}

}  // namespace

std::string mirror_proxy(const std::string& mirror) {
  const bool https = mirror.starts_with("https://");
  if (!https && !mirror.starts_with("http://")) return "";
  if (proxy_exempt(host_port(mirror).host)) return "";
  const char* value = std::getenv(https ? "https_proxy" : "http_proxy");
  if (https && (!value || !*value)) value = std::getenv("HTTPS_PROXY");
  return value ? value : "";
}

std::string mirror_unreachable(const std::string& mirror) {
  if (mirror.starts_with("file://")) {
    const std::string dir = mirror.substr(7);
    return files::is_directory(dir) ? "" : "the mirror's directory " + dir + " does not exist";
  }
  const bool https = mirror.starts_with("https://");
  if (!https && !mirror.starts_with("http://"))
    return "the mirror " + mirror + " is not an http, https or file URL";
  // Through a proxy (apt, wget and so debootstrap and mmdebstrap use it),
  // the proxy is what must answer: the mirror may not even resolve here.
  if (std::string proxy = mirror_proxy(mirror); !proxy.empty()) {
    if (proxy.find("://") == std::string::npos) proxy = "http://" + proxy;
    if (std::string why = unreachable(host_port(proxy), "the proxy"); !why.empty())
      return why + " (from " + (https ? "https_proxy" : "http_proxy") + ", for the mirror " +
             mirror + ")";
    return "";
  }
  return unreachable(host_port(mirror), "the mirror");
}

std::string find_on_path(std::string_view path, const std::string& program) {
  for (const auto& dir : text::split(path, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0 && !files::is_directory(candidate)) return candidate;
  }
  return "";
}

Plan plan(const Host& host, bool check_reachable) {
  Plan p;
  if (!host.mirror.empty()) {
    p.mirror = without_trailing_slash(host.mirror);
  } else if (auto m = apt_mirror(host.apt_root)) {
    p.mirror = *m;
  } else {
    p.problem =
        cannot("apt names no Debian mirror (" + host.apt_root +
               "/etc/apt/sources.list.d/*.sources, " + host.apt_root + "/etc/apt/sources.list)");
    return p;
  }
  if (host.euid == 0) {
    if (!find_on_path(host.path, "debootstrap").empty())
      p.tool = "debootstrap";
    else if (!find_on_path(host.path, "mmdebstrap").empty())
      p.tool = "mmdebstrap";
    else
      p.problem =
          cannot("neither debootstrap nor mmdebstrap is on PATH (apt-get install debootstrap)");
  } else if (!find_on_path(host.path, "mmdebstrap").empty()) {
    p.tool = "mmdebstrap";
  } else {
    p.problem = cannot(
        "as an ordinary user it takes mmdebstrap, which is not on PATH (apt-get "
        "install mmdebstrap uidmap)");
  }
  if (p.ok() && check_reachable)
    if (std::string why = mirror_unreachable(p.mirror); !why.empty()) p.problem = cannot(why);
  return p;
}

void build(const Plan& plan, const std::string& images_dir, const std::string& name,
           const std::string& output) {
  if (!plan.ok()) throw Error(plan.problem);
  const std::string line = "building the default image " + name + ", one time, about a minute";
  const std::string proxy = mirror_proxy(plan.mirror);
  const std::string through = proxy.empty() ? "" : " through " + proxy;
  std::fprintf(stderr, "%s (%s from %s%s)\n", line.c_str(), plan.tool.c_str(), plan.mirror.c_str(),
               through.c_str());

  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/var/tmp") + "/openshell-base.XXXXXX";
  if (!::mkdtemp(pattern.data())) throw_errno("make a directory like " + pattern, errno);
  const std::string work = pattern;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};
  const std::string log = work + "/build.log";
  const std::string layer = work + "/layer.tar";

  if (plan.tool == "mmdebstrap") {
    std::vector<std::string> argv = {"mmdebstrap",
                                     ::geteuid() == 0 ? "--mode=root" : "--mode=unshare",
                                     "--variant=minbase",
                                     std::string("--include=") + kPackages,
                                     std::string("--customize-hook=") + kFinish,
                                     "--skip=output/dev",
                                     kSuite,
                                     layer,
                                     plan.mirror};
    if (run_logged(argv, log, line) != 0) fail_with_log("mmdebstrap", log);
  } else {
    const std::string root = work + "/root";
    if (run_logged({"debootstrap", "--variant=minbase", std::string("--include=") + kPackages,
                    kSuite, root, plan.mirror},
                   log, line) != 0)
      fail_with_log("debootstrap", log);
    if (run_logged({"sh", "-c", std::string(kFinish) + kDropDevices, "sh", root}, log,
                   "finishing") != 0)
      fail_with_log("finishing the root", log);
    if (run_logged({"tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", layer, "."}, log,
                   "packing") != 0)
      fail_with_log("packing the root", log);
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  write_layout(work + "/layout", layer);
  if (!output.empty()) {
    if (run_logged({"tar", "-C", work + "/layout", "-cf", output, "."}, log, "writing " + output) !=
        0)
      fail_with_log("writing " + output, log);
    std::fprintf(stderr, "wrote %s\n", output.c_str());
    return;
  }
  image::Store store(images_dir);
  image::ImportOptions options;
  options.name = name;
  image::ImageRecord record = image::import_image(store, work + "/layout", options);
  std::fprintf(stderr, "built %s (%s)\n", name.c_str(), text::format_bytes(record.size()).c_str());
}

}  // namespace openshell::cli::base_image
