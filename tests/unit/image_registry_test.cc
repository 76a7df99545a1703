#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "../fake_http_server.h"
#include "image/digest.h"
#include "image/registry.h"
#include "test_util.h"

namespace openshell::image {
namespace {

using openshell::testing::FakeHttpServer;
using openshell::testing::FakeReply;
using openshell::testing::FakeRequest;
using openshell::testing::path_exists;
using openshell::testing::read_file;
using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Action = FakeReply::Action;

const std::string kManifest =
    R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",)"
    R"("config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":2,)"
    R"("digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},)"
    R"("layers":[]})";
const std::string kRepository = "/v2/test/x";

// Bytes that are not all alike, so that a flipped or missing byte shows.
std::string make_bytes(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : bytes) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return bytes;
}

RegistryOptions quick_options() {
  RegistryOptions options;
  options.backoff_ms = 1;
  options.timeout_ms = 3000;
  return options;
}

Reference local_reference(uint16_t port) {
  return parse_reference("127.0.0.1:" + std::to_string(port) + "/test/x:1");
}

std::string errors_body(const std::string& code, const std::string& message) {
  return R"({"errors":[{"code":")" + code + R"(","message":")" + message + R"(","detail":{}}]})";
}

// The RegistryError that f throws.
template <class F>
RegistryError registry_error(F&& f) {
  try {
    f();
  } catch (const RegistryError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a RegistryError: " << e.what();
    return RegistryError("", -1);
  }
  ADD_FAILURE() << "no error";
  return RegistryError("", -1);
}

// A blob answered whole (with Range support when ranges), or as ranged.
FakeReply serve_blob(const FakeRequest& request, const std::string& content, bool ranges) {
  std::string range = request.header("range");
  if (ranges && range.rfind("bytes=", 0) == 0 && range.back() == '-') {
    size_t start = std::stoul(range.substr(6));
    return FakeReply::with(206, content.substr(start))
        .header("Accept-Ranges", "bytes")
        .header("Content-Range", "bytes " + std::to_string(start) + "-" +
                                     std::to_string(content.size() - 1) + "/" +
                                     std::to_string(content.size()));
  }
  FakeReply reply =
      FakeReply::with(200, content).header("Content-Type", "application/octet-stream");
  if (ranges) reply.header("Accept-Ranges", "bytes");
  return reply;
}

// --- manifests -------------------------------------------------------------------

TEST(ImageRegistry, ManifestByTag) {
  const std::string digest = sha256_digest(kManifest);
  FakeHttpServer server([&](const FakeRequest& request) {
    if (request.path != kRepository + "/manifests/1")
      return FakeReply::with(404, errors_body("NAME_UNKNOWN", "no such thing"));
    return FakeReply::with(200, kManifest)
        .header("Content-Type", kMediaTypeOciManifest)
        .header("Docker-Content-Digest", digest);
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryClient::Manifest manifest = client.manifest("1");
  EXPECT_EQ(manifest.body, kManifest);
  EXPECT_EQ(manifest.digest, digest);
  EXPECT_EQ(manifest.media_type, kMediaTypeOciManifest);

  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "GET");
  std::string accept = requests[0].header("accept");
  for (const char* type : {kMediaTypeOciIndex, kMediaTypeOciManifest, kMediaTypeDockerManifestList,
                           kMediaTypeDockerManifest})
    EXPECT_THAT(accept, HasSubstr(type));
  EXPECT_THAT(requests[0].header("user-agent"), StartsWith("openshell/"));
  EXPECT_EQ(requests[0].header("host"), "127.0.0.1:" + std::to_string(server.port()));
}

TEST(ImageRegistry, ManifestByDigestTakesTheMediaTypeFromTheBody) {
  const std::string digest = sha256_digest(kManifest);
  FakeHttpServer server([&](const FakeRequest& request) {
    if (request.path != kRepository + "/manifests/" + digest) return FakeReply::with(404);
    return FakeReply::with(200, kManifest).header("Content-Type", "application/json");
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryClient::Manifest manifest = client.manifest(digest);
  EXPECT_EQ(manifest.digest, digest);
  EXPECT_EQ(manifest.media_type, kMediaTypeOciManifest);
}

TEST(ImageRegistry, ManifestByDigestMustMatchIt) {
  const std::string asked = sha256_digest("something else");
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(200, kManifest).header("Content-Type", kMediaTypeOciManifest);
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest(asked); });
  EXPECT_EQ(std::string(error.what()), "127.0.0.1:" + std::to_string(server.port()) + "/test/x@" +
                                           asked + ": content does not match its digest (got " +
                                           sha256_digest(kManifest) + ")");
  EXPECT_EQ(error.status, 0);
  EXPECT_EQ(server.requests().size(), 1u);  // not tried again
}

TEST(ImageRegistry, DockerContentDigestMustMatchTheManifest) {
  const std::string other = sha256_digest("other");
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(200, kManifest)
        .header("Content-Type", kMediaTypeOciManifest)
        .header("Docker-Content-Digest", other);
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(), HasSubstr("Docker-Content-Digest " + other + " does not match"));
  EXPECT_THAT(error.what(), HasSubstr(sha256_digest(kManifest)));
}

TEST(ImageRegistry, ManifestTooLargeIsRefused) {
  const std::string huge(kMaxManifestBytes + 1, ' ');
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(200, huge).header("Content-Type", kMediaTypeOciManifest);
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(), HasSubstr("larger than the limit of 4.0 MiB"));
}

TEST(ImageRegistry, KeepsTheConnectionBetweenRequests) {
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(200, kManifest).header("Content-Type", kMediaTypeOciManifest);
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  client.manifest("1");
  client.manifest("2");
  client.manifest("3");
  EXPECT_EQ(server.requests().size(), 3u);
  EXPECT_EQ(server.connections(), 1);
}

TEST(ImageRegistry, ReconnectsWhenTheServerClosedTheConnection) {
  std::atomic<int> calls{0};
  FakeHttpServer server([&](const FakeRequest&) {
    // The second request finds the kept-alive connection closed.
    if (++calls == 2) return FakeReply::of(Action::drop);
    return FakeReply::with(200, kManifest).header("Content-Type", kMediaTypeOciManifest);
  });
  RegistryOptions options = quick_options();
  options.attempts = 1;
  RegistryClient client(local_reference(server.port()), options);
  client.manifest("1");
  EXPECT_EQ(client.manifest("1").body, kManifest);
  EXPECT_EQ(server.connections(), 2);
}

TEST(ImageRegistry, NotFoundCarriesTheRegistrysMessage) {
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(404, errors_body("MANIFEST_UNKNOWN", "manifest unknown"))
        .header("Content-Type", "application/json");
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_EQ(error.status, 404);
  EXPECT_EQ(std::string(error.what()),
            "127.0.0.1:" + std::to_string(server.port()) + "/test/x:1: manifest unknown (404)");
  EXPECT_EQ(server.requests().size(), 1u);  // a 404 is not tried again
}

TEST(ImageRegistry, ForbiddenWithoutABodyNamesTheStatus) {
  FakeHttpServer server([&](const FakeRequest&) { return FakeReply::with(403, "no"); });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_EQ(error.status, 403);
  EXPECT_THAT(error.what(), HasSubstr("answered 403 Forbidden"));
}

// --- blobs -----------------------------------------------------------------------

TEST(ImageRegistry, BlobToFileReportsProgress) {
  const std::string content = make_bytes(300 << 10, 1);
  const std::string digest = sha256_digest(content);
  FakeHttpServer server([&](const FakeRequest& request) {
    if (request.path != kRepository + "/blobs/" + digest) return FakeReply::with(404);
    return serve_blob(request, content, false);
  });
  TempDir dir;
  std::vector<uint64_t> progress;
  RegistryClient client(local_reference(server.port()), quick_options());
  client.blob_to_file(digest, static_cast<int64_t>(content.size()), dir / "blob",
                      [&](uint64_t bytes) { progress.push_back(bytes); });
  EXPECT_EQ(read_file(dir / "blob"), content);
  struct stat st;
  ASSERT_EQ(::stat((dir / "blob").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), content.size());
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
}

TEST(ImageRegistry, BlobToFileRefusesAnExistingFile) {
  FakeHttpServer server([&](const FakeRequest&) { return FakeReply::with(200, "x"); });
  TempDir dir;
  write_file(dir / "blob", "mine");
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error =
      registry_error([&] { client.blob_to_file(sha256_digest("x"), 1, dir / "blob", nullptr); });
  EXPECT_THAT(error.what(), HasSubstr("File exists"));
  EXPECT_EQ(read_file(dir / "blob"), "mine");
  EXPECT_TRUE(server.requests().empty());
}

TEST(ImageRegistry, BlobWithTheWrongDigestIsRemoved) {
  const std::string content = make_bytes(10000, 2);
  const std::string digest = sha256_digest(content);
  std::string flipped = content;
  flipped[5000] = static_cast<char>(flipped[5000] ^ 1);
  FakeHttpServer server(
      [&](const FakeRequest& request) { return serve_blob(request, flipped, false); });
  TempDir dir;
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] {
    client.blob_to_file(digest, static_cast<int64_t>(content.size()), dir / "blob", nullptr);
  });
  EXPECT_EQ(std::string(error.what()),
            "blob " + digest + " from 127.0.0.1:" + std::to_string(server.port()) +
                "/test/x: content does not match its digest (got " + sha256_digest(flipped) + ")");
  EXPECT_EQ(error.status, 0);
  EXPECT_FALSE(path_exists(dir / "blob"));
}

TEST(ImageRegistry, BlobLargerThanItsSizeStops) {
  const std::string content = make_bytes(5000, 3);
  FakeHttpServer server(
      [&](const FakeRequest& request) { return serve_blob(request, content, false); });
  TempDir dir;
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error(
      [&] { client.blob_to_file(sha256_digest(content), 4000, dir / "blob", nullptr); });
  EXPECT_THAT(error.what(), HasSubstr("larger than its size of 4000 bytes"));
  EXPECT_FALSE(path_exists(dir / "blob"));
}

TEST(ImageRegistry, TruncatedBlobStartsAgainWithoutRanges) {
  const std::string content = make_bytes(200 << 10, 4);
  const std::string digest = sha256_digest(content);
  std::atomic<int> calls{0};
  FakeHttpServer server([&](const FakeRequest& request) {
    FakeReply reply = serve_blob(request, content, false);
    if (++calls == 1) {
      reply.action = Action::truncate;
      reply.truncate_at = content.size() / 2;
    }
    return reply;
  });
  TempDir dir;
  RegistryClient client(local_reference(server.port()), quick_options());
  client.blob_to_file(digest, static_cast<int64_t>(content.size()), dir / "blob", nullptr);
  EXPECT_EQ(read_file(dir / "blob"), content);
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].header("range"), "");
}

TEST(ImageRegistry, TruncatedBlobResumesWithARange) {
  const std::string content = make_bytes(200 << 10, 5);
  const std::string digest = sha256_digest(content);
  std::atomic<int> calls{0};
  FakeHttpServer server([&](const FakeRequest& request) {
    FakeReply reply = serve_blob(request, content, true);
    if (++calls == 1) {
      reply.action = Action::truncate;
      reply.truncate_at = 70000;
    }
    return reply;
  });
  TempDir dir;
  std::vector<uint64_t> progress;
  RegistryClient client(local_reference(server.port()), quick_options());
  client.blob_to_file(digest, static_cast<int64_t>(content.size()), dir / "blob",
                      [&](uint64_t bytes) { progress.push_back(bytes); });
  EXPECT_EQ(read_file(dir / "blob"), content);
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].header("range"), "bytes=70000-");
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));  // never started again
}

TEST(ImageRegistry, TruncatedEveryTimeNamesTheBytes) {
  const std::string content = make_bytes(10000, 6);
  FakeHttpServer server([&](const FakeRequest& request) {
    FakeReply reply = serve_blob(request, content, false);
    reply.action = Action::truncate;
    reply.truncate_at = 4000;
    return reply;
  });
  TempDir dir;
  RegistryOptions options = quick_options();
  options.attempts = 2;
  RegistryClient client(local_reference(server.port()), options);
  RegistryError error = registry_error([&] {
    client.blob_to_file(sha256_digest(content), static_cast<int64_t>(content.size()), dir / "blob",
                        nullptr);
  });
  EXPECT_THAT(error.what(), HasSubstr(": the transfer ended after 4000 of 10000 bytes"));
  EXPECT_THAT(error.what(), HasSubstr("(2 attempts)"));
  EXPECT_FALSE(path_exists(dir / "blob"));
}

TEST(ImageRegistry, SmallBlobInMemory) {
  const std::string content = R"({"architecture":"amd64"})";
  FakeHttpServer server(
      [&](const FakeRequest& request) { return serve_blob(request, content, false); });
  RegistryClient client(local_reference(server.port()), quick_options());
  EXPECT_EQ(client.blob(sha256_digest(content), 1000), content);
  RegistryError error = registry_error([&] { client.blob(sha256_digest(content), 10); });
  EXPECT_THAT(error.what(), HasSubstr("larger than the limit of"));
  EXPECT_THAT(registry_error([&] { client.blob("sha256:1234", 10); }).what(),
              HasSubstr("not a sha256 digest"));
}

// --- retries -----------------------------------------------------------------------

TEST(ImageRegistry, ServerErrorsAreTriedAgain) {
  const std::string content = make_bytes(1000, 7);
  std::atomic<int> calls{0};
  FakeHttpServer server([&](const FakeRequest& request) {
    if (++calls <= 2) return FakeReply::with(500, "oops");
    return serve_blob(request, content, false);
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  EXPECT_EQ(client.blob(sha256_digest(content), 1 << 20), content);
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST(ImageRegistry, ServerErrorEveryTimeCountsTheAttempts) {
  const std::string digest = sha256_digest("x");
  FakeHttpServer server([&](const FakeRequest&) { return FakeReply::with(500, "oops"); });
  RegistryOptions options = quick_options();
  options.attempts = 3;
  RegistryClient client(local_reference(server.port()), options);
  RegistryError error = registry_error([&] { client.blob(digest, 100); });
  std::string registry = "127.0.0.1:" + std::to_string(server.port());
  EXPECT_EQ(std::string(error.what()), "registry " + registry +
                                           " answered 500 Internal Server Error for blob " +
                                           digest + " from " + registry + "/test/x (3 attempts)");
  EXPECT_EQ(error.status, 500);
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST(ImageRegistry, RateLimitHonoursRetryAfter) {
  std::atomic<int> calls{0};
  FakeHttpServer server([&](const FakeRequest&) {
    if (++calls == 1) return FakeReply::with(429).header("Retry-After", "0");
    return FakeReply::with(200, kManifest).header("Content-Type", kMediaTypeOciManifest);
  });
  RegistryOptions options = quick_options();
  // Retry-After replaces it: a client that waited the backoff would take
  // two minutes, far past the bound, however loaded the machine.
  options.backoff_ms = 120000;
  auto start = std::chrono::steady_clock::now();
  RegistryClient client(local_reference(server.port()), options);
  EXPECT_EQ(client.manifest("1").body, kManifest);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(ImageRegistry, RateLimitedEveryTime) {
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(429, errors_body("TOOMANYREQUESTS", "slow down"))
        .header("Retry-After", "0");
  });
  RegistryOptions options = quick_options();
  options.attempts = 2;
  RegistryClient client(local_reference(server.port()), options);
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_EQ(error.status, 429);
  EXPECT_THAT(error.what(), HasSubstr("rate limited (429)"));
  EXPECT_THAT(error.what(), HasSubstr("(2 attempts): slow down"));
}

TEST(ImageRegistry, ConnectionRefusedIsTriedAgainThenNamed) {
  // A port that stays closed: a socket bound to it that does not listen
  // refuses every connection and keeps another program from taking it.
  int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const uint16_t port = ntohs(address.sin_port);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_holder{holder};
  RegistryOptions options = quick_options();
  options.attempts = 2;
  RegistryClient client(local_reference(port), options);
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(), HasSubstr("connect to 127.0.0.1:" + std::to_string(port) +
                                      ": Connection refused (2 attempts)"));
  EXPECT_EQ(error.status, 0);
}

TEST(ImageRegistry, SilentServerTimesOut) {
  FakeHttpServer server([](const FakeRequest&) { return FakeReply::of(Action::hang); });
  RegistryOptions options = quick_options();
  options.timeout_ms = 300;
  options.attempts = 1;
  RegistryClient client(local_reference(server.port()), options);
  auto start = std::chrono::steady_clock::now();
  RegistryError error = registry_error([&] { client.manifest("1"); });
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(error.what(),
              HasSubstr("read the answer from 127.0.0.1:" + std::to_string(server.port()) +
                        ": timed out after 300 ms (1 attempt)"));
  EXPECT_GE(elapsed, std::chrono::milliseconds(250));
  EXPECT_LT(elapsed, std::chrono::seconds(2));
}

// --- authentication ----------------------------------------------------------------

TEST(ImageRegistry, BearerTokenFlow) {
  const std::string content = make_bytes(3000, 8);
  const std::string digest = sha256_digest(content);
  std::atomic<uint16_t> port{0};
  FakeHttpServer server([&](const FakeRequest& request) {
    if (request.path == "/token")
      return FakeReply::with(200, R"({"token":"t0k3n","expires_in":300})");
    if (request.header("authorization") != "Bearer t0k3n") {
      // No scope: the client asks for pull on the repository.
      return FakeReply::with(401, errors_body("UNAUTHORIZED", "authentication required"))
          .header("WWW-Authenticate",
                  "Bearer realm=\"http://127.0.0.1:" + std::to_string(port.load()) +
                      "/token\",service=\"fake registry\"");
    }
    if (request.path == kRepository + "/manifests/1")
      return FakeReply::with(200, kManifest).header("Content-Type", kMediaTypeOciManifest);
    return serve_blob(request, content, false);
  });
  port = server.port();
  RegistryClient client(local_reference(server.port()), quick_options());
  EXPECT_EQ(client.manifest("1").body, kManifest);
  EXPECT_EQ(client.blob(digest, 1 << 20), content);

  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[0].header("authorization"), "");
  EXPECT_EQ(requests[1].path, "/token");
  EXPECT_EQ(requests[1].query["service"], "fake registry");
  EXPECT_EQ(requests[1].query["scope"], "repository:test/x:pull");
  EXPECT_EQ(requests[1].header("authorization"), "");
  EXPECT_EQ(requests[2].header("authorization"), "Bearer t0k3n");
  EXPECT_EQ(requests[3].header("authorization"), "Bearer t0k3n");  // the token is kept
}

TEST(ImageRegistry, RefusedEvenWithAToken) {
  std::atomic<uint16_t> port{0};
  FakeHttpServer server([&](const FakeRequest& request) {
    if (request.path == "/token") return FakeReply::with(200, R"({"access_token":"abc"})");
    return FakeReply::with(401).header(
        "WWW-Authenticate", "Bearer realm=\"http://127.0.0.1:" + std::to_string(port.load()) +
                                "/token\",service=\"svc\",scope=\"repository:test/x:pull,push\"");
  });
  port = server.port();
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_EQ(error.status, 401);
  EXPECT_EQ(std::string(error.what()),
            "127.0.0.1:" + std::to_string(server.port()) +
                "/test/x:1: registry 127.0.0.1:" + std::to_string(server.port()) +
                " requires authentication; anonymous access was refused");
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[1].query["scope"], "repository:test/x:pull,push");
  EXPECT_EQ(requests[2].header("authorization"), "Bearer abc");
}

TEST(ImageRegistry, BasicChallengeIsRefused) {
  FakeHttpServer server([&](const FakeRequest&) {
    return FakeReply::with(401).header("WWW-Authenticate", "Basic realm=\"registry\"");
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_EQ(error.status, 401);
  EXPECT_THAT(error.what(), HasSubstr("requires authentication; anonymous access was refused"));
  EXPECT_EQ(server.requests().size(), 1u);
}

// --- redirects ---------------------------------------------------------------------

TEST(ImageRegistry, RedirectToAnotherHostDropsTheToken) {
  const std::string content = make_bytes(50000, 9);
  const std::string digest = sha256_digest(content);
  FakeHttpServer cdn(
      [&](const FakeRequest& request) { return serve_blob(request, content, false); });
  std::atomic<uint16_t> port{0};
  FakeHttpServer server([&](const FakeRequest& request) {
    if (request.path == "/token") return FakeReply::with(200, R"({"token":"secret"})");
    if (request.header("authorization") != "Bearer secret")
      return FakeReply::with(401).header(
          "WWW-Authenticate",
          "Bearer realm=\"http://127.0.0.1:" + std::to_string(port.load()) + "/token\"");
    return FakeReply::with(307).header("Location", cdn.origin() + "/cdn/" + digest + "?sig=1");
  });
  port = server.port();
  TempDir dir;
  RegistryClient client(local_reference(server.port()), quick_options());
  client.blob_to_file(digest, static_cast<int64_t>(content.size()), dir / "blob", nullptr);
  EXPECT_EQ(read_file(dir / "blob"), content);
  auto cdn_requests = cdn.requests();
  ASSERT_EQ(cdn_requests.size(), 1u);
  EXPECT_EQ(cdn_requests[0].target, "/cdn/" + digest + "?sig=1");
  EXPECT_EQ(cdn_requests[0].header("authorization"), "");
  EXPECT_EQ(cdn_requests[0].header("host"), "127.0.0.1:" + std::to_string(cdn.port()));
}

TEST(ImageRegistry, RedirectLoopEnds) {
  FakeHttpServer server([&](const FakeRequest& request) {
    return FakeReply::with(302).header("Location", request.path + "x");
  });
  RegistryClient client(local_reference(server.port()), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(), HasSubstr("more than 5 redirects"));
  EXPECT_EQ(server.requests().size(), 6u);
}

// --- TLS ---------------------------------------------------------------------------

struct Pki {
  std::string ca_pem, cert_pem, key_pem;
};

std::string pem_of(const std::function<int(BIO*)>& write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (write(bio.get()) != 1) throw std::runtime_error("PEM_write failed");
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!extension) throw std::runtime_error(std::string("extension ") + value);
  X509_add_ext(cert, extension, -1);
  X509_EXTENSION_free(extension);
}

using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;

// A certificate for key, signed by issuer (self-signed without one).
CertPtr make_certificate(EVP_PKEY* key, const char* common_name, X509* issuer, EVP_PKEY* issuer_key,
                         const char* alt_names) {
  static long serial = 1;
  CertPtr cert(X509_new(), X509_free);
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer ? issuer : cert.get();
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (!issuer) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth");
    add_extension(cert.get(), signer, NID_subject_alt_name, alt_names);
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0)
    throw std::runtime_error("X509_sign failed");
  return cert;
}

// A throwaway CA and a certificate for registry.test that it signed.
const Pki& test_pki() {
  static const Pki pki = [] {
    using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
    KeyPtr ca_key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    KeyPtr key(EVP_EC_gen("P-256"), EVP_PKEY_free);
    if (!ca_key || !key) throw std::runtime_error("EVP_EC_gen failed");
    CertPtr ca = make_certificate(ca_key.get(), "openshell test CA", nullptr, nullptr, nullptr);
    CertPtr cert =
        make_certificate(key.get(), "registry.test", ca.get(), ca_key.get(), "DNS:registry.test");
    Pki out;
    out.ca_pem = pem_of([&](BIO* bio) { return PEM_write_bio_X509(bio, ca.get()); });
    out.cert_pem = pem_of([&](BIO* bio) { return PEM_write_bio_X509(bio, cert.get()); });
    out.key_pem = pem_of([&](BIO* bio) {
      return PEM_write_bio_PrivateKey(bio, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    });
    return out;
  }();
  return pki;
}

std::shared_ptr<boost::asio::ssl::context> server_tls() {
  namespace ssl = boost::asio::ssl;
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->use_certificate_chain(boost::asio::buffer(test_pki().cert_pem));
  context->use_private_key(boost::asio::buffer(test_pki().key_pem), ssl::context::pem);
  return context;
}

// Names that resolve to 127.0.0.1 through a hosts file, and no nameserver.
class ImageRegistryTls : public ::testing::Test {
 protected:
  ImageRegistryTls()
      : hosts_("OPENSHELL_HOSTS_FILE", dir_ / "hosts"),
        dns_("OPENSHELL_DNS_SERVERS", "127.0.0.1:9"),
        cert_dir_("SSL_CERT_DIR", dir_ / "no-certs") {
    write_file(dir_ / "hosts", "127.0.0.1 registry.test other.test\n");
    write_file(dir_ / "ca.pem", test_pki().ca_pem);
  }

  Reference reference(const char* host, const FakeHttpServer& server) {
    return parse_reference(std::string(host) + ":" + std::to_string(server.port()) + "/test/x:1");
  }

  TempDir dir_;
  ScopedEnv hosts_;
  ScopedEnv dns_;
  ScopedEnv cert_dir_;
};

TEST_F(ImageRegistryTls, OverHttpsWithTheCaTrusted) {
  ScopedEnv cert_file("SSL_CERT_FILE", dir_ / "ca.pem");
  FakeHttpServer server(
      [&](const FakeRequest&) {
        return FakeReply::with(200, kManifest).header("Content-Type", kMediaTypeOciManifest);
      },
      server_tls());
  RegistryClient client(reference("registry.test", server), quick_options());
  EXPECT_EQ(client.manifest("1").body, kManifest);
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].header("host"), "registry.test:" + std::to_string(server.port()));
}

TEST_F(ImageRegistryTls, RefusesAnUntrustedCertificate) {
  ScopedEnv cert_file("SSL_CERT_FILE", std::nullopt);
  FakeHttpServer server([&](const FakeRequest&) { return FakeReply::with(200, kManifest); },
                        server_tls());
  RegistryClient client(reference("registry.test", server), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(),
              HasSubstr("TLS handshake with registry.test:" + std::to_string(server.port()) +
                        ": certificate verify failed"));
  EXPECT_EQ(error.status, 0);
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(ImageRegistryTls, RefusesACertificateForAnotherName) {
  ScopedEnv cert_file("SSL_CERT_FILE", dir_ / "ca.pem");
  FakeHttpServer server([&](const FakeRequest&) { return FakeReply::with(200, kManifest); },
                        server_tls());
  RegistryClient client(reference("other.test", server), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(), HasSubstr("certificate verify failed: hostname mismatch"));
}

TEST_F(ImageRegistryTls, RefusesARedirectToPlainHttp) {
  ScopedEnv cert_file("SSL_CERT_FILE", dir_ / "ca.pem");
  FakeHttpServer plain([&](const FakeRequest&) { return FakeReply::with(200, kManifest); });
  FakeHttpServer server(
      [&](const FakeRequest&) {
        return FakeReply::with(302).header("Location", plain.origin() + "/manifest");
      },
      server_tls());
  RegistryClient client(reference("registry.test", server), quick_options());
  RegistryError error = registry_error([&] { client.manifest("1"); });
  EXPECT_THAT(error.what(), HasSubstr("refused the redirect from https://registry.test:" +
                                      std::to_string(server.port()) + " to plain HTTP"));
  EXPECT_TRUE(plain.requests().empty());
}

}  // namespace
}  // namespace openshell::image
