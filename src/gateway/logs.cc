#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json_text.h"
#include "base/text.h"
#include "gateway/log_window.h"
#include "gateway/service.h"

namespace openshell::gateway {

void Gateway::logs(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  const net::Request& req = exchange->request();
  SandboxRecord record = find(name);
  // source=sandbox (the main process's output, the default) or network (the
  // egress proxy's decisions, one JSON object a line).
  std::string source = req.query.count("source") ? req.query.at("source") : "sandbox";
  if (source != "sandbox" && source != "network")
    throw ApiError(400, "bad_request",
                   "source must be 'sandbox' or 'network', not '" + source + "'");
  std::string path =
      paths_.sandbox(record.id) + (source == "network" ? "/logs/network.log" : "/logs/main.log");
  std::optional<size_t> tail;
  if (auto n = text::parse_uint(req.query.count("tail") ? req.query.at("tail") : "", 1u << 30))
    tail = static_cast<size_t>(*n);
  // since: nanoseconds since the epoch; only records from then on.
  std::optional<int64_t> since;
  if (req.query.count("since")) {
    auto ns = text::parse_uint(req.query.at("since"), INT64_MAX);
    if (!ns)
      throw ApiError(
          400, "bad_request",
          "since must be nanoseconds since the epoch, not '" + req.query.at("since") + "'");
    since = static_cast<int64_t>(*ns);
  }
  std::string content;
  files::read_into(path + ".1", &content);  // the older part, if the log rotated
  size_t older = content.size();
  files::read_into(path, &content);
  const size_t start = log_window_start(
      content, source == "network" ? LogKind::kNetwork : LogKind::kRecords, since, tail);
  std::string initial = content.substr(start);
  if (!req.websocket) return exchange->respond(net::Response{200, initial, "text/plain"});

  auto ws = exchange->upgrade();
  ws->start([](std::string, bool) {}, [](const std::string&) {});
  if (!initial.empty()) ws->send(initial, true);
  // Follow: poll the file (cheap, and it works across the supervisor's
  // rotation); end once the sandbox is finished and nothing more is written.
  struct Follow {
    UniqueFd fd;
    off_t offset;
    std::shared_ptr<asio::steady_timer> timer;
  };
  auto follow = std::make_shared<Follow>(Follow{
      UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)),
      static_cast<off_t>(content.size() - older), std::make_shared<asio::steady_timer>(io_)});
  std::string id = record.id;
  auto poll = std::make_shared<std::function<void()>>();
  *poll = [this, ws, follow, id, path, poll]() {
    if (!follow->fd) follow->fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    std::string more;
    auto drain = [&]() {
      char buf[65536];
      ssize_t n;
      while ((n = ::pread(follow->fd.get(), buf, sizeof buf, follow->offset)) > 0) {
        more.append(buf, static_cast<size_t>(n));
        follow->offset += n;
      }
    };
    if (follow->fd) {
      drain();
      // The supervisor rotated the log: finish the old file, go on with the new.
      struct stat open_st, path_st;
      if (::fstat(follow->fd.get(), &open_st) == 0 && ::stat(path.c_str(), &path_st) == 0 &&
          (open_st.st_ino != path_st.st_ino || open_st.st_dev != path_st.st_dev)) {
        drain();
        follow->fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        follow->offset = 0;
        if (follow->fd) drain();
      }
    }
    if (!more.empty()) ws->send(more, true);
    auto record = store_->find_by_id(id);
    bool over = !record || finished(record->phase) || record->phase == Phase::kDeleting;
    // The supervisor writes the last output before it reports the end.
    if (over && more.empty()) {
      json end = {{"type", "end"}};
      if (record) {
        end["phase"] = std::string(phase_name(record->phase));
        if (record->exit_code) end["exit_code"] = *record->exit_code;
      } else if (auto last = gone_.find(id); last != gone_.end()) {
        end["phase"] = last->second.value("phase", "");
        if (last->second.contains("exit_code")) end["exit_code"] = last->second["exit_code"];
      }
      ws->send(json_text(end), false);
      ws->close();
      *poll = nullptr;  // break the cycle
      return;
    }
    // Re-arming cancels the wait a wake-up by notify() overtook.
    follow->timer->expires_after(std::chrono::milliseconds(more.empty() ? 10 : 0));
    follow->timer->async_wait([poll](const boost::system::error_code& ec) {
      if (!ec && *poll) (*poll)();
    });
  };
  followers_[id].push_back(poll);
  (*poll)();
}

}  // namespace openshell::gateway
