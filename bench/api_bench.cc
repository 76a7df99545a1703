// api_bench: one API request's round trip over the gateway's Unix socket
// and over mutual TLS, side by side (see bench/run-tls-bench).
//
//   api_bench --target PATH [--runs N] [--warmup N]
//             --endpoint NAME=URL [--endpoint NAME=URL]...
//
// URL is a unix:// or https:// endpoint; https takes its credentials from
// OSH_BENCH_CA, OSH_BENCH_CERT and OSH_BENCH_KEY. Two figures per endpoint,
// interleaved round-robin so that drift hits them alike:
//   kept-alive: GET PATH on one connection that stays open (the request's
//               cost alone),
//   fresh:      a new connection, its TLS handshake included, and GET PATH.
// A JSON document on stdout: per endpoint and figure, every sample in ms.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/http.h"

namespace {

using openshell::net::Client;
using openshell::net::Endpoint;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "api_bench: %s\nusage: api_bench --target PATH [--runs N] [--warmup N] "
               "--endpoint NAME=URL...\n",
               why);
  std::exit(2);
}

struct Subject {
  std::string name;
  Endpoint endpoint;
  std::unique_ptr<Client> kept;
  std::vector<double> kept_ms, fresh_ms;
};

void get(Client& client, const std::string& target) {
  auto response = client.request("GET", target);
  if (response.status != 200) {
    std::fprintf(stderr, "api_bench: GET %s: %d %s\n", target.c_str(), response.status,
                 response.body.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string target;
  int runs = 1000, warmup = 50;
  std::vector<Subject> subjects;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    if (arg == "--target") {
      target = value();
    } else if (arg == "--runs") {
      runs = std::atoi(value().c_str());
    } else if (arg == "--warmup") {
      warmup = std::atoi(value().c_str());
    } else if (arg == "--endpoint") {
      std::string spec = value();
      auto eq = spec.find('=');
      if (eq == std::string::npos) usage("--endpoint takes NAME=URL");
      Subject s;
      s.name = spec.substr(0, eq);
      try {
        s.endpoint = Endpoint::parse(spec.substr(eq + 1));
      } catch (const std::exception& e) {
        usage(e.what());
      }
      if (s.endpoint.kind == Endpoint::Kind::kTls) {
        const char* ca = std::getenv("OSH_BENCH_CA");
        const char* cert = std::getenv("OSH_BENCH_CERT");
        const char* key = std::getenv("OSH_BENCH_KEY");
        if (!ca || !cert || !key) usage("an https endpoint needs OSH_BENCH_CA, _CERT and _KEY");
        s.endpoint.tls = {ca, cert, key};
      }
      subjects.push_back(std::move(s));
    } else {
      usage(("unexpected argument " + arg).c_str());
    }
  }
  if (target.empty() || subjects.empty() || runs < 1) usage("--target and --endpoint are needed");
  try {
    for (auto& s : subjects) s.kept = std::make_unique<Client>(s.endpoint);
    for (int round = 0; round < warmup + runs; ++round) {
      const bool counted = round >= warmup;
      for (size_t k = 0; k < subjects.size(); ++k) {
        // Each round starts one subject further on.
        Subject& s = subjects[(k + static_cast<size_t>(round)) % subjects.size()];
        auto start = Clock::now();
        get(*s.kept, target);
        if (counted) s.kept_ms.push_back(ms_since(start));
        start = Clock::now();
        {
          Client fresh(s.endpoint);
          get(fresh, target);
        }
        if (counted) s.fresh_ms.push_back(ms_since(start));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "api_bench: %s\n", e.what());
    return 1;
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& s : subjects)
    out[s.name] = {
        {"url", s.endpoint.url()}, {"kept_alive_ms", s.kept_ms}, {"fresh_ms", s.fresh_ms}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
