#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "auth/launch.h"
#include "base/error.h"
#include "base/files.h"
#include "base/random.h"
#include "test_util.h"

namespace openshell::auth {
namespace {

using openshell::testing::ChildWriter;
using openshell::testing::error_of;
using openshell::testing::read_file;
using openshell::testing::run_in_child;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;
using Kind = LaunchFileError::Kind;
using Json = nlohmann::json;

class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

mode_t mode_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 07777 + 1;
  return st.st_mode & 07777;
}

ino_t inode_of(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The directory's entries, "." and ".." left out.
std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return {"<cannot open " + dir + ">"};
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.insert(name);
  }
  ::closedir(d);
  return out;
}

std::string kind_name(std::optional<Kind> kind) {
  if (!kind) return "none";
  switch (*kind) {
    case Kind::kTruncated:
      return "kTruncated";
    case Kind::kMalformed:
      return "kMalformed";
    case Kind::kBadSignature:
      return "kBadSignature";
  }
  return "?";
}

// How a decode ended: the refusal's kind and message, or "accepted".
struct Outcome {
  std::optional<Kind> kind;
  std::string message;
  std::string describe() const { return kind_name(kind) + ": " + message; }
};

Outcome outcome_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const LaunchFileError& e) {
    return {e.kind(), e.what()};
  } catch (const std::exception& e) {
    return {std::nullopt, std::string("another exception: ") + e.what()};
  }
  return {std::nullopt, "accepted"};
}

std::string base64(const std::string& data) {
  std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(data.data()),
                          static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// A file in the launch format with any payload, signed by key.
std::string signed_file(const std::string& payload, const SigningKey& key) {
  return "openshell-launch v1\n" + payload + "\nsig " + base64(key.sign(payload)) + "\n";
}

LaunchSpec sample_spec() {
  LaunchSpec spec;
  spec.sandbox_id = "3f2a9c1e-7b4d-4e0a-9f1b-2c3d4e5f6a7b";
  spec.sandbox_name = "agent \"one\"\nwith a newline and ünïcode";
  spec.generation = 7;
  spec.nonce = random_hex(32);
  spec.auth_epoch = 3;
  spec.issued_at = 1767225600;
  spec.policy_revision = 42;
  spec.gateway_id = "0123456789abcdef";
  spec.gateway_socket = "/run/openshell/gateway.sock";
  spec.spec = R"({"command":["/bin/sh","-c","echo hi"],"env":{"A":"1"},"tty":false})";
  return spec;
}

// The payload line (the second line) of an encoded file.
std::string payload_of(const std::string& file) {
  size_t first = file.find('\n');
  size_t second = file.find('\n', first + 1);
  return file.substr(first + 1, second - first - 1);
}

// --- SigningKey ---

TEST(SigningKey, CreatedWithMode0600AndReloadedAsTheSameKey) {
  TempDir dir;
  const std::string path = dir / "gateway.key";
  ScopedUmask open_umask(0);  // the mode must not depend on the caller's umask
  SigningKey created = SigningKey::load_or_create(path);
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_THAT(read_file(path), StartsWith("-----BEGIN PRIVATE KEY-----\n"));
  EXPECT_THAT(entries(dir.path()), ElementsAre("gateway.key"));  // no temp file left

  const std::string signature = created.sign("payload");
  SigningKey reloaded = SigningKey::load_or_create(path);
  EXPECT_EQ(reloaded.id(), created.id());
  EXPECT_TRUE(reloaded.verify("payload", signature));
  EXPECT_EQ(reloaded.sign("payload"), signature);  // Ed25519 is deterministic
}

TEST(SigningKey, NewKeysDiffer) {
  TempDir dir;
  SigningKey a = SigningKey::load_or_create(dir / "a.key");
  SigningKey b = SigningKey::load_or_create(dir / "b.key");
  EXPECT_NE(a.id(), b.id());
  EXPECT_FALSE(b.verify("payload", a.sign("payload")));
}

TEST(SigningKey, IdIsTheStartOfSha256OfTheRawPublicKey) {
  TempDir dir;
  const std::string path = dir / "gateway.key";
  SigningKey key = SigningKey::load_or_create(path);

  FILE* in = std::fopen(path.c_str(), "r");
  ASSERT_NE(in, nullptr);
  EVP_PKEY* pkey = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
  std::fclose(in);
  ASSERT_NE(pkey, nullptr);
  unsigned char raw[32];
  size_t raw_size = sizeof raw;
  ASSERT_EQ(EVP_PKEY_get_raw_public_key(pkey, raw, &raw_size), 1);
  EVP_PKEY_free(pkey);
  unsigned char digest[32];
  ASSERT_EQ(EVP_Digest(raw, raw_size, digest, nullptr, EVP_sha256(), nullptr), 1);
  char expected[17];
  for (int i = 0; i < 8; ++i) std::snprintf(expected + 2 * i, 3, "%02x", digest[i]);

  EXPECT_EQ(key.id(), expected);
}

TEST(SigningKey, KeyReadableByOthersIsRefused) {
  TempDir dir;
  const std::string path = dir / "gateway.key";
  { SigningKey::load_or_create(path); }
  for (mode_t mode : {0644, 0640, 0604, 0620}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    std::string message = error_of([&] { SigningKey::load_or_create(path); });
    EXPECT_THAT(message, HasSubstr(path));
    EXPECT_THAT(message, HasSubstr("group or others"));
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    EXPECT_THAT(message, HasSubstr(octal));
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_NO_THROW(SigningKey::load_or_create(path));
}

TEST(SigningKey, GarbageKeyFileIsRefused) {
  TempDir dir;
  const std::string path = dir / "gateway.key";
  for (const std::string& content :
       {std::string("not a key\n"), std::string(),
        std::string("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}) {
    write_file(path, content);
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    std::string message = error_of([&] { SigningKey::load_or_create(path); });
    EXPECT_THAT(message, HasSubstr(path));
    EXPECT_THAT(message, HasSubstr("not an Ed25519 private key"));
    EXPECT_EQ(read_file(path), content);  // never replaced by a new key
  }
}

TEST(SigningKey, KeyOfAnotherTypeIsRefused) {
  TempDir dir;
  const std::string path = dir / "gateway.key";
  EVP_PKEY* ec = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  ASSERT_NE(ec, nullptr);
  FILE* out = std::fopen(path.c_str(), "w");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(PEM_write_PrivateKey(out, ec, nullptr, nullptr, 0, nullptr, nullptr), 1);
  std::fclose(out);
  EVP_PKEY_free(ec);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);

  EXPECT_THAT(error_of([&] { SigningKey::load_or_create(path); }),
              AllOf(HasSubstr(path), HasSubstr("not an Ed25519 private key")));
}

TEST(SigningKey, MissingDirectoryIsAnErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir / "missing/gateway.key";
  EXPECT_THAT(error_of([&] { SigningKey::load_or_create(path); }),
              AllOf(HasSubstr(path), HasSubstr("No such file or directory")));
}

TEST(SigningKey, SignAndVerify) {
  TempDir dir;
  SigningKey key = SigningKey::load_or_create(dir / "gateway.key");
  const std::string message = "the payload line";
  const std::string signature = key.sign(message);
  EXPECT_EQ(signature.size(), 64u);
  EXPECT_TRUE(key.verify(message, signature));
  EXPECT_FALSE(key.verify("the payload linE", signature));
  EXPECT_FALSE(key.verify(message + " ", signature));
  EXPECT_FALSE(key.verify("", signature));
  std::string changed = signature;
  changed[10] ^= 0x01;
  EXPECT_FALSE(key.verify(message, changed));
  EXPECT_FALSE(key.verify(message, signature.substr(0, 63)));
  EXPECT_FALSE(key.verify(message, signature + "x"));
  EXPECT_TRUE(key.verify("", key.sign("")));
}

TEST(SigningKey, MovedKeyStillSigns) {
  TempDir dir;
  SigningKey key = SigningKey::load_or_create(dir / "gateway.key");
  const std::string id = key.id();
  SigningKey moved = std::move(key);
  EXPECT_EQ(moved.id(), id);
  EXPECT_TRUE(moved.verify("x", moved.sign("x")));
  SigningKey other = SigningKey::load_or_create(dir / "other.key");
  other = std::move(moved);
  EXPECT_EQ(other.id(), id);
}

// --- The launch file ---

class LaunchFile : public ::testing::Test {
 protected:
  TempDir dir_;
  SigningKey key_ = SigningKey::load_or_create(dir_ / "gateway.key");
};

TEST_F(LaunchFile, HasThreeLinesWithTheSpecEmbeddedAsAnObject) {
  LaunchSpec spec = sample_spec();
  const std::string file = encode(spec, key_);
  EXPECT_THAT(file, StartsWith("openshell-launch v1\n"));
  EXPECT_EQ(std::count(file.begin(), file.end(), '\n'), 3);
  EXPECT_EQ(file.back(), '\n');
  const std::string payload = payload_of(file);
  EXPECT_THAT(file.substr(file.find('\n', 20) + 1), MatchesRegex("sig [A-Za-z0-9+/]{86}==\n"));

  Json parsed = Json::parse(payload);
  EXPECT_EQ(parsed.dump(), payload);  // compact
  ASSERT_TRUE(parsed["spec"].is_object());
  EXPECT_EQ(parsed["spec"]["command"][2], "echo hi");
  EXPECT_EQ(parsed["generation"], 7);
  EXPECT_EQ(parsed["sandbox_name"], spec.sandbox_name);
  EXPECT_EQ(parsed.size(), 10u);
}

TEST_F(LaunchFile, EncodingIsDeterministic) {
  LaunchSpec a = sample_spec();
  LaunchSpec b = a;
  b.spec =
      "{ \"tty\" : false,\n \"env\": {\"A\": \"1\"}, \"command\": [\"/bin/sh\", \"-c\", "
      "\"echo hi\"] }";
  EXPECT_EQ(encode(a, key_), encode(b, key_));
  EXPECT_THAT(payload_of(encode(b, key_)),
              HasSubstr(R"("spec":{"command":["/bin/sh","-c","echo hi"],"env":{"A":"1"},)"
                        R"("tty":false})"));
}

TEST_F(LaunchFile, RoundTripKeepsEveryField) {
  LaunchSpec spec = sample_spec();
  spec.generation = INT64_MAX;
  spec.issued_at = -1;  // before the epoch: still an integer
  const std::string file = encode(spec, key_);
  for (const LaunchSpec& back : {decode(file), decode_verified(file, key_)}) {
    EXPECT_EQ(back.sandbox_id, spec.sandbox_id);
    EXPECT_EQ(back.sandbox_name, spec.sandbox_name);
    EXPECT_EQ(back.generation, spec.generation);
    EXPECT_EQ(back.nonce, spec.nonce);
    EXPECT_EQ(back.auth_epoch, spec.auth_epoch);
    EXPECT_EQ(back.issued_at, spec.issued_at);
    EXPECT_EQ(back.policy_revision, spec.policy_revision);
    EXPECT_EQ(back.gateway_id, spec.gateway_id);
    EXPECT_EQ(back.gateway_socket, spec.gateway_socket);
    EXPECT_EQ(back.spec, spec.spec);
  }
}

TEST_F(LaunchFile, DecodeVerifiedAcceptsTheGoodFile) {
  const std::string file = encode(sample_spec(), key_);
  Outcome outcome = outcome_of([&] { decode_verified(file, key_); });
  EXPECT_EQ(outcome.message, "accepted");
  // The gateway reloaded from its key file still accepts it.
  SigningKey reloaded = SigningKey::load_or_create(dir_ / "gateway.key");
  EXPECT_EQ(decode_verified(file, reloaded).nonce, decode(file).nonce);
}

TEST_F(LaunchFile, ChangingAnyPayloadByteBreaksTheSignature) {
  const std::string file = encode(sample_spec(), key_);
  const size_t start = file.find('\n') + 1;
  const size_t end = file.find('\n', start);
  for (size_t i = start; i < end; ++i) {
    for (unsigned char flip : {0x01, 0x20, 0x80}) {
      std::string tampered = file;
      tampered[i] = static_cast<char>(tampered[i] ^ flip);
      Outcome outcome = outcome_of([&] { decode_verified(tampered, key_); });
      EXPECT_EQ(outcome.kind, Kind::kBadSignature)
          << "byte " << i - start << " ^ " << int(flip) << ": " << outcome.describe();
      EXPECT_EQ(outcome.message,
                "launch file: signature does not match (tampered, or signed by another gateway)");
    }
  }
}

TEST_F(LaunchFile, ChangingAnySignatureByteIsRefused) {
  const std::string file = encode(sample_spec(), key_);
  const size_t start = file.rfind("sig ") + 4;
  for (size_t i = start; i + 1 < file.size(); ++i) {
    std::string tampered = file;
    tampered[i] = tampered[i] == 'A' ? 'B' : 'A';
    Outcome outcome = outcome_of([&] { decode_verified(tampered, key_); });
    EXPECT_THAT(outcome.kind, AnyOf(Kind::kBadSignature, Kind::kMalformed))
        << "byte " << i << ": " << outcome.describe();
  }
}

TEST_F(LaunchFile, EveryTruncationIsRefused) {
  const std::string file = encode(sample_spec(), key_);
  for (size_t length = 0; length < file.size(); ++length) {
    const std::string prefix = file.substr(0, length);
    for (bool verified : {false, true}) {
      Outcome outcome = outcome_of([&] {
        if (verified)
          decode_verified(prefix, key_);
        else
          decode(prefix);
      });
      EXPECT_THAT(outcome.kind, AnyOf(Kind::kTruncated, Kind::kMalformed))
          << "length " << length << (verified ? " verified: " : ": ") << outcome.describe();
      EXPECT_THAT(outcome.message, StartsWith("launch file: "));
      EXPECT_THAT(outcome.message, Not(HasSubstr("\n")));
    }
  }
}

TEST_F(LaunchFile, TruncationsSayWhatIsMissing) {
  const std::string file = encode(sample_spec(), key_);
  const size_t payload_end = file.find('\n', file.find('\n') + 1);
  auto message = [&](const std::string& bytes) { return outcome_of([&] { decode(bytes); }); };

  Outcome empty = message("");
  EXPECT_EQ(empty.kind, Kind::kTruncated);
  EXPECT_EQ(empty.message, "launch file: truncated (empty file)");
  Outcome no_payload = message("openshell-launch v1\n");
  EXPECT_EQ(no_payload.kind, Kind::kTruncated);
  EXPECT_EQ(no_payload.message, "launch file: truncated (no payload line)");
  for (size_t cut : {payload_end, payload_end + 1}) {
    Outcome no_sig = message(file.substr(0, cut));
    EXPECT_EQ(no_sig.kind, Kind::kTruncated);
    EXPECT_EQ(no_sig.message, "launch file: truncated (no signature line)");
  }
  Outcome no_newline = message(file.substr(0, file.size() - 1));
  EXPECT_EQ(no_newline.kind, Kind::kTruncated);
  EXPECT_EQ(no_newline.message, "launch file: truncated (incomplete signature line)");
}

TEST_F(LaunchFile, SignatureFromAnotherGatewayIsRefused) {
  SigningKey other = SigningKey::load_or_create(dir_ / "other.key");
  const std::string file = encode(sample_spec(), other);
  EXPECT_NO_THROW(decode(file));  // the supervisor does not check
  Outcome outcome = outcome_of([&] { decode_verified(file, key_); });
  EXPECT_EQ(outcome.kind, Kind::kBadSignature) << outcome.describe();
}

TEST_F(LaunchFile, SignatureOfTheWrongLengthIsABadSignature) {
  const std::string file = encode(sample_spec(), key_);
  const std::string payload = payload_of(file);
  const std::string signature = key_.sign(payload);
  for (const std::string& wrong :
       {signature.substr(0, 63), signature + std::string(1, '\0'), signature + signature}) {
    const std::string bad = "openshell-launch v1\n" + payload + "\nsig " + base64(wrong) + "\n";
    EXPECT_NO_THROW(decode(bad));
    Outcome outcome = outcome_of([&] { decode_verified(bad, key_); });
    EXPECT_EQ(outcome.kind, Kind::kBadSignature)
        << wrong.size() << " bytes: " << outcome.describe();
  }
}

TEST_F(LaunchFile, OtherVersionOrHeaderIsMalformed) {
  const std::string file = encode(sample_spec(), key_);
  const std::string body = file.substr(file.find('\n'));
  Outcome v2 = outcome_of([&] { decode("openshell-launch v2" + body); });
  EXPECT_EQ(v2.kind, Kind::kMalformed) << v2.describe();
  EXPECT_THAT(v2.message, HasSubstr("v2"));
  for (std::string header : {"openshell-launch v1 ", "Openshell-launch v1", "{}", ""}) {
    Outcome outcome = outcome_of([&] { decode_verified(header + body, key_); });
    EXPECT_EQ(outcome.kind, Kind::kMalformed) << "\"" << header << "\": " << outcome.describe();
  }
}

TEST_F(LaunchFile, BadBase64IsMalformed) {
  const std::string file = encode(sample_spec(), key_);
  const std::string head = file.substr(0, file.rfind("sig "));
  const std::string good = file.substr(file.rfind("sig ") + 4);
  for (const std::string& sig : {std::string("!!!!\n"), std::string("abc\n"), std::string("\n"),
                                 " " + good, good.substr(0, 4) + " " + good.substr(4),
                                 "=" + good.substr(1), good.substr(0, 85) + "B==\n"}) {
    Outcome outcome = outcome_of([&] { decode(head + "sig " + sig); });
    EXPECT_EQ(outcome.kind, Kind::kMalformed) << "sig " << sig << outcome.describe();
  }
}

TEST_F(LaunchFile, LinesOtherThanThreeAreRefused) {
  const std::string file = encode(sample_spec(), key_);
  Outcome extra = outcome_of([&] { decode_verified(file + "sig AAAA\n", key_); });
  EXPECT_EQ(extra.kind, Kind::kMalformed) << extra.describe();
  Outcome trailing = outcome_of([&] { decode(file + "x"); });
  EXPECT_EQ(trailing.kind, Kind::kMalformed) << trailing.describe();
  const size_t payload_start = file.find('\n') + 1;
  std::string wrapped = file;
  wrapped.insert(payload_start + 1, "\n");  // the payload split over two lines
  EXPECT_EQ(outcome_of([&] { decode(wrapped); }).kind, Kind::kMalformed);
}

TEST_F(LaunchFile, InvalidJsonIsMalformed) {
  for (std::string payload : {"{not json", "[1,2,3]", "\"text\"", "{} {}", "\xff"}) {
    Outcome outcome = outcome_of([&] { decode_verified(signed_file(payload, key_), key_); });
    EXPECT_EQ(outcome.kind, Kind::kMalformed) << payload << ": " << outcome.describe();
  }
}

TEST_F(LaunchFile, MissingFieldIsTruncated) {
  Json full = Json::parse(payload_of(encode(sample_spec(), key_)));
  for (const auto& [name, value] : full.items()) {
    Json partial = full;
    partial.erase(name);
    Outcome outcome = outcome_of([&] { decode_verified(signed_file(partial.dump(), key_), key_); });
    EXPECT_EQ(outcome.kind, Kind::kTruncated) << name << ": " << outcome.describe();
    EXPECT_THAT(outcome.message, HasSubstr("\"" + name + "\""));
  }
}

TEST_F(LaunchFile, WrongFieldTypeIsMalformed) {
  Json full = Json::parse(payload_of(encode(sample_spec(), key_)));
  const std::vector<std::pair<std::string, Json>> wrong = {
      {"generation", "7"},
      {"generation", 7.5},
      {"generation", 18446744073709551615ull},
      {"auth_epoch", nullptr},
      {"issued_at", true},
      {"policy_revision", Json::array()},
      {"sandbox_id", 1},
      {"nonce", Json::object()},
      {"gateway_socket", nullptr},
      {"spec", R"({"command":["/bin/true"]})"},  // a string, not an object
      {"spec", Json::array()},
  };
  for (const auto& [name, value] : wrong) {
    Json changed = full;
    changed[name] = value;
    Outcome outcome = outcome_of([&] { decode(signed_file(changed.dump(), key_)); });
    EXPECT_EQ(outcome.kind, Kind::kMalformed) << name << "=" << value << ": " << outcome.describe();
    EXPECT_THAT(outcome.message, HasSubstr(name));
  }
}

TEST_F(LaunchFile, UnknownFieldsAreIgnored) {
  Json full = Json::parse(payload_of(encode(sample_spec(), key_)));
  full["added_later"] = "x";
  EXPECT_EQ(decode_verified(signed_file(full.dump(), key_), key_).generation, 7);
}

TEST_F(LaunchFile, EncodeRefusesASpecThatIsNotAJsonObject) {
  for (std::string text : {"[1,2]", "\"text\"", "42", "null", "not json", "", "{"}) {
    LaunchSpec spec = sample_spec();
    spec.spec = text;
    EXPECT_THAT(error_of([&] { encode(spec, key_); }), HasSubstr("not a JSON object")) << text;
  }
}

TEST_F(LaunchFile, EncodeRefusesTextThatIsNotUtf8) {
  LaunchSpec spec = sample_spec();
  spec.sandbox_name = "bad \xff byte";
  EXPECT_THAT(error_of([&] { encode(spec, key_); }), HasSubstr("UTF-8"));
}

// --- files::write_atomically (base/files.h), which writes launch.cred ---

TEST(AtomicWrite, CreatesTheFileWithTheAskedModeAndNoTempFile) {
  TempDir dir;
  ScopedUmask strict_umask(077);  // the mode asked for wins over the umask
  for (unsigned mode : {0600u, 0640u, 0444u}) {
    const std::string path = dir / "launch.cred";
    ::unlink(path.c_str());
    files::write_atomically(path, "content " + std::to_string(mode), mode);
    EXPECT_EQ(mode_of(path), mode);
    EXPECT_EQ(read_file(path), "content " + std::to_string(mode));
    EXPECT_THAT(entries(dir.path()), ElementsAre("launch.cred"));
  }
}

TEST(AtomicWrite, ReplacesTheOldFileByRename) {
  TempDir dir;
  const std::string path = dir / "launch.cred";
  write_file(path, "old content");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  const ino_t old_inode = inode_of(path);
  // A reader that opened the old file keeps reading it whole: it was never
  // truncated or rewritten in place.
  int old_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old_fd, 0);

  files::write_atomically(path, "new content", 0600);

  EXPECT_EQ(read_file(path), "new content");
  EXPECT_EQ(mode_of(path), 0600u);
  EXPECT_NE(inode_of(path), old_inode);
  char buf[64] = {};
  EXPECT_EQ(::pread(old_fd, buf, sizeof buf, 0), 11);
  EXPECT_STREQ(buf, "old content");
  ::close(old_fd);
  EXPECT_THAT(entries(dir.path()), ElementsAre("launch.cred"));
}

TEST(AtomicWrite, ReadersSeeTheOldOrTheNewFileNeverAMix) {
  TempDir dir;
  const std::string path = dir / "launch.cred";
  const std::string a(512 * 1024, 'a');
  const std::string b(512 * 1024, 'b');
  files::write_atomically(path, a);
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done) {
      std::string seen = read_file(path);
      if (seen != a && seen != b) ++torn;
      ++reads;
    }
  });
  for (int i = 0; i < 8; ++i) files::write_atomically(path, i % 2 ? a : b);
  while (reads < 4) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_EQ(torn.load(), 0) << "of " << reads.load() << " reads";
  EXPECT_THAT(entries(dir.path()), ElementsAre("launch.cred"));
}

TEST(AtomicWrite, FailedRenameRemovesTheTempFile) {
  TempDir dir;
  const std::string path = dir / "target";
  write_file(path + "/inside", "kept");  // a directory cannot be renamed over
  EXPECT_EQ(error_of([&] { files::write_atomically(path, "new"); }),
            "write " + path + ": Is a directory");
  EXPECT_THAT(entries(dir.path()), ElementsAre("target"));
  EXPECT_EQ(read_file(path + "/inside"), "kept");
}

TEST(AtomicWrite, MissingDirectoryIsAnErrorNamingThePath) {
  TempDir dir;
  const std::string path = dir / "missing/launch.cred";
  EXPECT_EQ(error_of([&] { files::write_atomically(path, "x"); }),
            "write " + path + ": No such file or directory");
}

TEST(AtomicWrite, ReadOnlyDirectoryLeavesTheOldFile) {
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // the unprivileged child must get in
  const std::string sub = dir / "ro";
  const std::string path = sub + "/launch.cred";
  write_file(path, "old content");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(sub.c_str(), 0555), 0);

  auto report = run_in_child([&](ChildWriter& out) {
    // As root a read-only directory stops nothing: write as nobody.
    if (::geteuid() == 0 &&
        (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0)) {
      out.say("cannot drop to uid 65534");
      return;
    }
    try {
      files::write_atomically(path, "new content");
      out.say("written");
    } catch (const std::exception& e) {
      out.say(std::string("error: ") + e.what());
    }
  });
  EXPECT_TRUE(report.exited_cleanly());
  EXPECT_EQ(report.text, "error: write " + path + ": Permission denied\n");
  EXPECT_EQ(read_file(path), "old content");
  EXPECT_THAT(entries(sub), ElementsAre("launch.cred"));
}

// In a child with its own mount namespace (and, unless root, its own user
// namespace), mounts a 16 KiB tmpfs on dir.
bool mount_tiny_tmpfs(const std::string& dir, ChildWriter& out) {
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (uid != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      out.say(std::string("unshare user+mount: ") + std::strerror(errno));
      return false;
    }
    write_file("/proc/self/setgroups", "deny");
    write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1");
    write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1");
  } else if (::unshare(CLONE_NEWNS) != 0) {
    out.say(std::string("unshare mount: ") + std::strerror(errno));
    return false;
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=16k,mode=0700") != 0) {
    out.say(std::string("mount tmpfs: ") + std::strerror(errno));
    return false;
  }
  return true;
}

TEST(AtomicWrite, FullDiskLeavesTheOldFileAndNoTempFile) {
  TempDir dir;
  const std::string sub = dir / "full";
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  const std::string path = sub + "/launch.cred";
  auto report = run_in_child([&](ChildWriter& out) {
    if (!mount_tiny_tmpfs(sub, out)) return;
    try {
      files::write_atomically(path, "old content");
      files::write_atomically(path, std::string(64 * 1024, 'n'));
      out.say("written");
    } catch (const std::exception& e) {
      out.say(std::string("error: ") + e.what());
    }
    out.say("old: " + read_file(path));
    for (const std::string& name : entries(sub)) out.say("entry: " + name);
  });
  EXPECT_TRUE(report.exited_cleanly());
  EXPECT_EQ(report.text, "error: write " + path +
                             ": No space left on device\n"
                             "old: old content\n"
                             "entry: launch.cred\n");
}

// --- random_hex (base/random.h), which makes the launch nonce ---

TEST(RandomHex, GivesFreshHexOfTheAskedLength) {
  const std::string a = random_hex(32);
  EXPECT_THAT(a, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_NE(random_hex(32), a);
  EXPECT_EQ(random_hex(0), "");
  EXPECT_EQ(random_hex(1).size(), 2u);
}

}  // namespace
}  // namespace openshell::auth
