// sandbox create --upload: the files are in the sandbox before its main
// process starts (the process itself looks), .gitignore is honoured unless
// --no-git-ignore, and a create whose upload fails leaves no sandbox.
#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

class CreateUpload : public GatewayTest {
 protected:
  CreateUpload() : GatewayTest("upload") {}
  // A project directory: what .gitignore leaves out beside what it keeps.
  std::string project(const std::string& name) {
    const std::string dir = make_dir(mode(), name + "-" + mode_name(mode()));
    make_dir(mode(), name + "-" + mode_name(mode()) + "/build");
    write_file(dir + "/main.c", "int main;\n");
    write_file(dir + "/.gitignore", "*.log\nbuild/\n");
    write_file(dir + "/debug.log", "noise\n");
    write_file(dir + "/build/out.o", "object\n");
    return dir;
  }
};
E2E_ALL_MODES(CreateUpload);

TEST_P(CreateUpload, FilesArriveBeforeTheMainProcessStarts) {
  const std::string dir = project("create-upload-proj");
  const std::string base = dir.substr(dir.rfind('/') + 1);
  const std::string note = write_file(scratch() + "/note-" + mode_name(mode()) + ".txt", "note\n");
  const std::string note_base = note.substr(note.rfind('/') + 1);
  // The main process lists what it finds as it starts: create shows it.
  Result r = os({"sandbox", "create", "--name", "up", "--from", rootfs(), "--upload", dir,
                 "--upload", note + ":/sandbox", "--", "sh", "-c",
                 "cd /sandbox && ls -a " + base + " && cat " + note_base});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, ".\n..\n.gitignore\nmain.c\nnote\n");
  // What was copied is said on stderr; stdout stays the main process's.
  EXPECT_THAT(r.err, HasSubstr("left out by"));
  EXPECT_EQ(phase("up"), "Completed");

  // --no-git-ignore copies everything.
  Result all = os({"sandbox", "create", "--name", "all", "--no-git-ignore", "-d", "--from",
                   rootfs(), "--upload", dir + ":/sandbox"});
  ASSERT_EQ(all.status, 0) << all.err;
  EXPECT_EQ(all.out, "all\n");
  Result seen = os({"sandbox", "exec", "all", "--", "sh", "-c",
                    "cd /sandbox/" + base + " && cat debug.log build/out.o && stat -c %U main.c"});
  EXPECT_EQ(seen.out, "noise\nobject\nsandbox\n") << seen.err;
}

TEST_P(CreateUpload, AFailedUploadLeavesNoSandbox) {
  const std::string dir = project("create-upload-bad");
  Result missing = os({"sandbox", "create", "--name", "m", "--from", rootfs(), "--upload",
                       scratch() + "/no-such-dir"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_THAT(missing.err, HasSubstr("no such file or directory"));
  Result relative =
      os({"sandbox", "create", "--name", "m", "--from", rootfs(), "--upload", dir + ":"});
  EXPECT_EQ(relative.status, 125);
  EXPECT_THAT(relative.err, HasSubstr("an empty destination"));
  // The sandbox refuses the copy (its policy lets it write only /sandbox
  // and /tmp): the create fails, and the sandbox it began is gone.
  Result refused = os({"sandbox", "create", "--name", "r", "--from", rootfs(), "--upload",
                       dir + ":/usr", "--", "true"});
  EXPECT_EQ(refused.status, 125);
  EXPECT_THAT(refused.err, HasSubstr("--upload " + dir + ":/usr: "));
  EXPECT_THAT(refused.err, HasSubstr("Permission denied"));
  EXPECT_THAT(refused.err, HasSubstr("sandbox 'r' was not created"));
  Result list = os({"sandbox", "list"});
  EXPECT_THAT(list.out, Not(HasSubstr("r ")));
  EXPECT_EQ(os({"sandbox", "get", "r"}).status, 125);
}

}  // namespace
}  // namespace e2e
