// openshell sandbox delete: sandboxes named, or all of them, with everything
// they own.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

using nlohmann::json;

namespace {
constexpr size_t kDeleteWorkers = 8;  // requests in flight at most
constexpr size_t kBatchMax = 128;     // names in one request at most
}  // namespace

void add_sandbox_delete(CLI::App* sandbox, Action* action) {
  auto names = std::make_shared<std::vector<std::string>>();
  auto all = std::make_shared<bool>(false);
  CLI::App* c =
      sandbox->add_subcommand("delete", "Delete sandboxes: their processes, files and state");
  c->alias("rm");
  c->add_option("names", *names, "The sandboxes");
  c->add_flag("--all", *all, "Every sandbox of yours (those 'sandbox list' shows)");
  c->callback([names, all, action] {
    *action = [names, all] {
      if (*all == !names->empty()) throw Error("sandbox delete: give names or --all (not both)");
      GatewayClient client;
      std::vector<std::string> targets = *names;
      if (*all) {
        json list = client.call("GET", "/v1/sandboxes");
        for (const auto& s : list["sandboxes"]) targets.push_back(s.value("name", ""));
      }
      {  // a name given twice is deleted (and printed) once
        std::set<std::string> seen;
        std::erase_if(targets, [&](const std::string& n) { return !seen.insert(n).second; });
      }
      if (targets.empty()) return 0;  // --all of none
      if (targets.size() == 1) {
        client.call("DELETE", target(targets[0]));
        std::printf("%s\n", targets[0].c_str());
        return 0;
      }
      // Many: in batches (POST /v1/sandboxes:batchDelete), each answered
      // when all its sandboxes are gone; the gateway marks a batch in one
      // commit and kills its supervisors at once. Up to eight batches in
      // flight, each on a connection of its own, so 1000 go in eight
      // requests at most while each name still prints soon after it is
      // deleted (1000 single DELETEs, eight at a time, took 2.4 to 2.8 s).
      const size_t per_batch =
          std::clamp<size_t>((targets.size() + kDeleteWorkers - 1) / kDeleteWorkers, 1, kBatchMax);
      std::vector<json> batches;
      for (size_t i = 0; i < targets.size(); ++i) {
        if (i % per_batch == 0) batches.push_back(json::array());
        batches.back().push_back(targets[i]);
      }
      std::atomic<size_t> next{0};
      std::atomic<int> status{0};
      std::mutex out;
      auto work = [&](GatewayClient* own) {
        for (size_t i = next++; i < batches.size(); i = next++) {
          try {
            json answer =
                own->call("POST", "/v1/sandboxes:batchDelete", json{{"names", batches[i]}}.dump());
            std::lock_guard lock(out);
            for (const auto& n : answer.value("deleted", json::array()))
              std::printf("%s\n", n.get<std::string>().c_str());
            std::fflush(stdout);
            for (const auto& e : answer.value("errors", json::array())) {
              log::error(e.value("message", "deleting '" + e.value("name", "") + "' failed"));
              status = exit_code::kFailure;
            }
          } catch (const Error& e) {
            std::lock_guard lock(out);
            log::error(e.what());
            status = exit_code::kFailure;
          }
        }
      };
      const size_t workers = std::min<size_t>(kDeleteWorkers, batches.size());
      // The first worker is this thread, on `client`; the others' connections
      // are all made before any thread starts (a failure throws from here).
      std::vector<std::unique_ptr<GatewayClient>> clients;
      for (size_t w = 1; w < workers; ++w) clients.push_back(std::make_unique<GatewayClient>());
      std::vector<std::thread> threads;
      for (auto& own : clients) threads.emplace_back(work, own.get());
      work(&client);
      for (auto& t : threads) t.join();
      return status.load();
    };
  });
}

}  // namespace openshell::cli
