// File-backed host memory: mkstemp + unlink + mmap(MAP_SHARED); msync, MADV_DONTNEED and FADV_DONTNEED page it out.
#include "runtime/file_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zero {

namespace {

absl::Status errno_error(absl::string_view what, const std::string& where) {
  return absl::Status(absl::ErrnoToStatusCode(errno), absl::StrCat(what, " ", where, ": ", std::strerror(errno)));
}

// A new, already unlinked file in `dir`, open for reading and writing.
absl::StatusOr<int> open_anonymous_file(const std::string& dir) {
  std::string path = absl::StrCat(dir, "/zero-offload-XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd < 0) return errno_error("cannot create a file in", dir);
  unlink(path.c_str());
  return fd;
}

}  // namespace

absl::StatusOr<FileMemory> file_alloc(const std::string& dir, size_t nbytes) {
  // Checked first, so that a request that cannot fit never fills the drive while posix_fallocate tries.
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) == 0) {
    const size_t free_bytes = static_cast<size_t>(fs.f_bavail) * fs.f_frsize;
    if (nbytes > free_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", nbytes, " bytes for a file in ", dir,
                                                       ": only ", free_bytes,
                                                       " bytes are free there; free space or choose another drive"));
    }
  }
  absl::StatusOr<int> fd = open_anonymous_file(dir);
  if (!fd.ok()) return fd.status();
  // Reserve the blocks now: a sparse file would fail its first write-back on a full drive with SIGBUS,
  // in the middle of a step; this fails here, naming the directory.
  if (const int error = posix_fallocate(*fd, 0, static_cast<off_t>(nbytes)); error != 0) {
    errno = error;
    const absl::Status status = errno_error(absl::StrCat("cannot reserve ", nbytes, " bytes for a file in"), dir);
    close(*fd);
    return status;
  }
  void* data = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (data == MAP_FAILED) {
    const absl::Status status = errno_error(absl::StrCat("cannot map ", nbytes, " bytes of a file in"), dir);
    close(*fd);
    return status;
  }
  return FileMemory{.data = data, .fd = *fd};
}

void file_free(const FileMemory& memory, size_t nbytes) {
  munmap(memory.data, nbytes);
  close(memory.fd);
}

absl::Status file_page_out(const FileMemory& memory, size_t nbytes) {
  if (msync(memory.data, nbytes, MS_SYNC) != 0) return errno_error("cannot write back", "offloaded memory");
  if (madvise(memory.data, nbytes, MADV_DONTNEED) != 0) return errno_error("cannot drop", "offloaded memory");
  // The pages are clean now; drop them from the page cache too, so RAM holds none of them.
  posix_fadvise(memory.fd, 0, static_cast<off_t>(nbytes), POSIX_FADV_DONTNEED);
  return absl::OkStatus();
}

size_t file_resident_bytes(const FileMemory& memory, size_t nbytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_ram((nbytes + page - 1) / page);
  if (mincore(memory.data, nbytes, in_ram.data()) != 0) return 0;  // only fails for memory not mapped
  size_t resident = 0;
  for (unsigned char bits : in_ram) resident += (bits & 1) ? page : 0;
  return resident;
}

bool files_stay_in_ram(const std::string& dir) {
  struct statfs fs {};
  if (statfs(dir.c_str(), &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

absl::Status check_file_dir(const std::string& dir) {
  absl::StatusOr<int> fd = open_anonymous_file(dir);
  if (!fd.ok()) return fd.status();
  close(*fd);
  return absl::OkStatus();
}

}  // namespace zero
