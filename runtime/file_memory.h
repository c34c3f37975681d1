// Host memory backed by a file (ZeRO-Infinity's NVMe offload): in RAM while in use, written to its file and dropped.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace zero {

// `nbytes` of zeroed memory at a fixed address, and a new file in `dir` of the same size (rounded up to whole
// pages), its blocks reserved on the drive (so a full drive fails here, not at a later write). The file is
// unlinked at once, so nothing is left behind, whatever happens to the process; `fd` keeps it open until
// file_free. Transfers bypass the page cache (O_DIRECT) where the file system allows it (`direct`), so they
// take no RAM beyond the memory itself and no CPU to copy.
struct FileMemory {
  void* data = nullptr;
  int fd = -1;
  bool direct = false;
};
absl::StatusOr<FileMemory> file_alloc(const std::string& dir, size_t nbytes);
void file_free(const FileMemory& memory, size_t nbytes);

// Writes the memory to its file, then drops it from RAM: until file_read_in, touching it faults (SIGSEGV), so
// a use without the read is a crash, never a silent read of zeros. Blocks for the transfer.
absl::Status file_write_out(const FileMemory& memory, size_t nbytes);
// Drops the memory from RAM without writing it: for memory only read since file_read_in, whose file holds it.
absl::Status file_drop(const FileMemory& memory, size_t nbytes);
// Reads the memory back from its file after file_write_out or file_drop. Blocks for the transfer.
absl::Status file_read_in(const FileMemory& memory, size_t nbytes);

// How many of the memory's bytes are in RAM now (whole pages, by mincore): 0 right after file_write_out.
size_t file_resident_bytes(const FileMemory& memory, size_t nbytes);

// True when `dir` is on a file system that keeps files in RAM (tmpfs, ramfs): writing out there frees no
// memory, so offloading to it saves none.
bool files_stay_in_ram(const std::string& dir);

// OK if files can be created in `dir`; otherwise an error naming it.
absl::Status check_file_dir(const std::string& dir);

}  // namespace zero
