// `openshell image build` end to end, as root and rootless: Containerfiles
// built on the busybox image (and on the Debian base image where the run
// has it), the step cache, a failing RUN leaving nothing, hostile build
// contexts, refused instructions, and RUN's network.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>

#include "harness.h"
#include "image_helpers.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

using image_helpers::busybox_layout;
using image_helpers::q;
using image_helpers::sh;
using image_helpers::Shell;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class ImageBuild : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    if (busybox_layout().empty()) GTEST_SKIP() << "the busybox image could not be built";
    static int counter = 0;
    const std::string n = mode_name(mode()) + "-" + std::to_string(++counter);
    home_ = make_dir(mode(), "build-home-" + n, 0700);
    context_ = make_dir(mode(), "build-ctx-" + n, 0755);
    Result r = os({"image", "import", busybox_layout(), "busybox"});
    ASSERT_EQ(r.status, 0) << r.err;
  }
  void TearDown() override {
    if (!home_.empty()) {
      EXPECT_EQ(file_contents_of_dir(home_ + "/images/tmp"), "")
          << "work in progress left in the store";
    }
    ModeTest::TearDown();
  }
  Result os(const std::vector<std::string>& args, Options o = {}) {
    o.env.push_back("OPENSHELL_HOME=" + home_);
    if (o.timeout_s == 30) o.timeout_s = 300;
    return openshell(mode(), args, o);
  }
  // A file of the context, readable by the mode's user.
  void put(const std::string& name, const std::string& content) {
    write_file(context_ + "/" + name, content);
  }
  Result build(const std::string& tag, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"image", "build", "-t", tag};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(context_);
    return os(args);
  }
  Result run_image(const std::string& image, const std::vector<std::string>& command) {
    std::vector<std::string> args = {"run", "--image", image, "--"};
    args.insert(args.end(), command.begin(), command.end());
    return os(args);
  }
  std::string names() { return os({"image", "list", "-q"}).out; }
  std::string layers() { return file_contents_of_dir(home_ + "/images/layers"); }

  std::string home_, context_;
};

TEST_P(ImageBuild, BuildsAnImageThatRunsWithItsFilesAndConfig) {
  put("Containerfile",
      "# syntax=docker/dockerfile:1\n"
      "FROM busybox\n"
      "ARG WHO=nobody\n"
      "ENV GREETING=\"hello $WHO\" \\\n"
      "    PLAIN=yes\n"
      "RUN echo \"$GREETING\" > /greeting && mkdir -p /opt/app && echo ran-as-$(id -u)\n"
      "RUN touch /by-42 && (chown 42:42 /by-42 2>/dev/null || true)\n"
      "COPY notes.txt src/ /opt/app/\n"
      "COPY --chown=1000:1000 owned.txt /home/owned.txt\n"
      "COPY --chmod=600 notes.txt /secret-notes\n"
      "WORKDIR /opt/app\n"
      "LABEL purpose=test\n"
      "EXPOSE 8080 53/udp\n"
      "USER 1000\n"
      "CMD [\"cat\", \"/greeting\"]\n");
  put("notes.txt", "notes\n");
  put("owned.txt", "mine\n");
  put(".dockerignore", "src/*.log\n!src/keep.log\n");
  ASSERT_EQ(::mkdir((context_ + "/src").c_str(), 0755), 0);
  put("src/main.c", "int main;\n");
  put("src/debug.log", "excluded\n");
  put("src/keep.log", "kept\n");

  Result b = build("tools:1", {"--build-arg", "WHO=world"});
  ASSERT_EQ(b.status, 0) << b.err << b.out;
  EXPECT_THAT(b.out, HasSubstr("STEP 4/13: RUN echo"));
  EXPECT_THAT(b.out, HasSubstr("ran-as-0"));  // RUN runs as root of its namespace
  EXPECT_THAT(b.out, HasSubstr("STEP 6/13: COPY notes.txt src/ /opt/app/"));
  EXPECT_THAT(b.out, testing::ContainsRegex("--> done in [0-9.]+ s"));
  EXPECT_THAT(b.out, testing::ContainsRegex("Built localhost/tools:1 sha256:[0-9a-f]{64}\n$"));
  EXPECT_EQ(names(), "localhost/busybox:latest\nlocalhost/tools:1\n");

  Result cmd = run_image("tools:1", {});
  EXPECT_EQ(cmd.out, "hello world\n") << cmd.err;
  Result look = run_image(
      "tools:1",
      {"sh", "-c", "pwd; id -u; echo $PLAIN; cat notes.txt main.c keep.log; ls debug.log 2>&1"});
  EXPECT_EQ(look.out,
            "/opt/app\n1000\nyes\nnotes\nint main;\nkept\n"
            "ls: debug.log: No such file or directory\n")
      << look.err;
  // The layers' owners, as the blobs (what push sends) record them: root's
  // files are root's, --chown's and the RUN's chown are as they said, in
  // every mode. (A rootless store unpacks every file as the caller's, so
  // inside a rootless sandbox they show as its user; as root they keep
  // their owners.)
  Shell owners =
      sh("for f in " + q(home_) +
         "/images/blobs/sha256/*; do tar --numeric-owner -tvzf \"$f\" 2>/dev/null; "
         "done | awk '{print $1, $2, $NF}' | grep -E ' (opt/app/notes.txt|home/owned.txt|"
         "greeting|by-42|secret-notes)$' | sort -k3");
  const std::string by42 = mode() == Mode::kRootlessSingle ? "0/0" : "42/42";
  EXPECT_EQ(owners.out, "-rw-r--r-- " + by42 +
                            " by-42\n-rw-r--r-- 0/0 greeting\n-rw-r--r-- 1000/1000 "
                            "home/owned.txt\n-rw-r--r-- 0/0 opt/app/notes.txt\n-rw------- 0/0 "
                            "secret-notes\n");
  if (mode() == Mode::kRoot) {
    Result stat = run_image(
        "tools:1", {"stat", "-c", "%u:%g %n", "/opt/app/notes.txt", "/home/owned.txt", "/by-42"});
    EXPECT_EQ(stat.out, "0:0 /opt/app/notes.txt\n1000:1000 /home/owned.txt\n42:42 /by-42\n")
        << stat.err;
  }

  Result inspect = os({"image", "inspect", "tools:1"});
  EXPECT_THAT(inspect.out, HasSubstr("\"working_dir\": \"/opt/app\""));
  EXPECT_THAT(inspect.out, HasSubstr("\"source\": \"build "));
  // The config blob records what the image's record does not show.
  Result json = os({"image", "build", "-q", "-t", "tools:1", context_});
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_THAT(json.out, testing::MatchesRegex("sha256:[0-9a-f]{64}\n"));
  Result config = os({"image", "inspect", "tools:1"});
  const std::string blob = home_ + "/images/blobs/sha256/" + json.out.substr(7, 64);
  const std::string text = file_contents(blob);
  EXPECT_THAT(text, HasSubstr("\"8080/tcp\""));
  EXPECT_THAT(text, HasSubstr("\"53/udp\""));
  EXPECT_THAT(text, HasSubstr("\"purpose\":\"test\""));
  EXPECT_THAT(text, HasSubstr("\"empty_layer\":true"));

  // A sandbox of the gateway starts from it too, and rm removes its name.
  Result create = os(
      {"sandbox", "create", "--no-keep", "--from", "tools:1", "--", "cat", "/opt/app/notes.txt"});
  EXPECT_EQ(create.out, "notes\n") << create.err;
  os({"gateway", "stop"});
  EXPECT_EQ(os({"image", "rm", "tools:1"}).status, 0);
  EXPECT_EQ(names(), "localhost/busybox:latest\n");
}

TEST_P(ImageBuild, RebuildIsCachedAndAChangedCopyRerunsFromItsStepOn) {
  put("Containerfile",
      "FROM busybox\n"
      "RUN echo one > /one\n"
      "COPY data.txt /data.txt\n"
      "RUN cat /data.txt > /copied\n"
      "ENV DONE=1\n");
  put("data.txt", "first\n");
  Result first = build("cached");
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(count(first.out, "--> cached"), 0u) << first.out;
  EXPECT_EQ(count(first.out, "--> done in"), 4u) << first.out;

  Result again = build("cached");
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(count(again.out, "--> cached"), 4u) << again.out;
  EXPECT_EQ(count(again.out, "--> done in"), 0u) << again.out;
  const std::string id = again.out.substr(again.out.rfind("sha256:"));
  Result json = build("cached", {"-o", "json"});
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"cached\": 4"));
  EXPECT_THAT(json.out, HasSubstr("\"steps\": 5"));
  EXPECT_THAT(json.out, HasSubstr("\"id\": \"" + id.substr(0, 71) + "\""));
  EXPECT_THAT(json.err, HasSubstr("STEP 2/5"));                 // the steps go to stderr
  EXPECT_EQ(first.out.substr(first.out.rfind("sha256:")), id);  // the same image

  put("data.txt", "second\n");
  Result changed = build("cached");
  ASSERT_EQ(changed.status, 0) << changed.err;
  // Steps 2 (RUN) cached; 3 (COPY), 4 (RUN) and 5 (ENV) run again.
  EXPECT_EQ(count(changed.out, "--> cached"), 1u) << changed.out;
  EXPECT_EQ(count(changed.out, "--> done in"), 3u) << changed.out;
  EXPECT_THAT(changed.out.substr(changed.out.find("STEP 2/5")),
              testing::StartsWith("STEP 2/5: RUN echo one > /one\n--> cached\n"));
  EXPECT_EQ(run_image("cached", {"cat", "/copied"}).out, "second\n");

  Result fresh = build("cached", {"--no-cache"});
  ASSERT_EQ(fresh.status, 0) << fresh.err;
  EXPECT_EQ(count(fresh.out, "--> cached"), 0u) << fresh.out;

  // prune drops the cache with the layers only it kept.
  os({"image", "rm", "cached"});
  os({"image", "prune"});
  EXPECT_EQ(file_contents_of_dir(home_ + "/images/build-cache"), "");
  Result after = build("cached");
  EXPECT_EQ(count(after.out, "--> cached"), 0u) << after.out;
}

TEST_P(ImageBuild, AFailedRunLeavesNothingAndNamesTheStep) {
  put("Containerfile", "FROM busybox\nENV A=1\nRUN echo partial > /junk; sleep 1 & exit 3\n");
  const std::string names_before = names();
  const std::string layers_before = layers();
  Result r = build("broken");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("openshell: step 3/3 (RUN echo partial > /junk; sleep 1 & exit 3) failed: "
                        "exit status 3"));
  EXPECT_EQ(names(), names_before);
  EXPECT_EQ(layers(), layers_before);
  EXPECT_EQ(file_contents_of_dir(home_ + "/images/tmp"), "");
  // cgroups and processes: the fixture's TearDown.
}

TEST_P(ImageBuild, HostileContextsAreRefused) {
  put("secret-target", "");
  ASSERT_EQ(::symlink("/etc/shadow", (context_ + "/out-link").c_str()), 0);
  ASSERT_EQ(::symlink("../..", (context_ + "/up-link").c_str()), 0);
  const std::string layers_before = layers();
  struct Case {
    std::string copy;
    std::string why;
  };
  const Case cases[] = {
      {"COPY out-link /x", "out-link: leads outside the build context"},
      {"COPY up-link/etc/passwd /x", "up-link/etc/passwd: leads outside the build context"},
      {"COPY ../../etc/passwd /x", "../../etc/passwd: outside the build context"},
      {"ADD /etc/passwd /x", "/etc/passwd: an absolute source"},
      {"ADD http://127.0.0.1:9/x /x", "URLs are not supported"},
  };
  for (const auto& c : cases) {
    put("Containerfile", "FROM busybox\n" + c.copy + "\n");
    Result r = build("hostile");
    EXPECT_EQ(r.status, 125) << c.copy << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("Containerfile:2: " + c.copy.substr(0, c.copy.find(' ')) + ":"))
        << c.copy;
    EXPECT_THAT(r.err, HasSubstr(c.why)) << c.copy;
  }
  EXPECT_THAT(names(), Not(HasSubstr("hostile")));
  EXPECT_EQ(layers(), layers_before);
  // A destination's ".." stays inside the image: resolved by name, never
  // above its root.
  put("note", "inside\n");
  put("Containerfile",
      "FROM busybox\nWORKDIR /w\nCOPY note ../../../../../../../../escaped-dest\n");
  Result dest = build("dest");
  ASSERT_EQ(dest.status, 0) << dest.err;
  EXPECT_EQ(run_image("dest", {"cat", "/escaped-dest"}).out, "inside\n");
  for (std::filesystem::path p = home_ + "/images/tmp/x"; p != p.parent_path(); p = p.parent_path())
    EXPECT_FALSE(std::filesystem::exists(p.parent_path() / "escaped-dest")) << p.parent_path();

  // A link inside a copied directory is copied as a link, never followed.
  ASSERT_EQ(::mkdir((context_ + "/dir").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("/etc/hostname", (context_ + "/dir/link").c_str()), 0);
  put("Containerfile", "FROM busybox\nCOPY dir /dir\n");
  Result ok = build("links");
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(run_image("links", {"readlink", "/dir/link"}).out, "/etc/hostname\n");
}

TEST_P(ImageBuild, AddUnpacksALocalArchiveAndRefusesOneThatClimbsOut) {
  Shell made = sh("cd " + q(context_) +
                  " && python3 -c \"import io, tarfile, sys\n"
                  "def add(t, name, data, mode=0o644):\n"
                  "    i = tarfile.TarInfo(name); i.size = len(data); i.mode = mode\n"
                  "    t.addfile(i, io.BytesIO(data))\n"
                  "with tarfile.open('app.tar.gz', 'w:gz') as t:\n"
                  "    add(t, 'app/run.sh', b'echo run\\\\n', 0o755)\n"
                  "with tarfile.open('bad.tar', 'w') as t:\n"
                  "    add(t, '../../escaped', b'x')\n"
                  "with tarfile.open('other.tar.xz', 'w:xz') as t:\n"
                  "    add(t, 'x', b'x')\n"
                  "\" && chmod a+r *.tar*");
  ASSERT_EQ(made.status, 0) << made.out;
  put("plain.txt", "not an archive\n");
  put("Containerfile", "FROM busybox\nADD app.tar.gz plain.txt /opt/\n");
  Result ok = build("added");
  ASSERT_EQ(ok.status, 0) << ok.err;
  Result look = run_image("added", {"sh", "-c", "/opt/app/run.sh; cat /opt/plain.txt; ls /opt"});
  EXPECT_EQ(look.out, "run\nnot an archive\napp\nplain.txt\n") << look.err;

  const std::string layers_before = layers();
  put("Containerfile", "FROM busybox\nADD bad.tar /opt/\n");
  Result bad = build("bad");
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr("Containerfile:2: ADD: bad.tar"));
  EXPECT_THAT(bad.err, HasSubstr("../../escaped"));
  EXPECT_FALSE(std::filesystem::exists(context_ + "/../escaped"));
  put("Containerfile", "FROM busybox\nADD other.tar.xz /opt/\n");
  Result xz = build("bad");
  EXPECT_EQ(xz.status, 125);
  EXPECT_THAT(xz.err, HasSubstr("ADD unpacks tar archives, gzip- or zstd-compressed, only"));
  // A name that would read as a whiteout in the layer is refused.
  put(".wh.passwd", "x\n");
  put("Containerfile", "FROM busybox\nCOPY .wh.passwd /etc/\n");
  Result wh = build("bad");
  EXPECT_EQ(wh.status, 125);
  EXPECT_THAT(wh.err, HasSubstr("Containerfile:2: COPY: 'etc/.wh.passwd': a name starting with "
                                ".wh. would read as a whiteout"));
  EXPECT_EQ(layers(), layers_before);
}

TEST_P(ImageBuild, RefusedInstructionsNameTheFileAndLine) {
  put("Containerfile", "FROM busybox\nRUN true\nHEALTHCHECK CMD true\n");
  Result r = build("refused");
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(
      r.err, HasSubstr(context_ + "/Containerfile:3: HEALTHCHECK: not supported (sandboxes have no "
                                  "health checks)"));
  EXPECT_THAT(r.out, Not(HasSubstr("STEP")));  // nothing ran
  put("Containerfile", "FROM busybox AS one\nRUN true\nFROM one\n");
  Result multi = build("refused");
  EXPECT_EQ(multi.status, 125);
  EXPECT_THAT(multi.err, HasSubstr("Containerfile:3: FROM: a second FROM: multi-stage builds"));
  Result missing = os({"image", "build", "-t", "x", "-f", context_ + "/nope", context_});
  EXPECT_EQ(missing.status, 125);
  EXPECT_THAT(missing.err, HasSubstr("/nope: No such file or directory"));
}

TEST_P(ImageBuild, RunHasNoNetworkUnlessThePolicyAllowsIt) {
  TestServer server;
  const std::string port = std::to_string(server.port());
  // Without --policy: only a loopback of its own, and the host's server
  // is out of reach.
  put("Containerfile",
      "FROM busybox\nRUN cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; "
      "wget -q -O - http://127.0.0.1:" +
          port + "/ 2>/dev/null && echo REACHED || echo unreachable\n");
  Result none = build("offline", {"--no-cache"});
  ASSERT_EQ(none.status, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("\nlo\nunreachable\n"));
  EXPECT_EQ(server.connections(), 0);

  // With a policy that allows it: through the egress proxy.
  const std::string policy = context_ + "/policy.toml";
  write_file(policy,
             "version = 1\n[network_policies.local]\nendpoints = [ { host = \"localhost\", "
             "port = " +
                 port + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  put("Containerfile", "FROM busybox\nRUN wget -q -O - http://localhost:" + port + "/\n");
  Result allowed = build("online", {"--policy", policy});
  ASSERT_EQ(allowed.status, 0) << allowed.err << allowed.out;
  EXPECT_THAT(allowed.out, HasSubstr("hello from the test server"));
  EXPECT_GE(server.connections(), 1);
}

TEST_P(ImageBuild, InstallsADebianPackageFromALocalRepository) {
  if (image_helpers::base_layout_source().empty())
    GTEST_SKIP() << "OSH_BASE_LAYOUT is not set (scripts/test builds the Debian base image with "
                    "openshell image build-base --output)";
  const std::string& readable = image_helpers::readable_base_layout();
  ASSERT_FALSE(readable.empty());
  Result imp = os({"image", "import", readable, "debian"});
  ASSERT_EQ(imp.status, 0) << imp.err;

  // A package of our own, in a flat repository in the context.
  const std::string pkg = context_ + "/pkg";
  Shell made = sh(
      "mkdir -p " + q(pkg + "/DEBIAN") + " " + q(pkg + "/usr/share/osh-hello") + " " +
      q(context_ + "/repo") + " && printf 'Package: osh-hello\\nVersion: " +
      "1.0\\nArchitecture: all\\nMaintainer: Test <test@localhost>\\nDescription: " +
      "test package\\n' > " + q(pkg + "/DEBIAN/control") + " && echo 'hello from the package' > " +
      q(pkg + "/usr/share/osh-hello/hello.txt") + " && dpkg-deb -b " + q(pkg) + " " +
      q(context_ + "/repo/osh-hello_1.0_all.deb") + " >/dev/null && cd " + q(context_ + "/repo") +
      " && dpkg-scanpackages . /dev/null > Packages 2>/dev/null && chmod -R a+rX " + q(context_));
  ASSERT_EQ(made.status, 0) << made.out;
  put(".dockerignore", "pkg\n");
  put("notes.txt", "copied notes\n");
  // With a single id, apt cannot drop to its _apt user: it stays root.
  const std::string apt_user = mode() == Mode::kRootlessSingle ? " -o APT::Sandbox::User=root" : "";
  put("Containerfile",
      "FROM debian\n"
      "COPY repo /repo\n"
      "ARG APT=\"apt-get -o Dir::Etc::SourceParts=/dev/null -o "
      "Dir::Etc::SourceList=/etc/apt/sources.list.d/local.list" +
          apt_user +
          "\"\n"
          "RUN echo 'deb [trusted=yes] file:/repo ./' > /etc/apt/sources.list.d/local.list && \\\n"
          "    $APT update -q && $APT install -y -q osh-hello\n"
          "COPY notes.txt /srv/notes.txt\n");
  Options slow;
  slow.timeout_s = 600;
  Result b = os({"image", "build", "-t", "with-hello", context_}, slow);
  ASSERT_EQ(b.status, 0) << b.err << b.out;
  EXPECT_THAT(b.out, HasSubstr("Setting up osh-hello (1.0)"));
  Result r = run_image("with-hello", {"sh", "-c",
                                      "cat /usr/share/osh-hello/hello.txt /srv/notes.txt; "
                                      "dpkg-query -W -f '${Status}\\n' osh-hello; ls /pkg 2>&1"});
  EXPECT_EQ(r.out,
            "hello from the package\ncopied notes\ninstall ok installed\n"
            "ls: cannot access '/pkg': No such file or directory\n")
      << r.err;
}

E2E_ALL_MODES(ImageBuild);

}  // namespace
}  // namespace e2e
