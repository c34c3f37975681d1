// The one way a test gets files of its own: a ScopedTempDir, unique to the process and removed after it.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::testing {

// ctest runs every test as a process of its own, two at a time, so a fixed name under
// ::testing::TempDir() is written by two tests at once and left behind by a run that fails. This is a
// directory made by mkdtemp under ::testing::TempDir() (TEST_TMPDIR where set; it ends in '/'), named
// after the running test (or, in SetUpTestSuite, its suite), and removed with everything in it when it
// goes out of scope, which it does when a test fails an assertion too.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string name = absl::StrCat(::testing::TempDir(), "zero_", running_test().substr(0, 100), "_XXXXXX");
    ZERO_CHECK(mkdtemp(name.data()) != nullptr, "mkdtemp(", name, "): ", std::strerror(errno));
    path_ = name;
  }
  ~ScopedTempDir() {
    std::error_code ignored;  // a destructor cannot fail the test; what is left is in the temporary directory
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // `name` in this directory, as a string (a file the test or a program it runs writes).
  std::string file(std::string_view name) const { return (path_ / name).string(); }

 private:
  // "Suite.Test" with the '/' of parameterized names replaced, or the suite's name between its tests.
  static std::string running_test() {
    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    const ::testing::TestInfo* test = unit.current_test_info();
    std::string name = test != nullptr ? absl::StrCat(test->test_suite_name(), ".", test->name())
                                       : std::string(unit.current_test_suite()->name());
    std::replace(name.begin(), name.end(), '/', '_');
    return name;
  }

  std::filesystem::path path_;
};

}  // namespace zero::testing
