#include "spec/sandbox_spec.h"

#include <cstdint>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/text.h"
#include "policy/policy.h"
#include "runtime/gpu.h"
#include "spec/ca_certs.h"

namespace openshell {

using nlohmann::json;

std::string check_label(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > 63) return "key must be 1-63 characters";
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.' || c == '/'))
      return std::string("key has an invalid character '") + c + "'";
  if (value.size() > 253) return "value is longer than 253 characters";
  for (char c : value)
    if (static_cast<unsigned char>(c) < 0x20) return "value has a control character";
  return {};
}

void SandboxSpec::validate() const {
  if (from.empty()) throw Error("--from: empty (give 'host', a directory or an image)");
  if (storage != "" && storage != "copy")
    throw Error("storage '" + storage + "': must be empty or 'copy'");
  for (const auto& e : env) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("--env " + e + ": expected KEY=VALUE");
  }
  if (user.find_first_of(std::string("\0\n", 2)) != std::string::npos || user == ":" ||
      (!user.empty() && (user.front() == ':' || user.back() == ':')))
    throw Error("--user " + user + ": expected UID[:GID] or NAME[:GROUP]");
  for (const auto& b : binds) {
    const std::string shown = "--bind " + b.source + ":" + b.target;
    if (b.source.empty() || b.source[0] != '/')
      throw Error(shown + ": the source must be absolute");
    if (b.target.empty() || b.target[0] != '/')
      throw Error(shown + ": the destination must be absolute");
  }
  if (cpus && (*cpus <= 0 || *cpus > 4096)) throw Error("--cpu: must be between 0 and 4096");
  if (memory_bytes && *memory_bytes < (4u << 20)) throw Error("--memory: below the minimum of 4M");
  if (pids && *pids > 4194304) throw Error("--pids: at most 4194304 (0: no limit)");
  if (tmp_size_bytes && *tmp_size_bytes < (1u << 20))
    throw Error("--tmp-size: below the minimum of 1M");
  if (shm_size_bytes && *shm_size_bytes < (1u << 20))
    throw Error("--shm-size: below the minimum of 1M");
  if (!restart.empty() && restart != "no" && restart != "on-failure" && restart != "unless-stopped")
    throw Error("--restart " + restart + ": must be no, on-failure or unless-stopped");
  if (tty && vm)
    throw Error(
        "--tty: not with --vm (the main process runs on the guest's console; exec -t has a "
        "terminal)");
  for (const auto& [k, v] : labels)
    if (auto why = check_label(k, v); !why.empty())
      throw Error("--label " + k + "=" + v + ": " + why);
  if (!policy.empty()) policy::parse(policy, policy_source.empty() ? "policy" : policy_source);
  for (size_t i = 0; i < ca_certs.size(); ++i)
    spec::pem_certificates(ca_certs[i], "certificate " + std::to_string(i + 1));
  if (vm) {
    using namespace limits;
    if (vm->vcpus < kMinVcpus || vm->vcpus > kMaxVcpus)
      throw Error("vm.vcpus " + std::to_string(vm->vcpus) + ": must be between " +
                  std::to_string(kMinVcpus) + " and " + std::to_string(kMaxVcpus));
    if (vm->memory_mib < kMinGuestMib || vm->memory_mib > kMaxGuestMib)
      throw Error("vm.memory_mib " + std::to_string(vm->memory_mib) + ": must be between " +
                  std::to_string(kMinGuestMib) + " and " + std::to_string(kMaxGuestMib) + " (MiB)");
    if (vm->kernel.empty() || vm->kernel[0] != '/')
      throw Error("vm.kernel '" + vm->kernel + "': must be an absolute path");
    // The guest's disk is the image's root as an ext4 file (supervisor/vm_disks.h).
    if (from == "host")
      throw Error("--vm needs an image: the host's root cannot be a guest's disk");
  }
  runtime::gpu::parse_request(gpu);
  if (vm && !gpu.empty())
    throw Error("--gpu: not with --vm (a micro-VM has no device passthrough)");
}

void SandboxSpec::apply_limit_defaults(const limits::Defaults& defaults, uint64_t total) {
  if (!pids) pids = defaults.pids.value_or(limits::kDefaultPids);
  if (!tmp_size_bytes)
    tmp_size_bytes = defaults.tmp_size.value_or(limits::default_tmp_size(memory_bytes, total));
  if (!shm_size_bytes)
    shm_size_bytes = defaults.shm_size.value_or(limits::default_shm_size(memory_bytes, total));
}

json SandboxSpec::limits_json() const {
  json j = json::object();
  if (pids) j["pids"] = *pids;
  if (memory_bytes) j["memory_bytes"] = *memory_bytes;
  if (cpus) j["cpus"] = *cpus;
  if (tmp_size_bytes) j["tmp_size_bytes"] = *tmp_size_bytes;
  if (shm_size_bytes) j["shm_size_bytes"] = *shm_size_bytes;
  return j;
}

std::string SandboxSpec::to_json() const {
  json j = {{"from", from},
            {"command", command},
            {"env", env},
            {"labels", labels},
            {"no_keep", no_keep},
            {"policy", policy},
            {"policy_source", policy_source}};
  if (cpus) j["cpus"] = *cpus;
  if (memory_bytes) j["memory_bytes"] = *memory_bytes;
  if (pids) j["pids"] = *pids;
  if (tmp_size_bytes) j["tmp_size_bytes"] = *tmp_size_bytes;
  if (shm_size_bytes) j["shm_size_bytes"] = *shm_size_bytes;
  if (host_uid_start && host_gid_start)
    j["host_ids"] = {{"uid_start", *host_uid_start}, {"gid_start", *host_gid_start}};
  if (image)
    j["image"] = {{"name", image->name},     {"id", image->id},
                  {"digest", image->digest}, {"layers", image->layers},
                  {"user", image->user},     {"working_dir", image->working_dir}};
  if (!ca_certs.empty()) j["ca_certs"] = ca_certs;
  if (!binds.empty()) {
    json list = json::array();
    for (const auto& b : binds)
      list.push_back({{"source", b.source}, {"target", b.target}, {"read_only", b.read_only}});
    j["binds"] = list;
  }
  if (!storage.empty()) j["storage"] = storage;
  if (!restart.empty()) j["restart"] = restart;
  if (!storage_note.empty()) j["storage_note"] = storage_note;
  if (!user.empty()) j["user"] = user;
  if (tty) j["tty"] = true;
  if (vm) j["vm"] = {{"vcpus", vm->vcpus}, {"memory_mib", vm->memory_mib}, {"kernel", vm->kernel}};
  if (!gpu.empty()) j["gpu"] = gpu;
  return j.dump();
}

SandboxSpec SandboxSpec::from_json(const std::string& text) {
  SandboxSpec s;
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw Error("sandbox spec: not a JSON object");
    s.from = j.value("from", std::string("host"));
    s.command = j.value("command", std::vector<std::string>{});
    s.env = j.value("env", std::vector<std::string>{});
    s.labels = j.value("labels", std::map<std::string, std::string>{});
    s.no_keep = j.value("no_keep", false);
    s.tty = j.value("tty", false);
    s.policy = j.value("policy", std::string());
    s.policy_source = j.value("policy_source", std::string());
    if (j.contains("cpus") && !j["cpus"].is_null()) s.cpus = j["cpus"].get<double>();
    if (j.contains("memory_bytes") && !j["memory_bytes"].is_null())
      s.memory_bytes = j["memory_bytes"].get<uint64_t>();
    if (j.contains("pids") && !j["pids"].is_null()) s.pids = j["pids"].get<uint64_t>();
    if (j.contains("tmp_size_bytes") && !j["tmp_size_bytes"].is_null())
      s.tmp_size_bytes = j["tmp_size_bytes"].get<uint64_t>();
    if (j.contains("shm_size_bytes") && !j["shm_size_bytes"].is_null())
      s.shm_size_bytes = j["shm_size_bytes"].get<uint64_t>();
    if (j.contains("host_ids") && j["host_ids"].is_object()) {
      s.host_uid_start = j["host_ids"].at("uid_start").get<uint32_t>();
      s.host_gid_start = j["host_ids"].at("gid_start").get<uint32_t>();
    }
    if (j.contains("image") && j["image"].is_object()) {
      const json& i = j["image"];
      SandboxImage image;
      image.name = i.value("name", std::string());
      image.id = i.value("id", std::string());
      image.digest = i.value("digest", std::string());
      image.layers = i.value("layers", std::vector<std::string>{});
      image.user = i.value("user", std::string());
      image.working_dir = i.value("working_dir", std::string());
      s.image = std::move(image);
    }
    s.ca_certs = j.value("ca_certs", std::vector<std::string>{});
    if (j.contains("binds") && j["binds"].is_array())
      for (const json& b : j["binds"])
        s.binds.push_back({b.at("source").get<std::string>(), b.at("target").get<std::string>(),
                           b.value("read_only", false)});
    s.storage = j.value("storage", std::string());
    s.restart = j.value("restart", std::string());
    s.storage_note = j.value("storage_note", std::string());
    s.user = j.value("user", std::string());
    s.gpu = j.value("gpu", std::string());
    if (j.contains("vm") && !j["vm"].is_null()) {
      const json& v = j["vm"];
      if (!v.is_object()) throw Error("sandbox spec: vm: not a JSON object");
      // json's get<> wraps a negative number into an unsigned one: checked first.
      for (const char* key : {"vcpus", "memory_mib"})
        if (v.contains(key) && !v[key].is_number_unsigned())
          throw Error(std::string("sandbox spec: vm.") + key + ": not a whole number");
      if (v.contains("vcpus") && v["vcpus"].get<uint64_t>() > UINT32_MAX)
        throw Error("sandbox spec: vm.vcpus: too large");
      SandboxVm vm;
      vm.vcpus = v.value("vcpus", vm.vcpus);
      vm.memory_mib = v.value("memory_mib", vm.memory_mib);
      vm.kernel = v.value("kernel", std::string());
      s.vm = std::move(vm);
    }
  } catch (const json::exception& e) {
    throw Error(std::string("sandbox spec: ") + e.what());
  }
  return s;
}

}  // namespace openshell
