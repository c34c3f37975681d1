// write_file_atomically: the new contents replace the old whole, and a failed write leaves the old file as it was.
#include "runtime/atomic_file.h"

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/temp_dir.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

int files_in(const std::filesystem::path& dir) {
  return static_cast<int>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

TEST(AtomicFile, ReplacesTheFileWholeAndLeavesNothingElse) {
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("out.bin");
  ASSERT_TRUE(write_file_atomically(path, {"first ", "version"}).ok());
  ASSERT_TRUE(write_file_atomically(path, {"second"}).ok());
  EXPECT_EQ(contents(path), "second");
  EXPECT_EQ(files_in(dir.path()), 1) << "no temporary file is left beside it";
}

TEST(AtomicFile, AWriteTheOsRefusesLeavesTheOldFileAndNamesTheReason) {
  // The OS refuses a write past RLIMIT_FSIZE (EFBIG) as it refuses one on a full disk (ENOSPC): mid-file.
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("export.safetensors");
  ASSERT_TRUE(write_file_atomically(path, {"the previous export"}).ok());
  const std::string too_big(1 << 20, 'x');

  signal(SIGXFSZ, SIG_IGN);  // otherwise the write past the limit kills the process
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const absl::Status status = write_file_atomically(path, {too_big});
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);

  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("cannot write ", path, ": File too large")));
  EXPECT_EQ(contents(path), "the previous export");
  EXPECT_EQ(files_in(dir.path()), 1) << "the temporary file is removed";
}

TEST(AtomicFile, ADirectoryThatDoesNotExistIsNamed) {
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("missing/out.bin");
  const absl::Status status = write_file_atomically(path, {"x"});
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace zero
