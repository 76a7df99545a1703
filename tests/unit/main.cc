// The unit tests' main: GoogleTest's, plus a reproducible environment. It
// is also a sandbox's init, as the openshell binary is: a test that starts a
// runtime::Container has this binary exec'd as its PID 1.
#include <clocale>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/init.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "__init") == 0)
    return openshell::runtime::init_main(argc, argv);
  // Error messages carry strerror() text; the tests expect the C locale's.
  std::setlocale(LC_ALL, "C");
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
