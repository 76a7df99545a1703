// The unit tests' main: GoogleTest's, plus a reproducible environment.
#include <clocale>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  // Error messages carry strerror() text; the tests expect the C locale's.
  std::setlocale(LC_ALL, "C");
  ::testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
