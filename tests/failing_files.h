// Offload files made to fail for a while, as a drive failing transiently would: each one's descriptor swapped for a
// read-only or write-only one on the same (unlinked) file, and put back.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::testing {

// The descriptors of the offload files (runtime/file_memory.h) this process has open under `dir`, in creation
// order (descriptor numbers only grow while an engine allocates them, as nothing closes one in between).
inline std::vector<int> offload_fds(const std::string& dir) {
  std::vector<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && absl::StrContains(target, dir + "/zero-offload-")) fds.push_back(std::stoi(entry.path().filename()));
  }
  std::sort(fds.begin(), fds.end());
  return fds;
}

// While it lives, `fds` can only be read (`flags` O_RDONLY: writes fail with EBADF) or only written (O_WRONLY:
// reads fail).
class FailingFiles {
 public:
  FailingFiles(std::vector<int> fds, int flags) : fds_(std::move(fds)) {
    for (const int fd : fds_) {
      saved_.push_back(dup(fd));
      const int other = open(absl::StrCat("/proc/self/fd/", fd).c_str(), flags);
      ZERO_CHECK(other >= 0, "reopening descriptor ", fd, ": ", std::strerror(errno));
      dup2(other, fd);
      close(other);
    }
  }
  ~FailingFiles() {
    for (size_t k = 0; k < saved_.size(); ++k) {
      dup2(saved_[k], fds_[k]);
      close(saved_[k]);
    }
  }
  FailingFiles(const FailingFiles&) = delete;
  FailingFiles& operator=(const FailingFiles&) = delete;

 private:
  std::vector<int> fds_;
  std::vector<int> saved_;
};

}  // namespace zero::testing
