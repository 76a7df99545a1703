// The gateway's durable state: SQLite in WAL mode, every change one
// transaction, written before the gateway acts on it. A gateway killed at
// any instant finds on restart either the state before a change or after it,
// never half of one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

struct sqlite3;

namespace openshell::auth {
class SecretBox;
}

namespace openshell::gateway {

enum class Phase {
  kProvisioning,  // created, the supervisor's session not yet reporting
  kReady,         // running, session connected
  kCompleted,     // the main process exited 0
  kError,         // it exited non-zero, or something failed (see conditions)
  kStopping,
  kStopped,
  kStarting,
  kDeleting,
};

std::string_view phase_name(Phase phase);  // "Provisioning", ...
std::optional<Phase> parse_phase(std::string_view name);

struct Condition {
  std::string type;    // "Ready"
  std::string status;  // "True", "False", "Unknown"
  std::string reason;  // "MainProcessFailed"
  std::string message;
  int64_t last_transition_ms = 0;  // milliseconds since the epoch
  bool operator==(const Condition&) const = default;
};

struct SandboxRecord {
  std::string id;    // 12 hex digits
  std::string name;  // a DNS label, unique
  Phase phase = Phase::kProvisioning;
  int64_t generation = 0;  // bumped by every launch
  std::optional<int> exit_code;
  std::vector<Condition> conditions;
  std::string spec;  // the sandbox spec, a JSON object as text
  std::map<std::string, std::string> labels;
  // The supervisor of the current generation: pid and start time (clock
  // ticks since boot, from /proc/PID/stat) so a reused pid is not mistaken.
  int64_t supervisor_pid = 0;
  uint64_t supervisor_start = 0;
  // What the gateway is carrying out, recorded before it acts: "" (nothing),
  // "launch", "stop", "delete".
  std::string intent;
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  // The principal that created it (gateway/principal.h); "" in a row made
  // before sandboxes had owners: the gateway owner's.
  std::string owner;
  bool operator==(const SandboxRecord&) const = default;
};

struct Event {
  int64_t seq = 0;
  std::string sandbox_id;
  int64_t time_ms = 0;
  std::string type;  // "Phase", "Warning", ...
  std::string message;
};

// One revision of a sandbox's policy (TOML text; "" means the default policy).
struct PolicyRevision {
  int64_t revision = 0;
  std::string text;
  int64_t created_ms = 0;
};

// A provider: credentials a sandbox's requests may carry without the sandbox
// ever holding them. Values rest sealed in gateway.db (see set_secret_box);
// a record read back holds them opened.
struct ProviderRecord {
  std::string name;                                // unique
  std::string type;                                // "generic", "github", "anthropic", "openai"
  std::map<std::string, std::string> credentials;  // KEY -> value
  std::vector<std::string> endpoints;              // HOST:PORT
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  bool operator==(const ProviderRecord&) const = default;
};

class ProviderTaken : public Error {
 public:
  explicit ProviderTaken(const std::string& name)
      : Error("provider '" + name + "' already exists") {}
};

// A port forward of a sandbox: the host's BIND:PORT to the sandbox's
// 127.0.0.1:PORT. One BIND:PORT is one forward; a sandbox's port is one
// forward. Removed with the sandbox.
struct ForwardRecord {
  std::string sandbox_id;
  std::string bind;
  uint16_t port = 0;
  int64_t created_ms = 0;
  bool operator==(const ForwardRecord&) const = default;
};

class ForwardTaken : public Error {
 public:
  explicit ForwardTaken(const std::string& where)
      : Error("a forward of " + where + " exists already") {}
};

class NameTaken : public Error {
 public:
  explicit NameTaken(const std::string& name) : Error("sandbox name '" + name + "' is taken") {}
};

class Store {
 public:
  // Opens or creates the database (mode 0600), WAL mode, synchronous=FULL,
  // and the schema (versioned in meta). Throws Error naming the file.
  static std::unique_ptr<Store> open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The calls body makes as one transaction (one commit, so one sync of
  // the log instead of one each); on any failure none of them took effect.
  void atomically(const std::string& what, const std::function<void()>& body);
  // The same, committed without waiting for the disk: safe from a crash of
  // this process (the log is written before the call returns), lost with
  // the machine's (power, the kernel) unless a later commit syncs it, as
  // every other commit does, in order. Only for what a machine's crash
  // makes void anyway: a supervisor's pid, which no reboot keeps alive.
  void atomically_unsynced(const std::string& what, const std::function<void()>& body);

  // Each call is one transaction; on any failure (a full disk included) it
  // throws Error with SQLite's reason and nothing changes.
  void insert(const SandboxRecord& record);  // NameTaken when the name exists
  void update(const SandboxRecord& record);  // by id; Error if there is none
  void remove(const std::string& id);        // and its events
  std::optional<SandboxRecord> find_by_name(std::string_view name) const;
  std::optional<SandboxRecord> find_by_id(std::string_view id) const;
  std::vector<SandboxRecord> list() const;  // oldest first
  // Changes whenever the database may have changed since: a write through
  // this Store (a statement's changed rows, or one rolled back), or a commit
  // by any other connection (SQLite's data_version). Equal revisions mean
  // that list() would read the same rows again, for a cache of what is
  // made from them. None inside an open transaction, whose writes may yet
  // be rolled back.
  struct Revision {
    int64_t own_changes = 0;
    int64_t data_version = 0;
    bool operator==(const Revision&) const = default;
  };
  std::optional<Revision> revision() const;

  // A bounded history per sandbox (the oldest beyond 1000 are dropped).
  void append_event(const std::string& sandbox_id, const std::string& type,
                    const std::string& message, int64_t time_ms);
  std::vector<Event> events(const std::string& sandbox_id, size_t limit) const;

  // Policy revisions, numbered from 1 per sandbox; removed with the sandbox.
  int64_t add_policy(const std::string& sandbox_id, const std::string& text, int64_t time_ms);
  std::vector<PolicyRevision> policies(const std::string& sandbox_id) const;
  // revision 0: the newest.
  std::optional<PolicyRevision> policy(const std::string& sandbox_id, int64_t revision) const;

  void set_meta(const std::string& key, const std::string& value);

  // Providers. Their credential values are sealed with the box given to
  // set_secret_box (the provider's name and the key as additional data, so a
  // value copied to another row does not open); without a box, writing or
  // reading a provider throws Error rather than keep a value in plain text.
  void set_secret_box(const auth::SecretBox* box) { box_ = box; }
  void insert_provider(const ProviderRecord& record);  // ProviderTaken when it exists
  void update_provider(const ProviderRecord& record);  // by name; Error if there is none
  // And its attachments; a caller refuses first when it is still attached.
  void remove_provider(const std::string& name);
  std::optional<ProviderRecord> find_provider(std::string_view name) const;
  std::vector<ProviderRecord> providers() const;  // by name
  // Attachments: idempotent. A sandbox's are removed with it.
  void attach_provider(const std::string& sandbox_id, const std::string& provider);
  void detach_provider(const std::string& sandbox_id, const std::string& provider);
  std::vector<std::string> providers_of(const std::string& sandbox_id) const;  // by name
  std::vector<std::string> sandboxes_of(const std::string& provider) const;    // ids

  // Forwards. ForwardTaken when the BIND:PORT is forwarded already, or the
  // sandbox forwards that port already (from another BIND).
  void insert_forward(const ForwardRecord& record);
  void remove_forward(const std::string& sandbox_id, uint16_t port);
  std::vector<ForwardRecord> forwards() const;  // oldest first
  std::vector<ForwardRecord> forwards_of(const std::string& sandbox_id) const;

  // How a sandbox's spec rests in the database: `seal` before every write,
  // `open` after every read (so callers see the spec as it was given);
  // `in_plain` tells a row written before (or without) sealing. Unset: the
  // spec as it is.
  struct SpecCodec {
    std::function<std::string(const std::string&id, const std::string&spec)> seal, open;
    std::function<bool(const std::string& spec)> in_plain;
  };
  void set_spec_codec(SpecCodec codec) { codec_ = std::move(codec); }
  // Rewrites, sealed, every row whose spec is in plain text, then empties
  // the write-ahead log (freed pages are zeroed: secure_delete), so that the
  // files keep no copy of the plain text. Returns how many rows changed.
  size_t reseal_specs();

 private:
  explicit Store(sqlite3* db);
  SandboxRecord sealed(SandboxRecord record) const;
  std::optional<SandboxRecord> opened(std::optional<SandboxRecord> record) const;
  sqlite3* db_;
  SpecCodec codec_;
  const auth::SecretBox* box_ = nullptr;
};

}  // namespace openshell::gateway
