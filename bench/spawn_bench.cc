// spawn_bench: times whole-process start-up of several commands side by side.
//
//   spawn_bench [--runs N] [--warmup N] [--order rotate|fixed] [--wait-all] [--json]
//               --name NAME -- CMD [ARG...]
//               [--name NAME -- CMD [ARG...]]...
//
// Each command runs from a fresh posix_spawn to the return of wait4, with
// stdin, stdout and stderr on /dev/null. Runs are interleaved round-robin (one
// run of every command per round), so drift on a shared machine hits all
// commands alike; by default each round starts one command further on, so no
// command always follows the same neighbour. Warm-up rounds run the same way
// and are not counted.
//
// A command's arguments end at the next argument that is exactly "--name", or
// at the end of the line. In any argument the literal text "{n}" becomes the
// run's index (unique across all runs and commands), for tools that need a
// fresh name per run (e.g. a container id), and "{r}" the round's index
// (warm-up rounds included), the same for every command of a round: with
// --order fixed, the commands of a round can be the steps of one lifecycle
// (create {r}, use {r}, delete {r}).
//
// Peak RSS is ru_maxrss from wait4: the largest resident set of the reaped
// process or of any descendant it waited for itself (the largest single
// process of the tree, not a sum). CPU is user + system time of the same tree.
//
// spawn_bench is a child subreaper, so a process a command leaves behind
// (e.g. a sandbox's init that is still exiting when the command returns) is
// re-parented to it. By default such orphans are reaped without blocking
// after each run and only counted (a note on stderr, "strays" in JSON): the
// run ends when the command itself exits, which is when its caller learns the
// result. With --wait-all the run ends only when every process of the tree
// has exited, and the orphans' CPU time and peak RSS count too.
//
// Any run that exits non-zero or dies by a signal stops the benchmark: the
// command and its status are printed, the command is run once more with
// stderr shown, and spawn_bench exits 1. SIGINT, SIGTERM and SIGHUP are
// passed on to the running command; spawn_bench then exits 128 + signal.
#include <fcntl.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"

extern char** environ;

namespace {

// SIGINT, SIGTERM and SIGHUP are passed on to the command being run; the
// benchmark stops once that run has been reaped.
volatile sig_atomic_t g_signal = 0;
volatile pid_t g_child = 0;

void on_signal(int sig) {
  g_signal = sig;
  if (g_child > 0) ::kill(g_child, sig);
}

void forward_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

[[noreturn]] void stop_on_signal() {
  std::fprintf(stderr, "spawn_bench: stopped by signal %d (%s)\n", static_cast<int>(g_signal),
               ::sigdescr_np(g_signal));
  std::exit(128 + g_signal);
}

constexpr const char* kUsage =
    "usage: spawn_bench [--runs N] [--warmup N] [--order rotate|fixed] [--wait-all] [--json]\n"
    "                   --name NAME -- CMD [ARG...] [--name NAME -- CMD [ARG...]]...\n"
    "\n"
    "  --runs N       measured runs per command (default 100)\n"
    "  --warmup N     uncounted warm-up runs per command first (default 10)\n"
    "  --order MODE   rotate: each round starts one command further on (default);\n"
    "                 fixed: every round runs the commands in the order given\n"
    "  --wait-all     a run ends when every process it started has exited, not\n"
    "                 only the command (its orphans are ours: we are a subreaper)\n"
    "  --json         print JSON instead of a markdown table\n"
    "\n"
    "A command ends at the next \"--name\" argument. \"{n}\" in an argument is\n"
    "replaced by the run's index, unique across all runs; \"{r}\" by the round's\n"
    "index, the same for all commands of a round.\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "spawn_bench: %s\n\n%s", why.c_str(), kUsage);
  std::exit(2);
}

struct Command {
  std::string name;
  std::vector<std::string> argv;  // argv[0] resolved against PATH once, up front
};

struct Sample {
  double wall_ms;
  double cpu_ms;
  long maxrss_kib;
  int strays;  // orphans reaped right after this run (left by it or by an earlier one)
};

struct Options {
  int runs = 100;
  int warmup = 10;
  bool rotate = true;
  bool json = false;
  bool wait_all = false;
  std::vector<Command> commands;
};

int parse_count(const std::string& flag, const char* text, int min) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < min || v > 10'000'000)
    usage_error(flag + " needs a whole number >= " + std::to_string(min) + ", not '" + text + "'");
  return static_cast<int>(v);
}

// Finds a bare program name on PATH, as execvp would, so that the search is
// not part of the timed region.
std::string resolve(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string_view rest = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    size_t colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate.append("/").append(program);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  std::fprintf(stderr, "spawn_bench: %s: not found on PATH\n", program.c_str());
  std::exit(1);
}

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  auto value = [&](const std::string& flag) -> const char* {
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--runs") {
      o.runs = parse_count(a, value(a), 1);
    } else if (a == "--warmup") {
      o.warmup = parse_count(a, value(a), 0);
    } else if (a == "--order") {
      std::string m = value(a);
      if (m != "rotate" && m != "fixed") usage_error("--order is rotate or fixed, not '" + m + "'");
      o.rotate = m == "rotate";
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--wait-all") {
      o.wait_all = true;
    } else if (a == "--name") {
      Command c;
      c.name = value(a);
      if (c.name.empty()) usage_error("--name needs a non-empty name");
      if (i + 1 >= argc || std::string(argv[i + 1]) != "--")
        usage_error("--name " + c.name + " must be followed by -- and a command");
      ++i;
      while (i + 1 < argc && std::string(argv[i + 1]) != "--name") c.argv.push_back(argv[++i]);
      if (c.argv.empty()) usage_error("--name " + c.name + ": the command is empty");
      for (const auto& other : o.commands)
        if (other.name == c.name) usage_error("two commands are named " + c.name);
      c.argv[0] = resolve(c.argv[0]);
      o.commands.push_back(std::move(c));
    } else {
      usage_error("unexpected argument '" + a + "'");
    }
  }
  if (o.commands.empty()) usage_error("no commands: give --name NAME -- CMD ...");
  return o;
}

// "{n}" -> index, "{r}" -> round.
std::string substitute(const std::string& arg, long index, long round) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t n = arg.find("{n}", pos), r = arg.find("{r}", pos);
    size_t hit = std::min(n, r);
    out.append(arg, pos, hit == std::string::npos ? std::string::npos : hit - pos);
    if (hit == std::string::npos) return out;
    out += std::to_string(hit == n ? index : round);
    pos = hit + 3;
  }
}

std::string quoted(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty() && a.find_first_not_of(
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstu"
                                   "vwxyz0123456789-_./=:,+@%{}") == std::string::npos;
    if (plain) {
      out += a;
    } else {
      out += '\'';
      for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      out += '\'';
    }
  }
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    std::string s = "killed by signal " + std::to_string(WTERMSIG(status));
    if (const char* name = ::sigabbrev_np(WTERMSIG(status))) s += std::string(" (SIG") + name + ")";
    return s;
  }
  return "wait status " + std::to_string(status);
}

double ms_between(const timespec& a, const timespec& b) {
  return static_cast<double>(b.tv_sec - a.tv_sec) * 1e3 +
         static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e6;
}

double tv_ms(const timeval& tv) {
  return static_cast<double>(tv.tv_sec) * 1e3 + static_cast<double>(tv.tv_usec) / 1e3;
}

class Runner {
 public:
  explicit Runner(bool wait_all) : wait_all_(wait_all) {
    devnull_ = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull_ < 0) die_errno("open /dev/null");
    // Orphans of a command are re-parented to us, not to init, so that none
    // outlives its run unnoticed.
    if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) die_errno("PR_SET_CHILD_SUBREAPER");
  }

  // Runs argv once. quiet: stdio on /dev/null; otherwise stderr is inherited.
  // Returns the wait status; fills *sample.
  int run(const std::vector<std::string>& argv, bool quiet, Sample* sample) {
    std::vector<char*> cargv;
    cargv.reserve(argv.size() + 1);
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, devnull_, STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, devnull_, STDOUT_FILENO);
    if (quiet) posix_spawn_file_actions_adddup2(&actions, devnull_, STDERR_FILENO);

    timespec start{}, end{};
    rusage usage{};
    int status = 0;
    pid_t pid = -1;
    ::clock_gettime(CLOCK_MONOTONIC, &start);
    int err = ::posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
    if (err == 0) {
      g_child = pid;
      if (g_signal) ::kill(pid, g_signal);
      while (::wait4(pid, &status, 0, &usage) < 0) {
        if (errno != EINTR) die_errno("wait4");
      }
      g_child = 0;
    }
    // --wait-all: the run ends when the last process of its tree is gone.
    // Its orphans were re-parented to us before wait4 returned.
    int tree_orphans = 0;
    if (err == 0 && wait_all_) {
      rusage more{};
      int ignored;
      while (true) {
        pid_t got = ::wait4(-1, &ignored, 0, &more);
        if (got < 0) {
          if (errno == EINTR) continue;
          if (errno == ECHILD) break;
          die_errno("wait4");
        }
        ++tree_orphans;
        usage.ru_maxrss = std::max(usage.ru_maxrss, more.ru_maxrss);
        usage.ru_utime.tv_sec += more.ru_utime.tv_sec;
        usage.ru_utime.tv_usec += more.ru_utime.tv_usec;
        usage.ru_stime.tv_sec += more.ru_stime.tv_sec;
        usage.ru_stime.tv_usec += more.ru_stime.tv_usec;
      }
    }
    ::clock_gettime(CLOCK_MONOTONIC, &end);
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      std::fprintf(stderr, "spawn_bench: cannot start %s: %s\n", quoted(argv).c_str(),
                   std::strerror(err));
      std::exit(1);
    }
    sample->wall_ms = ms_between(start, end);
    sample->cpu_ms = tv_ms(usage.ru_utime) + tv_ms(usage.ru_stime);
    sample->maxrss_kib = usage.ru_maxrss;
    sample->strays = wait_all_ ? tree_orphans : reap_strays(argv);
    return status;
  }

 private:
  [[noreturn]] static void die_errno(const char* what) {
    std::fprintf(stderr, "spawn_bench: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
  }

  // Reaps orphans that were re-parented to us and have exited; names each
  // (its comm, read while it is still a zombie) so a leak can be traced.
  int reap_strays(const std::vector<std::string>& argv) {
    int count = 0;
    while (true) {
      siginfo_t info{};
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0)
        return count;
      pid_t stray = info.si_pid;
      std::string comm = "?";
      if (FILE* f = std::fopen(("/proc/" + std::to_string(stray) + "/comm").c_str(), "r")) {
        char buf[64] = {};
        if (std::fgets(buf, sizeof buf, f)) comm.assign(buf, strcspn(buf, "\n"));
        std::fclose(f);
      }
      int status = 0;
      if (::waitpid(stray, &status, 0) != stray) return count;
      ++count;
      if (++strays_shown_ <= kStraysShown)
        std::fprintf(stderr,
                     "spawn_bench: note: reaped stray process %d (%s, %s), orphaned by this or "
                     "an earlier run; this run: %s\n",
                     static_cast<int>(stray), comm.c_str(), describe_status(status).c_str(),
                     quoted(argv).c_str());
    }
  }

  static constexpr int kStraysShown = 3;
  bool wait_all_;
  int strays_shown_ = 0;
  int devnull_ = -1;
};

using bench::Stats;
using bench::stats_of;

struct Result {
  const Command* command;
  Stats wall;
  Stats cpu;
  long rss_min_kib, rss_median_kib, rss_max_kib;
  long strays;  // orphans reaped right after its measured runs
  std::vector<double> wall_samples;
};

using bench::json_string;

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void print_json(const Options& o, const std::vector<Result>& results) {
  utsname u{};
  ::uname(&u);
  std::printf("{\n  \"runs\": %d,\n  \"warmup\": %d,\n  \"order\": \"%s\",\n", o.runs, o.warmup,
              o.rotate ? "rotate" : "fixed");
  std::printf("  \"run_ends\": \"%s\",\n", o.wait_all ? "tree" : "command");
  std::printf("  \"kernel\": %s,\n  \"cpus\": %ld,\n  \"commands\": [\n",
              json_string(std::string(u.sysname) + " " + u.release).c_str(),
              ::sysconf(_SC_NPROCESSORS_ONLN));
  double base = results[0].wall.median;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("    {\n      \"name\": %s,\n      \"argv\": [",
                json_string(r.command->name).c_str());
    for (size_t j = 0; j < r.command->argv.size(); ++j)
      std::printf("%s%s", j ? ", " : "", json_string(r.command->argv[j]).c_str());
    std::printf("],\n");
    auto stats = [](const char* key, const Stats& s) {
      std::printf(
          "      \"%s\": {\"median\": %.4f, \"p10\": %.4f, \"p90\": %.4f, \"mean\": %.4f, "
          "\"min\": %.4f, \"max\": %.4f},\n",
          key, s.median, s.p10, s.p90, s.mean, s.min, s.max);
    };
    stats("wall_ms", r.wall);
    stats("cpu_ms", r.cpu);
    std::printf(
        "      \"peak_rss_kib\": {\"min\": %ld, \"median\": %ld, \"max\": %ld},\n"
        "      \"strays_reaped_after\": %ld,\n"
        "      \"ratio_to_first_median\": %.4f,\n      \"wall_ms_samples\": [",
        r.rss_min_kib, r.rss_median_kib, r.rss_max_kib, r.strays, r.wall.median / base);
    for (size_t j = 0; j < r.wall_samples.size(); ++j)
      std::printf("%s%.4f", j ? ", " : "", r.wall_samples[j]);
    std::printf("]\n    }%s\n", i + 1 < results.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

void print_table(const Options& o, const std::vector<Result>& results) {
  utsname u{};
  ::uname(&u);
  std::printf(
      "%d runs per command after %d warm-up, interleaved (%s order); a run ends when %s; "
      "%s %s, %ld CPUs.\n\n",
      o.runs, o.warmup, o.rotate ? "rotating" : "fixed",
      o.wait_all ? "every process it started has exited" : "the command exits", u.sysname,
      u.release, ::sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "| command | median ms | p10 ms | p90 ms | mean ms | min ms | max ms | CPU ms (median) | "
      "peak RSS (max) | vs %s |\n",
      results[0].command->name.c_str());
  std::printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  double base = results[0].wall.median;
  for (const Result& r : results) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %ld KiB (%s MiB) | %sx |\n",
                r.command->name.c_str(), fmt("%.2f", r.wall.median).c_str(),
                fmt("%.2f", r.wall.p10).c_str(), fmt("%.2f", r.wall.p90).c_str(),
                fmt("%.2f", r.wall.mean).c_str(), fmt("%.2f", r.wall.min).c_str(),
                fmt("%.2f", r.wall.max).c_str(), fmt("%.2f", r.cpu.median).c_str(), r.rss_max_kib,
                fmt("%.2f", static_cast<double>(r.rss_max_kib) / 1024.0).c_str(),
                fmt("%.2f", r.wall.median / base).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const size_t n = o.commands.size();
  std::vector<std::vector<Sample>> samples(n);
  for (auto& s : samples) s.reserve(static_cast<size_t>(o.runs));

  forward_signals();
  Runner runner(o.wait_all);
  long index = 0;
  const int rounds = o.warmup + o.runs;
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < n; ++k) {
      size_t c = o.rotate ? (static_cast<size_t>(round) + k) % n : k;
      const Command& cmd = o.commands[c];
      std::vector<std::string> args;
      args.reserve(cmd.argv.size());
      for (const auto& a : cmd.argv) args.push_back(substitute(a, index, round));
      ++index;

      Sample s{};
      int status = runner.run(args, true, &s);
      if (g_signal) stop_on_signal();
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "spawn_bench: %s (round %d) FAILED: %s\n  command: %s\n",
                     cmd.name.c_str(), round, describe_status(status).c_str(),
                     quoted(args).c_str());
        std::vector<std::string> again;
        for (const auto& a : cmd.argv) again.push_back(substitute(a, index, round));
        std::fprintf(stderr, "spawn_bench: running it once more with stderr shown:\n  %s\n",
                     quoted(again).c_str());
        std::fflush(stderr);
        Sample ignored{};
        int again_status = runner.run(again, false, &ignored);
        std::fprintf(stderr, "spawn_bench: that run ended with %s\n",
                     describe_status(again_status).c_str());
        return 1;
      }
      if (round >= o.warmup) samples[c].push_back(s);
    }
  }

  std::vector<Result> results;
  for (size_t c = 0; c < n; ++c) {
    Result r{};
    r.command = &o.commands[c];
    std::vector<double> wall, cpu;
    std::vector<long> rss;
    for (const Sample& s : samples[c]) {
      wall.push_back(s.wall_ms);
      cpu.push_back(s.cpu_ms);
      rss.push_back(s.maxrss_kib);
      r.strays += s.strays;
    }
    r.wall_samples = wall;
    r.wall = stats_of(wall);
    r.cpu = stats_of(cpu);
    std::sort(rss.begin(), rss.end());
    r.rss_min_kib = rss.front();
    r.rss_median_kib = rss[rss.size() / 2];
    r.rss_max_kib = rss.back();
    results.push_back(std::move(r));
  }
  for (const Result& r : results) {
    if (r.strays == 0) continue;
    if (o.wait_all)
      std::fprintf(stderr,
                   "spawn_bench: note: measured runs of %s left %ld orphaned processes, waited "
                   "for within their runs (--wait-all)\n",
                   r.command->name.c_str(), r.strays);
    else
      std::fprintf(stderr,
                   "spawn_bench: note: %ld orphaned processes were reaped right after measured "
                   "runs of %s (they may have been left by the run before); --wait-all counts "
                   "them in\n",
                   r.strays, r.command->name.c_str());
  }
  if (o.json)
    print_json(o, results);
  else
    print_table(o, results);
  return 0;
}
