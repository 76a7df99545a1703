#include "gateway/store.h"

// <utility> first, before nlohmann-json with GCC 12; kept out of sorting.
// clang-format off
#include <utility>
#include <nlohmann/json.hpp>
// clang-format on

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include <sqlite3.h>

#include "auth/secrets.h"
#include "base/json_text.h"
#include "base/log.h"
#include "base/unique_fd.h"

namespace openshell::gateway {
namespace {

using json = nlohmann::json;

constexpr int64_t kSchemaVersion = 1;
constexpr int64_t kMaxEventsPerSandbox = 1000;
constexpr int kBusyTimeoutMs = 5000;

constexpr std::string_view kSchema = R"sql(
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  phase TEXT NOT NULL,
  generation INTEGER NOT NULL,
  exit_code INTEGER NULL,
  conditions TEXT NOT NULL,
  spec TEXT NOT NULL,
  labels TEXT NOT NULL,
  supervisor_pid INTEGER NOT NULL,
  supervisor_start INTEGER NOT NULL,
  intent TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  sandbox_id TEXT NOT NULL,
  time_ms INTEGER NOT NULL,
  type TEXT NOT NULL,
  message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_sandbox ON events (sandbox_id, seq);
CREATE TABLE IF NOT EXISTS policies (
  sandbox_id TEXT NOT NULL,
  revision INTEGER NOT NULL,
  text TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY (sandbox_id, revision)
);
CREATE TABLE IF NOT EXISTS providers (
  name TEXT PRIMARY KEY,
  type TEXT NOT NULL,
  credentials TEXT NOT NULL,
  endpoints TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS provider_attachments (
  sandbox_id TEXT NOT NULL,
  provider TEXT NOT NULL,
  PRIMARY KEY (sandbox_id, provider)
);
CREATE TABLE IF NOT EXISTS forwards (
  sandbox_id TEXT NOT NULL,
  bind TEXT NOT NULL,
  port INTEGER NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY (bind, port),
  UNIQUE (sandbox_id, port)
);
)sql";

constexpr const char* kSandboxColumns =
    "id, name, phase, generation, exit_code, conditions, spec, labels, supervisor_pid, "
    "supervisor_start, intent, created_ms, updated_ms, owner";

struct PhaseName {
  Phase phase;
  std::string_view name;
};
constexpr PhaseName kPhaseNames[] = {
    {Phase::kProvisioning, "Provisioning"}, {Phase::kReady, "Ready"},
    {Phase::kCompleted, "Completed"},       {Phase::kError, "Error"},
    {Phase::kStopping, "Stopping"},         {Phase::kStopped, "Stopped"},
    {Phase::kStarting, "Starting"},         {Phase::kDeleting, "Deleting"},
};

// The file as SQLite knows it (its full path), for error messages.
std::string db_path(sqlite3* db) {
  const char* name = sqlite3_db_filename(db, "main");
  return name && *name ? name : "gateway.db";
}

// A failed SQLite call: "PATH: SQLite's message", and the extended result
// code so that callers can tell a taken name from other failures.
class SqliteError : public Error {
 public:
  SqliteError(sqlite3* db, int code)
      : Error(db_path(db) + ": " + reason_of(db, code)),
        code_(code),
        reason_(reason_of(db, code)) {}
  int code() const { return code_; }
  const std::string& reason() const { return reason_; }

 private:
  static std::string reason_of(sqlite3* db, int code) {
    // sqlite3_errmsg describes the most recent failure on this connection;
    // fall back on the code's generic text when it has been overwritten.
    if (sqlite3_extended_errcode(db) == code) return sqlite3_errmsg(db);
    return sqlite3_errstr(code);
  }
  int code_;
  std::string reason_;
};

[[noreturn]] void fail(sqlite3* db, int code) { throw SqliteError(db, code); }

// Prepared statements kept for reuse, by connection and SQL text: the
// gateway runs the same few dozen for every request, and SQLite's parser
// was 15% of its time in a `delete --all` when each was prepared afresh. A
// statement in use is taken out; it comes back reset, its bindings
// cleared. forget() finalizes a connection's before it closes.
class StatementCache {
 public:
  sqlite3_stmt* take(sqlite3* db, const std::string& sql) {
    std::lock_guard lock(mutex_);
    auto it = idle_.find({db, sql});
    if (it == idle_.end()) return nullptr;
    sqlite3_stmt* stmt = it->second;
    idle_.erase(it);
    return stmt;
  }
  void give_back(sqlite3* db, std::string sql, sqlite3_stmt* stmt) {
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    std::lock_guard lock(mutex_);
    idle_.emplace(std::make_pair(db, std::move(sql)), stmt);
  }
  void forget(sqlite3* db) {
    std::lock_guard lock(mutex_);
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (it->first.first != db) {
        ++it;
        continue;
      }
      sqlite3_finalize(it->second);
      it = idle_.erase(it);
    }
  }

 private:
  std::mutex mutex_;
  std::multimap<std::pair<sqlite3*, std::string>, sqlite3_stmt*> idle_;
};

StatementCache& statements() {
  static StatementCache* cache = new StatementCache;  // outlives every Store
  return *cache;
}

// A prepared statement (from the cache, or prepared now), given back on
// scope exit. Parameters are numbered from 1, columns from 0, as in
// SQLite's API.
class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql) : db_(db), sql_(sql) {
    stmt_ = statements().take(db, sql_);
    if (stmt_) return;
    int rc = sqlite3_prepare_v3(db, sql_.data(), static_cast<int>(sql_.size()),
                                SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr);
    if (rc != SQLITE_OK) fail(db_, sqlite3_extended_errcode(db_));
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() {
    if (stmt_) statements().give_back(db_, std::move(sql_), stmt_);
  }

  Statement& bind(int index, std::string_view text) {
    // A null pointer would bind NULL, not an empty text.
    const char* data = text.data() ? text.data() : "";
    return check(
        sqlite3_bind_text64(stmt_, index, data, text.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  Statement& bind(int index, int64_t value) {
    return check(sqlite3_bind_int64(stmt_, index, value));
  }
  Statement& bind_null(int index) { return check(sqlite3_bind_null(stmt_, index)); }

  // True when a row is ready, false when the statement is done.
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(db_, sqlite3_extended_errcode(db_));
  }
  // Runs a statement that returns no rows.
  void run() {
    while (step()) {
    }
  }

  bool is_null(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
  int64_t int64(int column) const { return sqlite3_column_int64(stmt_, column); }
  std::string text(int column) const {
    const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    int size = sqlite3_column_bytes(stmt_, column);
    return data ? std::string(data, static_cast<size_t>(size)) : std::string();
  }

 private:
  Statement& check(int rc) {
    if (rc != SQLITE_OK) fail(db_, rc);
    return *this;
  }
  sqlite3* db_;
  std::string sql_;
  sqlite3_stmt* stmt_ = nullptr;
};

void execute(sqlite3* db, std::string_view sql) { Statement(db, sql).run(); }

// Runs several statements without parameters (the schema).
void execute_script(sqlite3* db, std::string_view sql) {
  std::string script(sql);
  int rc = sqlite3_exec(db, script.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) fail(db, sqlite3_extended_errcode(db));
}

// BEGIN IMMEDIATE now; ROLLBACK on scope exit unless committed. SQLite may
// already have rolled back after some failures (a full disk among them), so
// it is asked whether a transaction is still open.
// Inside another (Store::atomically) it is part of that one: it neither
// begins nor commits nor rolls back; the outer one does.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db), nested_(!sqlite3_get_autocommit(db)) {
    if (!nested_) execute(db_, "BEGIN IMMEDIATE");
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    if (!nested_ && !sqlite3_get_autocommit(db_))
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    if (!nested_) execute(db_, "COMMIT");
  }

 private:
  sqlite3* db_;
  bool nested_;
};

// Runs body as one transaction; a failure of SQLite's becomes
// Error("PATH: WHAT: reason") and leaves the database as it was.
template <typename Body>
void write_transaction(sqlite3* db, const std::string& what, Body&& body) {
  try {
    Transaction transaction(db);
    body();
    transaction.commit();
  } catch (const SqliteError& e) {
    throw Error(db_path(db) + ": " + what + ": " + e.reason());
  }
}

std::string conditions_to_json(const std::vector<Condition>& conditions) {
  json array = json::array();
  for (const Condition& c : conditions)
    array.push_back({{"type", c.type},
                     {"status", c.status},
                     {"reason", c.reason},
                     {"message", c.message},
                     {"last_transition_ms", c.last_transition_ms}});
  return json_text(array);  // a message may quote what a sandbox or its image holds
}

std::vector<Condition> conditions_from_json(const std::string& text) {
  json array = json::parse(text);
  if (!array.is_array()) throw Error("not a JSON array");
  std::vector<Condition> conditions;
  for (const json& item : array) {
    Condition c;
    c.type = item.at("type").get<std::string>();
    c.status = item.at("status").get<std::string>();
    c.reason = item.at("reason").get<std::string>();
    c.message = item.at("message").get<std::string>();
    c.last_transition_ms = item.at("last_transition_ms").get<int64_t>();
    conditions.push_back(std::move(c));
  }
  return conditions;
}

std::string labels_to_json(const std::map<std::string, std::string>& labels) {
  return json_text(json(labels));
}

std::map<std::string, std::string> labels_from_json(const std::string& text) {
  json object = json::parse(text);
  if (!object.is_object()) throw Error("not a JSON object");
  return object.get<std::map<std::string, std::string>>();
}

// Binds the record's columns as ?1..?13 in kSandboxColumns' order.
void bind_record(sqlite3* db, Statement& statement, const SandboxRecord& record) {
  std::string conditions, labels;
  try {
    conditions = conditions_to_json(record.conditions);
    labels = labels_to_json(record.labels);
  } catch (const json::exception& e) {
    // Strings that are not UTF-8 cannot be written as JSON.
    throw Error(db_path(db) + ": sandbox '" + record.name + "': " + e.what());
  }
  statement.bind(1, record.id).bind(2, record.name).bind(3, phase_name(record.phase));
  statement.bind(4, record.generation);
  if (record.exit_code)
    statement.bind(5, int64_t{*record.exit_code});
  else
    statement.bind_null(5);
  statement.bind(6, conditions).bind(7, record.spec).bind(8, labels);
  statement.bind(9, record.supervisor_pid);
  // Stored as the same 64 bits, so that every value comes back unchanged.
  statement.bind(10, static_cast<int64_t>(record.supervisor_start));
  statement.bind(11, record.intent).bind(12, record.created_ms).bind(13, record.updated_ms);
  statement.bind(14, record.owner);
}

// The row the statement is on, its columns in kSandboxColumns' order.
SandboxRecord read_record(sqlite3* db, const Statement& row) {
  SandboxRecord record;
  record.id = row.text(0);
  record.name = row.text(1);
  auto bad_row = [&](const std::string& what) {
    return Error(db_path(db) + ": sandbox '" + record.name + "' (" + record.id + "): " + what);
  };
  std::string phase = row.text(2);
  std::optional<Phase> parsed = parse_phase(phase);
  // A phase written by a newer openshell: acting on a guess could undo what
  // that version did, so refuse.
  if (!parsed) throw bad_row("unknown phase '" + phase + "'");
  record.phase = *parsed;
  record.generation = row.int64(3);
  if (!row.is_null(4)) {
    int64_t exit_code = row.int64(4);
    if (exit_code < std::numeric_limits<int>::min() || exit_code > std::numeric_limits<int>::max())
      throw bad_row("exit code " + std::to_string(exit_code) + " out of range");
    record.exit_code = static_cast<int>(exit_code);
  }
  try {
    record.conditions = conditions_from_json(row.text(5));
  } catch (const std::exception& e) {
    throw bad_row(std::string("conditions: ") + e.what());
  }
  record.spec = row.text(6);
  try {
    record.labels = labels_from_json(row.text(7));
  } catch (const std::exception& e) {
    throw bad_row(std::string("labels: ") + e.what());
  }
  record.supervisor_pid = row.int64(8);
  record.supervisor_start = static_cast<uint64_t>(row.int64(9));
  record.intent = row.text(10);
  record.created_ms = row.int64(11);
  record.updated_ms = row.int64(12);
  record.owner = row.text(13);
  return record;
}

std::optional<SandboxRecord> find_one(sqlite3* db, const char* column, std::string_view value) {
  Statement statement(
      db, std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE " + column + " = ?1");
  statement.bind(1, value);
  if (!statement.step()) return std::nullopt;
  return read_record(db, statement);
}

// Creates the file with mode 0600 if it is missing, and narrows the mode of
// one that others may read; SQLite gives its -wal and -shm files the
// database's mode. An existing file is never opened here: closing a
// descriptor of it would drop the POSIX locks that SQLite connections of
// this process hold on it.
void create_private_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) throw_errno("stat " + path);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (fd || errno != EEXIST) {
      if (!fd) throw_errno("create " + path);
      return;
    }
    if (::stat(path.c_str(), &st) != 0) throw_errno("stat " + path);  // created meanwhile
  }
  if ((st.st_mode & 0077) != 0 && ::chmod(path.c_str(), 0600) != 0) throw_errno("chmod " + path);
}

// Reads and checks the schema version inside the open transaction; nullopt
// for a new database.
std::optional<int64_t> schema_version(sqlite3* db) {
  Statement statement(db, "SELECT value FROM meta WHERE key = 'schema_version'");
  if (!statement.step()) return std::nullopt;
  std::string text = statement.text(0);
  int64_t version = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), version);
  if (ec != std::errc() || end != text.data() + text.size() || version < 1)
    throw Error(db_path(db) + ": schema version '" + text + "' is not understood");
  if (version > kSchemaVersion)
    throw Error(db_path(db) + ": schema version " + text +
                " is newer than this openshell understands");
  return version;
}

void set_up(sqlite3* db) {
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  {
    Statement statement(db, "PRAGMA journal_mode=WAL");
    std::string mode = statement.step() ? statement.text(0) : "";
    if (mode != "wal")
      throw Error(db_path(db) + ": cannot use write-ahead logging (journal mode is '" + mode +
                  "')");
  }
  execute(db, "PRAGMA synchronous=FULL");
  execute(db, "PRAGMA foreign_keys=ON");
  // What is deleted or overwritten is zeroed, not left in free pages.
  execute(db, "PRAGMA secure_delete=ON");

  Transaction transaction(db);
  execute(db, "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
  // Checked before anything else is created: a newer schema is not ours to touch.
  std::optional<int64_t> version = schema_version(db);
  execute_script(db, kSchema);
  // The owner came after the first schema: a column added in place (the
  // rows made before it read as owned by ''), not a new version, so that
  // an older openshell still opens the file (it names its columns).
  bool has_owner = false;
  {
    Statement columns(db, "PRAGMA table_info(sandboxes)");
    while (columns.step())
      if (columns.text(1) == "owner") has_owner = true;
  }
  if (!has_owner) execute(db, "ALTER TABLE sandboxes ADD COLUMN owner TEXT NOT NULL DEFAULT ''");
  if (!version) {
    Statement statement(db, "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)");
    statement.bind(1, std::to_string(kSchemaVersion)).run();
  }
  transaction.commit();
}

// The additional data a provider's value is sealed with: its name and key,
// NUL-separated (neither may hold a NUL).
std::string credential_aad(const std::string& provider, const std::string& key) {
  return "provider\0" + provider + '\0' + key;
}

constexpr const char* kProviderColumns =
    "name, type, credentials, endpoints, created_ms, updated_ms";

std::string seal_credentials(sqlite3* db, const auth::SecretBox* box,
                             const ProviderRecord& record) {
  if (!box) throw Error(db_path(db) + ": provider '" + record.name + "': no key to seal it with");
  json sealed = json::object();
  for (const auto& [key, value] : record.credentials)
    sealed[key] = box->seal(value, credential_aad(record.name, key));
  return json_text(sealed);
}

ProviderRecord read_provider(sqlite3* db, const auth::SecretBox* box, const Statement& row) {
  ProviderRecord record;
  record.name = row.text(0);
  record.type = row.text(1);
  auto bad_row = [&](const std::string& what) {
    return Error(db_path(db) + ": provider '" + record.name + "': " + what);
  };
  if (!box) throw bad_row("no key to open it with");
  try {
    json credentials = json::parse(row.text(2));
    for (const auto& [key, sealed] : credentials.items())
      record.credentials[key] =
          box->open(sealed.get<std::string>(), credential_aad(record.name, key));
    record.endpoints = json::parse(row.text(3)).get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw bad_row(e.what());
  } catch (const Error& e) {
    throw bad_row(e.what());
  }
  record.created_ms = row.int64(4);
  record.updated_ms = row.int64(5);
  return record;
}

struct CloseDb {
  void operator()(sqlite3* db) const {
    statements().forget(db);
    sqlite3_close_v2(db);
  }
};

}  // namespace

std::string_view phase_name(Phase phase) {
  for (const PhaseName& entry : kPhaseNames)
    if (entry.phase == phase) return entry.name;
  return "Unknown";
}

std::optional<Phase> parse_phase(std::string_view name) {
  for (const PhaseName& entry : kPhaseNames)
    if (entry.name == name) return entry.phase;
  return std::nullopt;
}

std::unique_ptr<Store> Store::open(const std::string& path) {
  create_private_file(path);
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  std::unique_ptr<sqlite3, CloseDb> db(raw);
  if (rc != SQLITE_OK) {
    if (!db) throw Error(path + ": " + sqlite3_errstr(rc));
    throw Error(path + ": " + sqlite3_errmsg(db.get()));
  }
  try {
    set_up(db.get());
  } catch (const SqliteError& e) {
    throw Error(path + ": " + e.reason());
  }
  return std::unique_ptr<Store>(new Store(db.release()));
}

Store::Store(sqlite3* db) : db_(db) {}

Store::~Store() {
  statements().forget(db_);
  sqlite3_close_v2(db_);
}

void Store::atomically(const std::string& what, const std::function<void()>& body) {
  write_transaction(db_, what, body);
}

void Store::atomically_unsynced(const std::string& what, const std::function<void()>& body) {
  // Inside another transaction it is part of that one, synced with it.
  if (!sqlite3_get_autocommit(db_)) return write_transaction(db_, what, body);
  // WAL with synchronous=NORMAL: the commit's frames are written, not
  // synced; the next FULL commit's sync covers them, the log being one
  // file. Should the pragma fail, the commit is synced as any other.
  sqlite3_exec(db_, "PRAGMA synchronous=NORMAL", nullptr, nullptr, nullptr);
  struct Resync {
    sqlite3* db;
    ~Resync() {
      if (sqlite3_exec(db, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr) != SQLITE_OK)
        log::error(db_path(db) + ": cannot set synchronous=FULL again: " + sqlite3_errmsg(db));
    }
  } resync{db_};
  write_transaction(db_, what, body);
}

void Store::insert(const SandboxRecord& record) {
  write_transaction(db_, "insert sandbox '" + record.name + "'", [&] {
    Statement statement(
        db_, std::string("INSERT INTO sandboxes (") + kSandboxColumns +
                 ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
    bind_record(db_, statement, sealed(record));
    try {
      statement.run();
    } catch (const SqliteError& e) {
      // The name is the only UNIQUE column; a taken id is a primary key's
      // failure and stays a plain error.
      if (e.code() == SQLITE_CONSTRAINT_UNIQUE) throw NameTaken(record.name);
      throw;
    }
  });
}

void Store::update(const SandboxRecord& record) {
  write_transaction(db_, "update sandbox '" + record.name + "' (" + record.id + ")", [&] {
    Statement statement(db_,
                        "UPDATE sandboxes SET name = ?2, phase = ?3, generation = ?4, "
                        "exit_code = ?5, conditions = ?6, spec = ?7, labels = ?8, "
                        "supervisor_pid = ?9, supervisor_start = ?10, intent = ?11, "
                        "created_ms = ?12, updated_ms = ?13, owner = ?14 WHERE id = ?1");
    bind_record(db_, statement, sealed(record));
    try {
      statement.run();
    } catch (const SqliteError& e) {
      if (e.code() == SQLITE_CONSTRAINT_UNIQUE) throw NameTaken(record.name);
      throw;
    }
    if (sqlite3_changes(db_) == 0)
      throw Error(db_path(db_) + ": update sandbox '" + record.name + "': no sandbox has id " +
                  record.id);
  });
}

void Store::remove(const std::string& id) {
  write_transaction(db_, "remove sandbox " + id, [&] {
    Statement(db_, "DELETE FROM events WHERE sandbox_id = ?1").bind(1, id).run();
    Statement(db_, "DELETE FROM policies WHERE sandbox_id = ?1").bind(1, id).run();
    Statement(db_, "DELETE FROM provider_attachments WHERE sandbox_id = ?1").bind(1, id).run();
    Statement(db_, "DELETE FROM forwards WHERE sandbox_id = ?1").bind(1, id).run();
    Statement(db_, "DELETE FROM sandboxes WHERE id = ?1").bind(1, id).run();
  });
}

std::optional<SandboxRecord> Store::find_by_name(std::string_view name) const {
  return opened(find_one(db_, "name", name));
}

std::optional<SandboxRecord> Store::find_by_id(std::string_view id) const {
  return opened(find_one(db_, "id", id));
}

std::vector<SandboxRecord> Store::list() const {
  Statement statement(
      db_, std::string("SELECT ") + kSandboxColumns + " FROM sandboxes ORDER BY created_ms, id");
  std::vector<SandboxRecord> records;
  while (statement.step()) records.push_back(*opened(read_record(db_, statement)));
  return records;
}

std::optional<Store::Revision> Store::revision() const {
  if (!sqlite3_get_autocommit(db_)) return std::nullopt;
  Statement statement(db_, "PRAGMA data_version");
  if (!statement.step()) throw Error(db_path(db_) + ": PRAGMA data_version gave no row");
  return Revision{sqlite3_total_changes64(db_), statement.int64(0)};
}

SandboxRecord Store::sealed(SandboxRecord record) const {
  if (codec_.seal) record.spec = codec_.seal(record.id, record.spec);
  return record;
}

std::optional<SandboxRecord> Store::opened(std::optional<SandboxRecord> record) const {
  if (!record || !codec_.open) return record;
  try {
    record->spec = codec_.open(record->id, record->spec);
  } catch (const Error& e) {
    throw Error(db_path(db_) + ": sandbox '" + record->name + "' (" + record->id +
                "): " + e.what());
  }
  return record;
}

size_t Store::reseal_specs() {
  if (!codec_.seal || !codec_.in_plain) return 0;
  std::vector<SandboxRecord> plain;
  {
    Statement statement(db_, std::string("SELECT ") + kSandboxColumns + " FROM sandboxes");
    while (statement.step()) {
      SandboxRecord record = read_record(db_, statement);
      if (codec_.in_plain(record.spec)) plain.push_back(std::move(record));
    }
  }
  for (const auto& record : plain) update(record);
  if (!plain.empty()) {
    Statement checkpoint(db_, "PRAGMA wal_checkpoint(TRUNCATE)");
    while (checkpoint.step()) {
    }
  }
  return plain.size();
}

void Store::append_event(const std::string& sandbox_id, const std::string& type,
                         const std::string& message, int64_t time_ms) {
  write_transaction(db_, "append event for sandbox " + sandbox_id, [&] {
    Statement(db_,
              "INSERT INTO events (sandbox_id, time_ms, type, message) VALUES (?1, ?2, ?3, ?4)")
        .bind(1, sandbox_id)
        .bind(2, time_ms)
        .bind(3, type)
        .bind(4, message)
        .run();
    // Everything older than the newest kMaxEventsPerSandbox goes.
    Statement(db_,
              "DELETE FROM events WHERE sandbox_id = ?1 AND seq < (SELECT seq FROM events "
              "WHERE sandbox_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)")
        .bind(1, sandbox_id)
        .bind(2, kMaxEventsPerSandbox - 1)
        .run();
  });
}

std::vector<Event> Store::events(const std::string& sandbox_id, size_t limit) const {
  // The newest `limit`, returned oldest first.
  Statement statement(db_,
                      "SELECT seq, sandbox_id, time_ms, type, message FROM (SELECT * FROM events "
                      "WHERE sandbox_id = ?1 ORDER BY seq DESC LIMIT ?2) ORDER BY seq");
  auto max_limit = static_cast<size_t>(std::numeric_limits<int64_t>::max());
  statement.bind(1, sandbox_id).bind(2, static_cast<int64_t>(std::min(limit, max_limit)));
  std::vector<Event> events;
  while (statement.step()) {
    Event event;
    event.seq = statement.int64(0);
    event.sandbox_id = statement.text(1);
    event.time_ms = statement.int64(2);
    event.type = statement.text(3);
    event.message = statement.text(4);
    events.push_back(std::move(event));
  }
  return events;
}

int64_t Store::add_policy(const std::string& sandbox_id, const std::string& text, int64_t time_ms) {
  int64_t revision = 0;
  write_transaction(db_, "add a policy revision for sandbox " + sandbox_id, [&] {
    Statement last(db_, "SELECT COALESCE(MAX(revision), 0) FROM policies WHERE sandbox_id = ?1");
    last.bind(1, sandbox_id);
    revision = last.step() ? last.int64(0) + 1 : 1;
    Statement(
        db_,
        "INSERT INTO policies (sandbox_id, revision, text, created_ms) VALUES (?1, ?2, ?3, ?4)")
        .bind(1, sandbox_id)
        .bind(2, revision)
        .bind(3, text)
        .bind(4, time_ms)
        .run();
  });
  return revision;
}

std::vector<PolicyRevision> Store::policies(const std::string& sandbox_id) const {
  Statement statement(
      db_,
      "SELECT revision, text, created_ms FROM policies WHERE sandbox_id = ?1 ORDER BY revision");
  statement.bind(1, sandbox_id);
  std::vector<PolicyRevision> out;
  while (statement.step())
    out.push_back({statement.int64(0), statement.text(1), statement.int64(2)});
  return out;
}

std::optional<PolicyRevision> Store::policy(const std::string& sandbox_id, int64_t revision) const {
  // revision 0: the newest.
  Statement statement(db_, revision > 0 ? "SELECT revision, text, created_ms FROM policies WHERE "
                                          "sandbox_id = ?1 AND revision = ?2"
                                        : "SELECT revision, text, created_ms FROM policies WHERE "
                                          "sandbox_id = ?1 ORDER BY revision DESC LIMIT 1");
  statement.bind(1, sandbox_id);
  if (revision > 0) statement.bind(2, revision);
  if (!statement.step()) return std::nullopt;
  return PolicyRevision{statement.int64(0), statement.text(1), statement.int64(2)};
}

void Store::set_meta(const std::string& key, const std::string& value) {
  write_transaction(db_, "set meta " + key, [&] {
    Statement(db_,
              "INSERT INTO meta (key, value) VALUES (?1, ?2) "
              "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
        .bind(1, key)
        .bind(2, value)
        .run();
  });
}

void Store::insert_provider(const ProviderRecord& record) {
  std::string credentials = seal_credentials(db_, box_, record);
  write_transaction(db_, "insert provider '" + record.name + "'", [&] {
    Statement statement(db_, std::string("INSERT INTO providers (") + kProviderColumns +
                                 ") VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    statement.bind(1, record.name).bind(2, record.type).bind(3, credentials);
    statement.bind(4, json_text(json(record.endpoints)));
    statement.bind(5, record.created_ms).bind(6, record.updated_ms);
    try {
      statement.run();
    } catch (const SqliteError& e) {
      if (e.code() == SQLITE_CONSTRAINT_PRIMARYKEY) throw ProviderTaken(record.name);
      throw;
    }
  });
}

void Store::update_provider(const ProviderRecord& record) {
  std::string credentials = seal_credentials(db_, box_, record);
  write_transaction(db_, "update provider '" + record.name + "'", [&] {
    Statement statement(db_,
                        "UPDATE providers SET type = ?2, credentials = ?3, endpoints = ?4, "
                        "created_ms = ?5, updated_ms = ?6 WHERE name = ?1");
    statement.bind(1, record.name).bind(2, record.type).bind(3, credentials);
    statement.bind(4, json_text(json(record.endpoints)));
    statement.bind(5, record.created_ms).bind(6, record.updated_ms);
    statement.run();
    if (sqlite3_changes(db_) == 0)
      throw Error(db_path(db_) + ": update provider '" + record.name + "': there is none");
  });
}

void Store::remove_provider(const std::string& name) {
  write_transaction(db_, "remove provider '" + name + "'", [&] {
    Statement(db_, "DELETE FROM provider_attachments WHERE provider = ?1").bind(1, name).run();
    Statement(db_, "DELETE FROM providers WHERE name = ?1").bind(1, name).run();
  });
}

std::optional<ProviderRecord> Store::find_provider(std::string_view name) const {
  Statement statement(
      db_, std::string("SELECT ") + kProviderColumns + " FROM providers WHERE name = ?1");
  statement.bind(1, name);
  if (!statement.step()) return std::nullopt;
  return read_provider(db_, box_, statement);
}

std::vector<ProviderRecord> Store::providers() const {
  Statement statement(db_,
                      std::string("SELECT ") + kProviderColumns + " FROM providers ORDER BY name");
  std::vector<ProviderRecord> out;
  while (statement.step()) out.push_back(read_provider(db_, box_, statement));
  return out;
}

void Store::attach_provider(const std::string& sandbox_id, const std::string& provider) {
  write_transaction(db_, "attach provider '" + provider + "' to sandbox " + sandbox_id, [&] {
    Statement(db_,
              "INSERT OR IGNORE INTO provider_attachments (sandbox_id, provider) VALUES (?1, ?2)")
        .bind(1, sandbox_id)
        .bind(2, provider)
        .run();
  });
}

void Store::detach_provider(const std::string& sandbox_id, const std::string& provider) {
  write_transaction(db_, "detach provider '" + provider + "' from sandbox " + sandbox_id, [&] {
    Statement(db_, "DELETE FROM provider_attachments WHERE sandbox_id = ?1 AND provider = ?2")
        .bind(1, sandbox_id)
        .bind(2, provider)
        .run();
  });
}

std::vector<std::string> Store::providers_of(const std::string& sandbox_id) const {
  Statement statement(
      db_, "SELECT provider FROM provider_attachments WHERE sandbox_id = ?1 ORDER BY provider");
  statement.bind(1, sandbox_id);
  std::vector<std::string> out;
  while (statement.step()) out.push_back(statement.text(0));
  return out;
}

std::vector<std::string> Store::sandboxes_of(const std::string& provider) const {
  Statement statement(
      db_, "SELECT sandbox_id FROM provider_attachments WHERE provider = ?1 ORDER BY sandbox_id");
  statement.bind(1, provider);
  std::vector<std::string> out;
  while (statement.step()) out.push_back(statement.text(0));
  return out;
}

void Store::insert_forward(const ForwardRecord& record) {
  write_transaction(db_, "add forward " + record.bind + ":" + std::to_string(record.port), [&] {
    Statement statement(
        db_, "INSERT INTO forwards (sandbox_id, bind, port, created_ms) VALUES (?1, ?2, ?3, ?4)");
    statement.bind(1, record.sandbox_id).bind(2, record.bind);
    statement.bind(3, int64_t{record.port}).bind(4, record.created_ms);
    try {
      statement.run();
    } catch (const SqliteError& e) {
      if (e.code() == SQLITE_CONSTRAINT_PRIMARYKEY || e.code() == SQLITE_CONSTRAINT_UNIQUE)
        throw ForwardTaken(record.bind + ":" + std::to_string(record.port));
      throw;
    }
  });
}

void Store::remove_forward(const std::string& sandbox_id, uint16_t port) {
  write_transaction(db_, "remove forward of port " + std::to_string(port), [&] {
    Statement(db_, "DELETE FROM forwards WHERE sandbox_id = ?1 AND port = ?2")
        .bind(1, sandbox_id)
        .bind(2, int64_t{port})
        .run();
  });
}

static std::vector<ForwardRecord> read_forwards(sqlite3* db, Statement& statement) {
  std::vector<ForwardRecord> out;
  while (statement.step()) {
    ForwardRecord r;
    r.sandbox_id = statement.text(0);
    r.bind = statement.text(1);
    const int64_t port = statement.int64(2);
    if (port < 1 || port > 65535)
      throw Error(db_path(db) + ": forward of sandbox " + r.sandbox_id + ": port " +
                  std::to_string(port) + " out of range");
    r.port = static_cast<uint16_t>(port);
    r.created_ms = statement.int64(3);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<ForwardRecord> Store::forwards() const {
  Statement statement(db_,
                      "SELECT sandbox_id, bind, port, created_ms FROM forwards "
                      "ORDER BY created_ms, port");
  return read_forwards(db_, statement);
}

std::vector<ForwardRecord> Store::forwards_of(const std::string& sandbox_id) const {
  Statement statement(db_,
                      "SELECT sandbox_id, bind, port, created_ms FROM forwards "
                      "WHERE sandbox_id = ?1 ORDER BY created_ms, port");
  statement.bind(1, sandbox_id);
  return read_forwards(db_, statement);
}

}  // namespace openshell::gateway
