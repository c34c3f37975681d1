// write_file_atomically: temporary file, fsync, rename, fsync of the directory.
#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero {
namespace {

absl::Status os_error(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

absl::Status write_all(int fd, const std::vector<absl::string_view>& parts, const std::string& path) {
  for (absl::string_view bytes : parts) {
    while (!bytes.empty()) {
      const ssize_t written = ::write(fd, bytes.data(), bytes.size());
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) return os_error("cannot write", path);
      bytes.remove_prefix(static_cast<size_t>(written));
    }
  }
  if (::fsync(fd) != 0) return os_error("cannot flush", path);
  return absl::OkStatus();
}

}  // namespace

absl::Status sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open directory", dir);
  const bool synced = ::fsync(fd) == 0;
  const absl::Status status = synced ? absl::OkStatus() : os_error("cannot flush directory", dir);
  ::close(fd);
  return status;
}

absl::Status write_file_atomically(const std::string& path, const std::vector<absl::string_view>& parts) {
  const std::string temporary = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return os_error("cannot create", path);  // the user's name for it: the temporary is ours
  absl::Status status = write_all(fd, parts, path);
  if (::close(fd) != 0 && status.ok()) status = os_error("cannot write", path);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) status = os_error("cannot replace", path);
  if (!status.ok()) {
    ::unlink(temporary.c_str());
    return status;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return sync_directory(parent.empty() ? "." : parent.string());
}

}  // namespace zero
