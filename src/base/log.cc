#include "base/log.h"

#include <time.h>
#include <unistd.h>

namespace openshell::log {

namespace {
bool g_verbose = false;
int g_file = -1;
bool g_json = false;
bool g_stderr = true;

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

const double g_start = now_ms();

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      static const char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void emit(const std::string& line, const char* level = "info") {
  // One write per line so that concurrent writers do not interleave mid-line.
  if (g_file >= 0) {
    std::string out;
    if (g_json) {
      timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      char when[64];
      tm parts;
      gmtime_r(&ts.tv_sec, &parts);
      strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &parts);
      const std::string msg = line.rfind("openshell: ", 0) == 0 ? line.substr(11) : line;
      out = std::string("{\"level\":\"") + level + "\",\"msg\":" + json_string(msg) +
            ",\"time\":\"" + when + "\"}\n";
    } else {
      out = line + "\n";
    }
    ssize_t ignored = ::write(g_file, out.data(), out.size());
    (void)ignored;
  }
  if (!g_stderr) return;
  std::string out = line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}
}  // namespace

void set_verbose(bool on) { g_verbose = on; }
bool verbose() { return g_verbose; }

void set_file(int fd, bool json, bool to_stderr) {
  g_file = fd;
  g_json = json;
  g_stderr = to_stderr;
}

void warn(const std::string& message) { emit("openshell: warning: " + message, "warning"); }

void debug(const std::string& message) {
  if (g_verbose) emit("openshell: " + message, "debug");
}

void error(const std::string& message) { emit("openshell: " + message, "error"); }

double elapsed_ms() { return now_ms() - g_start; }

}  // namespace openshell::log
