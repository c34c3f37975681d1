// File-backed host memory: an anonymous mapping, and an unlinked file written and read with pwrite/pread (O_DIRECT).
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
#include "runtime/status.h"

namespace zero {

namespace {

absl::Status errno_error(absl::string_view what, const std::string& where) {
  return absl::Status(absl::ErrnoToStatusCode(errno), absl::StrCat(what, " ", where, ": ", std::strerror(errno)));
}

size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// What is mapped and transferred: whole pages, which O_DIRECT's alignment rules need.
size_t mapped_bytes(size_t nbytes) { return (nbytes + page_size() - 1) / page_size() * page_size(); }

// A new, already unlinked file in `dir`, open for reading and writing.
absl::StatusOr<int> open_anonymous_file(const std::string& dir) {
  std::string path = absl::StrCat(dir, "/zero-offload-XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd < 0) return errno_error("cannot create a file in", dir);
  unlink(path.c_str());
  return fd;
}

// pread or pwrite of all `n` bytes at offset 0, through short transfers and signals.
template <typename Transfer>
absl::Status transfer_all(Transfer transfer, absl::string_view what, int fd, char* data, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t moved = transfer(fd, data + done, n - done, static_cast<off_t>(done));
    if (moved < 0 && errno == EINTR) continue;
    if (moved <= 0) {
      if (moved == 0) errno = EIO;  // the file ended early: it was truncated under us
      return errno_error(what, "an offload file");
    }
    done += static_cast<size_t>(moved);
  }
  return absl::OkStatus();
}

// Buffered transfers (no O_DIRECT) leave the file's pages in the page cache: drop them, so RAM holds none.
absl::Status leave_no_cached_pages(const FileMemory& memory, size_t nbytes) {
  if (memory.direct) return absl::OkStatus();
  if (fdatasync(memory.fd) != 0) return errno_error("cannot flush", "an offload file");
  posix_fadvise(memory.fd, 0, static_cast<off_t>(mapped_bytes(nbytes)), POSIX_FADV_DONTNEED);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FileMemory> file_alloc(const std::string& dir, size_t nbytes) {
  const size_t mapped = mapped_bytes(nbytes);
  // Checked first, so that a request that cannot fit never fills the drive while posix_fallocate tries.
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) == 0) {
    const size_t free_bytes = static_cast<size_t>(fs.f_bavail) * fs.f_frsize;
    if (mapped > free_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot reserve ", mapped, " bytes for a file in ", dir,
                                                       ": only ", free_bytes,
                                                       " bytes are free there; free space or choose another drive"));
    }
  }
  absl::StatusOr<int> fd = open_anonymous_file(dir);
  if (!fd.ok()) return fd.status();
  // Reserve the blocks now: a write to a sparse file on a full drive would fail in the middle of a step; this
  // fails here, naming the directory.
  if (const int error = posix_fallocate(*fd, 0, static_cast<off_t>(mapped)); error != 0) {
    errno = error;
    const absl::Status status = errno_error(absl::StrCat("cannot reserve ", mapped, " bytes for a file in"), dir);
    close(*fd);
    return status;
  }
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) {
    const absl::Status status = errno_error(absl::StrCat("cannot map ", mapped, " bytes for a file in"), dir);
    close(*fd);
    return status;
  }
  // File systems without direct I/O (tmpfs before Linux 6.6, some network ones) refuse the flag: buffered there.
  const bool direct = fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_DIRECT) == 0;
  return FileMemory{.data = data, .fd = *fd, .direct = direct};
}

void file_free(const FileMemory& memory, size_t nbytes) {
  munmap(memory.data, mapped_bytes(nbytes));
  close(memory.fd);
}

absl::Status file_write_out(const FileMemory& memory, size_t nbytes) {
  ZERO_RETURN_IF_ERROR(
      transfer_all(pwrite, "cannot write", memory.fd, static_cast<char*>(memory.data), mapped_bytes(nbytes)));
  ZERO_RETURN_IF_ERROR(leave_no_cached_pages(memory, nbytes));
  return file_drop(memory, nbytes);
}

absl::Status file_drop(const FileMemory& memory, size_t nbytes) {
  // Protected first: if either step fails, the memory is as it was, readable and whole.
  const size_t mapped = mapped_bytes(nbytes);
  if (mprotect(memory.data, mapped, PROT_NONE) != 0) return errno_error("cannot protect", "offloaded memory");
  if (madvise(memory.data, mapped, MADV_DONTNEED) != 0) {
    const absl::Status status = errno_error("cannot drop", "offloaded memory");
    mprotect(memory.data, mapped, PROT_READ | PROT_WRITE);
    return status;
  }
  return absl::OkStatus();
}

absl::Status file_read_in(const FileMemory& memory, size_t nbytes) {
  const size_t mapped = mapped_bytes(nbytes);
  if (mprotect(memory.data, mapped, PROT_READ | PROT_WRITE) != 0) {
    return errno_error("cannot unprotect", "offloaded memory");
  }
  absl::Status status = transfer_all(pread, "cannot read", memory.fd, static_cast<char*>(memory.data), mapped);
  if (status.ok()) status = leave_no_cached_pages(memory, nbytes);
  if (!status.ok()) mprotect(memory.data, mapped, PROT_NONE);  // still out: a use is a crash, not a read of junk
  return status;
}

size_t file_resident_bytes(const FileMemory& memory, size_t nbytes) {
  const size_t page = page_size();
  std::vector<unsigned char> in_ram(mapped_bytes(nbytes) / page);
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
