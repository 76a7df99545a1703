#include "gateway/store.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "base/error.h"
#include "test_util.h"

namespace openshell::gateway {

// For readable failure messages.
void PrintTo(const SandboxRecord& r, std::ostream* os) {
  *os << "{id=" << r.id << " name=" << r.name << " phase=" << phase_name(r.phase)
      << " generation=" << r.generation
      << " exit_code=" << (r.exit_code ? std::to_string(*r.exit_code) : "none")
      << " conditions=" << r.conditions.size() << " spec=" << r.spec
      << " labels=" << r.labels.size() << " supervisor=" << r.supervisor_pid << "/"
      << r.supervisor_start << " intent=" << r.intent << " created=" << r.created_ms
      << " updated=" << r.updated_ms << "}";
}

namespace {

using openshell::testing::ChildReport;
using openshell::testing::ChildWriter;
using openshell::testing::path_exists;
using openshell::testing::run_in_child;
using openshell::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A second, plain connection to the same file: what another process (or a
// newer openshell) sees and writes.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK)
      throw std::runtime_error("sqlite3_open_v2 " + path + ": " + sqlite3_errmsg(db_));
  }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;
  ~RawDb() { sqlite3_close_v2(db_); }

  void exec(const std::string& sql) {
    char* message = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
      std::string text = message ? message : "?";
      sqlite3_free(message);
      throw std::runtime_error(sql + ": " + text);
    }
  }
  // The first column of the first row, or "<none>".
  std::string text(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK)
      throw std::runtime_error(sql + ": " + sqlite3_errmsg(db_));
    std::string out = "<none>";
    if (sqlite3_step(stmt) == SQLITE_ROW)
      out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    sqlite3_finalize(stmt);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

// A record with every field away from its default.
SandboxRecord sample(const std::string& id, const std::string& name, int64_t created_ms) {
  SandboxRecord r;
  r.id = id;
  r.name = name;
  r.phase = Phase::kError;
  r.generation = 7;
  r.exit_code = 137;
  r.conditions = {
      {"Ready", "False", "MainProcessFailed", "exited with 137 (SIGKILL)", 1700000000123},
      {"Scheduled", "True", "Launched", "generation 7", 1700000000001},
      {"Network", "Unknown", "", "quotes \" and \\ and ünïcode ✓", -5},
  };
  r.spec = R"({"image":"debian:12","command":["sleep","1"],"env":{"A":"b"}})";
  r.labels = {{"team", "ml"}, {"tier", "gpu"}, {"empty", ""}};
  r.supervisor_pid = 4242;
  r.supervisor_start = 0xFEDCBA9876543210ULL;  // beyond INT64_MAX: all 64 bits must survive
  r.intent = "launch";
  r.owner = "alice";
  r.created_ms = created_ms;
  r.updated_ms = created_ms + 1000;
  return r;
}

// The message of the Error that fn throws, or "" (and a failure) if none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error was thrown";
  return "";
}

class StoreTest : public ::testing::Test {
 protected:
  std::string db_path() const { return tmp_ / "gateway.db"; }
  std::unique_ptr<Store> open() { return Store::open(db_path()); }
  // A meta value as the file holds it (the store writes meta, never reads it
  // back but for the schema version), or "<none>".
  std::string meta(const std::string& key) {
    return RawDb(db_path()).text("SELECT value FROM meta WHERE key = '" + key + "'");
  }
  TempDir tmp_;
};

int mode_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return st.st_mode & 07777;
}

// --- phase names ------------------------------------------------------------

TEST(PhaseTest, NamesRoundTrip) {
  const std::vector<std::pair<Phase, std::string>> expected = {
      {Phase::kProvisioning, "Provisioning"}, {Phase::kReady, "Ready"},
      {Phase::kCompleted, "Completed"},       {Phase::kError, "Error"},
      {Phase::kStopping, "Stopping"},         {Phase::kStopped, "Stopped"},
      {Phase::kStarting, "Starting"},         {Phase::kDeleting, "Deleting"},
  };
  for (const auto& [phase, name] : expected) {
    EXPECT_EQ(phase_name(phase), name);
    EXPECT_EQ(parse_phase(name), phase) << name;
  }
}

TEST(PhaseTest, UnknownNamesAreRejected) {
  EXPECT_EQ(parse_phase(""), std::nullopt);
  EXPECT_EQ(parse_phase("ready"), std::nullopt);
  EXPECT_EQ(parse_phase("Ready "), std::nullopt);
  EXPECT_EQ(parse_phase("Hibernating"), std::nullopt);
}

// --- opening ----------------------------------------------------------------

TEST_F(StoreTest, OpenCreatesPrivateFileInWalMode) {
  mode_t old_umask = ::umask(0);  // the mode must not depend on the umask
  std::unique_ptr<Store> store;
  try {
    store = open();
  } catch (...) {
    ::umask(old_umask);
    throw;
  }
  ::umask(old_umask);
  store->set_meta("touch", "1");  // a write, so that the -wal file exists
  EXPECT_EQ(mode_of(db_path()), 0600);
  EXPECT_EQ(mode_of(db_path() + "-wal"), 0600);
  EXPECT_EQ(mode_of(db_path() + "-shm"), 0600);

  RawDb raw(db_path());
  EXPECT_EQ(raw.text("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.text("SELECT value FROM meta WHERE key = 'schema_version'"), "1");
  EXPECT_EQ(raw.text("SELECT count(*) FROM sqlite_schema WHERE name IN "
                     "('meta', 'sandboxes', 'events', 'events_by_sandbox')"),
            "4");
}

TEST_F(StoreTest, OpenNarrowsTheModeOfAnExistingFile) {
  open().reset();
  ASSERT_EQ(::chmod(db_path().c_str(), 0644), 0);
  open().reset();
  EXPECT_EQ(mode_of(db_path()), 0600);
}

TEST_F(StoreTest, OpenErrorNamesTheFile) {
  std::string path = tmp_ / "missing/gateway.db";
  std::string message = error_of([&] { Store::open(path); });
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("No such file or directory"));
}

TEST_F(StoreTest, NotADatabaseIsRefused) {
  openshell::testing::write_file(db_path(), std::string(8192, 'x'));
  std::string message = error_of([&] { open(); });
  EXPECT_THAT(message, HasSubstr(db_path() + ": "));
  EXPECT_THAT(message, HasSubstr("not a database"));
}

TEST_F(StoreTest, NewerSchemaVersionIsRefused) {
  open().reset();
  RawDb(db_path()).exec("UPDATE meta SET value = '2' WHERE key = 'schema_version'");
  std::string message = error_of([&] { open(); });
  EXPECT_THAT(message, HasSubstr("gateway.db: schema version 2 is newer than this openshell "
                                 "understands"));
  // Refused without touching it.
  EXPECT_EQ(RawDb(db_path()).text("SELECT value FROM meta WHERE key = 'schema_version'"), "2");
}

TEST_F(StoreTest, GarbledSchemaVersionIsRefused) {
  open().reset();
  RawDb(db_path()).exec("UPDATE meta SET value = '1x' WHERE key = 'schema_version'");
  EXPECT_THAT(error_of([&] { open(); }), HasSubstr("schema version '1x' is not understood"));
}

// --- records ----------------------------------------------------------------

TEST_F(StoreTest, EveryFieldRoundTrips) {
  auto store = open();
  SandboxRecord full = sample("0123456789ab", "alpha", 2000);
  SandboxRecord bare;  // defaults: no exit code, no conditions, no labels, empty strings
  bare.id = "ba5eba11c0de";
  bare.name = "bare";
  bare.spec = "{}";
  bare.created_ms = 1000;
  ASSERT_FALSE(bare.exit_code.has_value());
  SandboxRecord zero_exit = sample("000000000000", "zero", 2000);
  zero_exit.exit_code = 0;  // present and zero is not absent
  zero_exit.phase = Phase::kCompleted;
  store->insert(full);
  store->insert(bare);
  store->insert(zero_exit);

  EXPECT_EQ(store->find_by_name("alpha"), full);
  EXPECT_EQ(store->find_by_id("0123456789ab"), full);
  EXPECT_EQ(store->find_by_name("bare"), bare);
  EXPECT_EQ(store->find_by_id("ba5eba11c0de"), bare);
  EXPECT_EQ(store->find_by_name("zero"), zero_exit);
  EXPECT_EQ(store->find_by_name("nobody"), std::nullopt);
  EXPECT_EQ(store->find_by_id("ffffffffffff"), std::nullopt);
  // Oldest first; equal creation times in id order.
  EXPECT_THAT(store->list(), ElementsAre(bare, zero_exit, full));
}

// A database from before sandboxes had owners gets the column in place,
// keeping its rows (owned by "", which the gateway reads as its own
// user's) and its schema version, so an older openshell still opens it.
TEST_F(StoreTest, ARowFromBeforeOwnersHasNoOwner) {
  {
    auto store = open();
    store->insert(sample("0123456789ab", "old", 1));
  }
  {
    RawDb raw(db_path());
    raw.exec("CREATE TABLE old_rows AS SELECT * FROM sandboxes");
    raw.exec("DROP TABLE sandboxes");
    raw.exec(
        "CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, phase TEXT NOT "
        "NULL, generation INTEGER NOT NULL, exit_code INTEGER NULL, conditions TEXT NOT NULL, "
        "spec TEXT NOT NULL, labels TEXT NOT NULL, supervisor_pid INTEGER NOT NULL, "
        "supervisor_start INTEGER NOT NULL, intent TEXT NOT NULL, created_ms INTEGER NOT NULL, "
        "updated_ms INTEGER NOT NULL)");
    raw.exec(
        "INSERT INTO sandboxes SELECT id, name, phase, generation, exit_code, conditions, spec, "
        "labels, supervisor_pid, supervisor_start, intent, created_ms, updated_ms FROM old_rows");
    raw.exec("DROP TABLE old_rows");
  }
  auto store = open();
  auto record = store->find_by_name("old");
  ASSERT_TRUE(record);
  EXPECT_EQ(record->owner, "");
  EXPECT_EQ(record->generation, 7);
  record->owner = "bob";
  store->update(*record);
  EXPECT_EQ(store->find_by_name("old")->owner, "bob");
  EXPECT_EQ(meta("schema_version"), "1");
}

TEST_F(StoreTest, EveryPhaseRoundTrips) {
  auto store = open();
  for (Phase phase : {Phase::kProvisioning, Phase::kReady, Phase::kCompleted, Phase::kError,
                      Phase::kStopping, Phase::kStopped, Phase::kStarting, Phase::kDeleting}) {
    const std::string number = std::to_string(static_cast<int>(phase));
    SandboxRecord r = sample(std::string(11, '0') + number, std::string("phase-") + number, 1);
    r.phase = phase;
    store->insert(r);
    EXPECT_EQ(store->find_by_id(r.id), r);
  }
}

TEST_F(StoreTest, ReopenKeepsData) {
  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  SandboxRecord b = sample("bbbbbbbbbbbb", "b", 2);
  {
    auto store = open();
    store->insert(a);
    store->insert(b);
    store->append_event(a.id, "Phase", "Ready", 10);
    store->set_meta("gateway_id", "g1");
  }
  auto store = open();
  EXPECT_THAT(store->list(), ElementsAre(a, b));
  ASSERT_EQ(store->events(a.id, 10).size(), 1u);
  EXPECT_EQ(meta("gateway_id"), "g1");
  EXPECT_EQ(meta("schema_version"), "1");
}

TEST_F(StoreTest, DuplicateNameIsNameTakenAndChangesNothing) {
  auto store = open();
  SandboxRecord first = sample("111111111111", "taken", 1);
  store->insert(first);
  SandboxRecord second = sample("222222222222", "taken", 2);
  second.spec = "{\"other\":true}";
  try {
    store->insert(second);
    FAIL() << "insert accepted a taken name";
  } catch (const NameTaken& e) {
    EXPECT_THAT(e.what(), HasSubstr("'taken'"));
  }
  EXPECT_EQ(store->find_by_name("taken"), first);
  EXPECT_EQ(store->find_by_id("222222222222"), std::nullopt);
  EXPECT_THAT(store->list(), ElementsAre(first));
  // No transaction was left open: the next insert commits, for all to see.
  second.name = "free";
  store->insert(second);
  EXPECT_EQ(RawDb(db_path()).text("SELECT count(*) FROM sandboxes"), "2");
}

// Several writes as one commit: all of them, or (a failure inside) none.
TEST_F(StoreTest, AtomicallyCommitsAllOrNothing) {
  auto store = open();
  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  store->atomically("create a", [&] {
    store->insert(a);
    store->add_policy(a.id, "version = 1\n", 1);
    store->append_event(a.id, "Created", "from host", 1);
  });
  EXPECT_THAT(store->list(), ElementsAre(a));
  EXPECT_EQ(store->policies(a.id).size(), 1u);
  EXPECT_EQ(store->events(a.id, 10).size(), 1u);

  // The second insert's name is taken: the first insert and the event
  // before it are undone with it.
  SandboxRecord b = sample("bbbbbbbbbbbb", "b", 2);
  SandboxRecord clash = sample("cccccccccccc", "a", 3);
  EXPECT_THROW(store->atomically("create b",
                                 [&] {
                                   store->insert(b);
                                   store->append_event(a.id, "Phase", "Ready", 2);
                                   store->insert(clash);
                                 }),
               NameTaken);
  // A failure of the caller's own undoes it all too.
  EXPECT_THROW(store->atomically("create b",
                                 [&] {
                                   store->insert(b);
                                   throw Error("no such provider");
                                 }),
               Error);
  EXPECT_EQ(store->find_by_id(b.id), std::nullopt);
  EXPECT_EQ(store->events(a.id, 10).size(), 1u);
  EXPECT_EQ(RawDb(db_path()).text("SELECT count(*) FROM sandboxes"), "1");
  // Nothing was left open: a plain insert commits, for all to see.
  store->insert(b);
  EXPECT_EQ(RawDb(db_path()).text("SELECT count(*) FROM sandboxes"), "2");
}

// The gateway's list keeps what it made of every row while the revision
// stays the same: each kind of write must change it, and reading must not.
TEST_F(StoreTest, RevisionChangesWithEveryWriteAndOnlyThen) {
  auto store = open();
  const auto start = store->revision();
  ASSERT_TRUE(start.has_value());
  store->list();
  store->find_by_name("a");
  EXPECT_EQ(store->revision(), start) << "reading changed the revision";

  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  store->insert(a);
  const auto inserted = store->revision();
  EXPECT_NE(inserted, start) << "an insert";
  a.phase = Phase::kReady;
  store->update(a);
  const auto updated = store->revision();
  EXPECT_NE(updated, inserted) << "an update";

  // Another connection's commit (another process, or a newer openshell).
  RawDb(db_path()).exec("UPDATE sandboxes SET labels = '{\"x\":\"y\"}'");
  const auto outside = store->revision();
  EXPECT_NE(outside, updated) << "a commit by another connection";
  EXPECT_EQ(store->list().at(0).labels.at("x"), "y");

  // Inside a transaction there is none: its writes may yet be undone.
  store->atomically("look", [&] { EXPECT_EQ(store->revision(), std::nullopt); });
  EXPECT_THROW(store->atomically("undone",
                                 [&] {
                                   store->remove(a.id);
                                   throw Error("changed its mind");
                                 }),
               Error);
  EXPECT_EQ(store->list().size(), 1u);
  store->remove(a.id);
  EXPECT_NE(store->revision(), outside) << "a remove";
  EXPECT_TRUE(store->list().empty());
}

TEST_F(StoreTest, DuplicateIdIsAPlainError) {
  auto store = open();
  SandboxRecord first = sample("111111111111", "one", 1);
  store->insert(first);
  SandboxRecord again = sample("111111111111", "two", 2);
  try {
    store->insert(again);
    FAIL() << "insert accepted a taken id";
  } catch (const NameTaken&) {
    FAIL() << "a taken id reported as a taken name";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("gateway.db: insert sandbox 'two': UNIQUE constraint failed"));
  }
  EXPECT_THAT(store->list(), ElementsAre(first));
}

TEST_F(StoreTest, UpdateChangesEverythingButTheId) {
  SandboxRecord original = sample("0123456789ab", "alpha", 1000);
  SandboxRecord other = sample("ffffffffffff", "other", 5000);
  SandboxRecord changed;
  changed.id = original.id;
  changed.name = "beta";
  changed.phase = Phase::kReady;
  changed.generation = 8;
  changed.exit_code = std::nullopt;
  changed.conditions = {{"Ready", "True", "Running", "", 1700000009999}};
  changed.spec = R"({"image":"alpine"})";
  changed.labels = {{"team", "infra"}};
  changed.supervisor_pid = 777;
  changed.supervisor_start = 123456789;
  changed.intent = "";
  changed.created_ms = 9000;  // now after "other": list order must follow
  changed.updated_ms = 9999;
  {
    auto store = open();
    store->insert(original);
    store->insert(other);
    store->update(changed);
    EXPECT_EQ(store->find_by_id(original.id), changed);
    EXPECT_EQ(store->find_by_name("alpha"), std::nullopt);
  }
  auto store = open();
  EXPECT_EQ(store->find_by_name("beta"), changed);
  EXPECT_EQ(store->find_by_name("other"), other);
  EXPECT_THAT(store->list(), ElementsAre(other, changed));
}

TEST_F(StoreTest, UpdateToATakenNameIsNameTaken) {
  auto store = open();
  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  SandboxRecord b = sample("bbbbbbbbbbbb", "b", 2);
  store->insert(a);
  store->insert(b);
  SandboxRecord renamed = b;
  renamed.name = "a";
  renamed.generation = 99;
  EXPECT_THROW(store->update(renamed), NameTaken);
  EXPECT_THAT(store->list(), ElementsAre(a, b));
}

TEST_F(StoreTest, UpdateOfAMissingIdThrows) {
  auto store = open();
  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  store->insert(a);
  SandboxRecord ghost = sample("999999999999", "ghost", 1);
  std::string message = error_of([&] { store->update(ghost); });
  EXPECT_THAT(message, HasSubstr("no sandbox has id 999999999999"));
  EXPECT_THAT(store->list(), ElementsAre(a));
  store->set_meta("after", "yes");
  EXPECT_EQ(RawDb(db_path()).text("SELECT value FROM meta WHERE key = 'after'"), "yes");
}

TEST_F(StoreTest, RemoveDeletesTheRowAndItsEvents) {
  auto store = open();
  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  SandboxRecord b = sample("bbbbbbbbbbbb", "b", 2);
  store->insert(a);
  store->insert(b);
  store->append_event(a.id, "Phase", "Ready", 10);
  store->append_event(a.id, "Phase", "Stopped", 11);
  store->append_event(b.id, "Phase", "Ready", 12);
  store->remove(a.id);
  EXPECT_EQ(store->find_by_id(a.id), std::nullopt);
  EXPECT_EQ(store->find_by_name("a"), std::nullopt);
  EXPECT_TRUE(store->events(a.id, 100).empty());
  EXPECT_THAT(store->list(), ElementsAre(b));
  EXPECT_EQ(store->events(b.id, 100).size(), 1u);
  // The name is free again.
  store->insert(a);
  EXPECT_EQ(store->find_by_name("a"), a);
  EXPECT_TRUE(store->events(a.id, 100).empty());
}

// --- events -----------------------------------------------------------------

TEST_F(StoreTest, EventsRoundTrip) {
  auto store = open();
  store->append_event("aaaaaaaaaaaa", "Warning", "disk almost full", 1700000000123);
  store->append_event("aaaaaaaaaaaa", "Phase", "Ready", 1700000000456);
  std::vector<Event> events = store->events("aaaaaaaaaaaa", 10);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].sandbox_id, "aaaaaaaaaaaa");
  EXPECT_EQ(events[0].type, "Warning");
  EXPECT_EQ(events[0].message, "disk almost full");
  EXPECT_EQ(events[0].time_ms, 1700000000123);
  EXPECT_EQ(events[1].type, "Phase");
  EXPECT_EQ(events[1].message, "Ready");
  EXPECT_LT(events[0].seq, events[1].seq);
}

TEST_F(StoreTest, EventsAreBoundedOrderedAndLimited) {
  auto store = open();
  const std::string a = "aaaaaaaaaaaa", b = "bbbbbbbbbbbb";
  store->append_event(b, "Phase", "b0", 0);
  for (int i = 0; i < 1005; ++i) store->append_event(a, "Phase", std::to_string(i), i);
  store->append_event(b, "Phase", "b1", 1);

  std::vector<Event> all = store->events(a, 5000);
  ASSERT_EQ(all.size(), 1000u);
  EXPECT_EQ(all.front().message, "5");  // the five oldest were dropped
  EXPECT_EQ(all.back().message, "1004");
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_LT(all[i - 1].seq, all[i].seq);
    EXPECT_EQ(all[i].message, std::to_string(i + 5));
  }
  // Another sandbox's history is its own.
  std::vector<Event> other = store->events(b, 5000);
  ASSERT_EQ(other.size(), 2u);
  EXPECT_EQ(other[0].message, "b0");
  EXPECT_EQ(other[1].message, "b1");

  // A limit gives the newest, oldest first.
  std::vector<Event> last = store->events(a, 3);
  ASSERT_EQ(last.size(), 3u);
  EXPECT_EQ(last[0].message, "1002");
  EXPECT_EQ(last[1].message, "1003");
  EXPECT_EQ(last[2].message, "1004");
  EXPECT_TRUE(store->events(a, 0).empty());
  EXPECT_TRUE(store->events("cccccccccccc", 10).empty());
}

// --- meta -------------------------------------------------------------------

TEST_F(StoreTest, MetaSetReplacesAndPersists) {
  auto store = open();
  EXPECT_EQ(meta("gateway_id"), "<none>");
  store->set_meta("gateway_id", "first");
  EXPECT_EQ(meta("gateway_id"), "first");
  store->set_meta("gateway_id", "second");
  store->set_meta("empty", "");
  EXPECT_EQ(meta("gateway_id"), "second");
  EXPECT_EQ(meta("empty"), "");
  store.reset();
  EXPECT_EQ(meta("gateway_id"), "second");
}

// --- rows written by someone else --------------------------------------------

TEST_F(StoreTest, UnknownPhaseIsRefusedNotGuessed) {
  auto store = open();
  store->insert(sample("aaaaaaaaaaaa", "alpha", 1));
  RawDb(db_path()).exec("UPDATE sandboxes SET phase = 'Hibernating' WHERE id = 'aaaaaaaaaaaa'");
  for (const std::string& message :
       {error_of([&] { store->find_by_id("aaaaaaaaaaaa"); }),
        error_of([&] { store->find_by_name("alpha"); }), error_of([&] { store->list(); })}) {
    EXPECT_THAT(message, HasSubstr("'alpha'"));
    EXPECT_THAT(message, HasSubstr("unknown phase 'Hibernating'"));
  }
}

TEST_F(StoreTest, GarbledConditionsAreRefused) {
  auto store = open();
  store->insert(sample("aaaaaaaaaaaa", "alpha", 1));
  RawDb(db_path()).exec("UPDATE sandboxes SET conditions = '{\"not\":\"an array\"}'");
  EXPECT_THAT(error_of([&] { store->find_by_id("aaaaaaaaaaaa"); }),
              HasSubstr("sandbox 'alpha' (aaaaaaaaaaaa): conditions: not a JSON array"));
}

// --- failures and crashes ----------------------------------------------------

// A write that fails half-way (a trigger planted by another connection
// refuses the second statement of remove) is rolled back whole, and the
// store goes on working.
TEST_F(StoreTest, FailedWriteLeavesNoTrace) {
  auto store = open();
  SandboxRecord a = sample("aaaaaaaaaaaa", "a", 1);
  store->insert(a);
  store->append_event(a.id, "Phase", "Ready", 10);
  RawDb raw(db_path());
  raw.exec(
      "CREATE TRIGGER refuse BEFORE DELETE ON sandboxes "
      "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END");
  std::string message = error_of([&] { store->remove(a.id); });
  EXPECT_THAT(message, HasSubstr("gateway.db: remove sandbox aaaaaaaaaaaa: refused by the test"));
  // The events, deleted first, are back.
  EXPECT_EQ(store->events(a.id, 10).size(), 1u);
  EXPECT_EQ(store->find_by_id(a.id), a);

  // No transaction was left open: the next write commits, for all to see.
  raw.exec("DROP TRIGGER refuse");
  store->set_meta("after", "yes");
  EXPECT_EQ(raw.text("SELECT value FROM meta WHERE key = 'after'"), "yes");
  EXPECT_EQ(raw.text("SELECT count(*) FROM events"), "1");
  store->remove(a.id);
  EXPECT_EQ(raw.text("SELECT count(*) FROM events"), "0");
  EXPECT_EQ(raw.text("SELECT count(*) FROM sandboxes"), "0");
}

// A full disk, for real: a small tmpfs in a private mount namespace of a
// child. Every row committed before the failure survives; the failing one
// leaves no trace.
TEST_F(StoreTest, FullDiskLeavesNoTrace) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const std::string mountpoint = tmp_ / "small";
  ASSERT_EQ(::mkdir(mountpoint.c_str(), 0700), 0);
  ChildReport report = run_in_child([&](ChildWriter& out) {
    int unshared = ::unshare(CLONE_NEWNS);
    out.result("unshare", unshared, errno);
    if (unshared != 0) ::_exit(0);
    RECORD(out, "private", ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr));
    // 64k does not hold even the new database: the -shm index alone takes 32k.
    RECORD(out, "mount", ::mount("tmpfs", mountpoint.c_str(), "tmpfs", 0, "size=256k,mode=0700"));
    try {
      const std::string path = mountpoint + "/gateway.db";
      auto store = Store::open(path);
      out.result("opened", 1, 0);
      std::vector<SandboxRecord> inserted;
      std::optional<SandboxRecord> failed;
      for (int i = 0; i < 1000 && !failed; ++i) {
        char id[16];
        std::snprintf(id, sizeof id, "%012d", i);
        SandboxRecord r = sample(id, "sandbox-" + std::to_string(i), i);
        r.spec = "{\"padding\":\"" + std::string(3000, 'a' + i % 26) + "\"}";
        try {
          store->insert(r);
          inserted.push_back(r);
        } catch (const Error& e) {
          out.say(std::string("failure: ") + e.what());
          failed = r;
        }
      }
      out.result("inserted", static_cast<long>(inserted.size()), 0);
      if (!failed) ::_exit(4);
      out.result("absent before close", !store->find_by_id(failed->id), 0);
      out.result("intact before close", store->list() == inserted, 0);
      store.reset();
      auto again = Store::open(path);
      out.result("absent after reopen", !again->find_by_id(failed->id), 0);
      out.result("intact after reopen", again->list() == inserted, 0);
    } catch (const std::exception& e) {
      out.say(std::string("unexpected: ") + e.what());
      ::_exit(3);
    }
  });
  if (report.has("unshare") && report.at("unshare").err == EPERM)
    GTEST_SKIP() << "no mount namespaces here";
  ASSERT_TRUE(report.exited_cleanly()) << report.wait_status << "\n" << report.text;
  EXPECT_EQ(report.at("unshare").ret, 0);
  EXPECT_EQ(report.at("private").ret, 0);
  ASSERT_EQ(report.at("mount").ret, 0) << std::strerror(report.at("mount").err);
  ASSERT_EQ(report.at("opened").ret, 1) << report.text;
  EXPECT_GE(report.at("inserted").ret, 2) << "the tmpfs filled too soon to tell";
  EXPECT_THAT(report.text, HasSubstr("failure: " + mountpoint + "/gateway.db: insert sandbox"));
  EXPECT_THAT(report.text, HasSubstr("database or disk is full"));
  EXPECT_EQ(report.at("absent before close").ret, 1);
  EXPECT_EQ(report.at("intact before close").ret, 1);
  EXPECT_EQ(report.at("absent after reopen").ret, 1);
  EXPECT_EQ(report.at("intact after reopen").ret, 1);
}

// A gateway killed right after a write: the row is in the WAL only (no
// close, no checkpoint), and the next open finds it.
TEST_F(StoreTest, CommittedInsertSurvivesAKilledProcess) {
  open().reset();  // created, and closed cleanly: no -wal file is left
  ASSERT_FALSE(path_exists(db_path() + "-wal"));
  SandboxRecord r = sample("0123456789ab", "durable", 1);
  ChildReport report = run_in_child([&](ChildWriter& out) {
    try {
      auto store = Store::open(db_path());
      store->insert(r);
      store->append_event(r.id, "Phase", "Provisioning", 5);
      out.result("inserted", 1, 0);
      ::_exit(0);  // the store is never closed
    } catch (const std::exception& e) {
      out.say(std::string("unexpected: ") + e.what());
      ::_exit(3);
    }
  });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  ASSERT_EQ(report.at("inserted").ret, 1);
  struct stat st;
  ASSERT_EQ(::stat((db_path() + "-wal").c_str(), &st), 0);
  EXPECT_GT(st.st_size, 0);

  auto store = open();
  EXPECT_EQ(store->find_by_name("durable"), r);
  ASSERT_EQ(store->events(r.id, 10).size(), 1u);
}

}  // namespace
}  // namespace openshell::gateway
