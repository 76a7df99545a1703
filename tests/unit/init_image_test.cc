#include "runtime/init_image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace openshell::runtime {
namespace {

TEST(InitImage, IsASealedProgramNoOneCanChange) {
  UniqueFd image = make_init_image();
  ASSERT_TRUE(image) << "this kernel gives no executable memfd";
  EXPECT_TRUE(is_init_image(image.get()));
  char magic[4] = {};
  ASSERT_EQ(::pread(image.get(), magic, sizeof magic, 0), 4);
  EXPECT_EQ(std::string(magic, 4),
            "\x7f"
            "ELF");
  struct stat st {};
  ASSERT_EQ(::fstat(image.get(), &st), 0);
  EXPECT_LT(st.st_size, 4 << 20) << "the init's program is meant to be small";
  // Neither written, nor resized, nor mapped for writing, nor unsealed.
  EXPECT_EQ(::pwrite(image.get(), "x", 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(image.get(), 1), 0);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_WRITE, MAP_SHARED, image.get(), 0), MAP_FAILED);
  EXPECT_NE(::fcntl(image.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
}

TEST(InitImage, RunsAsTheInitWouldAndRefusesWhatIsNotOne) {
  UniqueFd image = make_init_image();
  ASSERT_TRUE(image);
  // Without its arguments it says what it is and fails, as `openshell
  // __init` does: the program is the init's.
  int err[2];
  ASSERT_EQ(::pipe(err), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(err[1], 2);
    char arg0[] = "openshell-init", arg1[] = "__init";
    char* argv[] = {arg0, arg1, nullptr};
    char* envp[] = {nullptr};
    ::syscall(SYS_execveat, image.get(), "", argv, envp, AT_EMPTY_PATH);
    ::_exit(99);
  }
  ::close(err[1]);
  std::string said;
  char buf[256];
  ssize_t n;
  while ((n = ::read(err[0], buf, sizeof buf)) > 0) said.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 125);
  EXPECT_EQ(said, "openshell: __init is internal to the runtime\n");

  // A file of the same size, not sealed, is not an image; nor is a pipe.
  openshell::testing::TempDir dir;
  struct stat st {};
  ASSERT_EQ(::fstat(image.get(), &st), 0);
  UniqueFd plain(::open((dir.path() + "/f").c_str(), O_RDWR | O_CREAT, 0600));
  ASSERT_TRUE(plain);
  ASSERT_EQ(::ftruncate(plain.get(), st.st_size), 0);
  EXPECT_FALSE(is_init_image(plain.get()));
  EXPECT_FALSE(is_init_image(-1));
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  EXPECT_FALSE(is_init_image(p[0]));
  ::close(p[0]);
  ::close(p[1]);
}

}  // namespace
}  // namespace openshell::runtime
