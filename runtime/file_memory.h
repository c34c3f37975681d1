// Host memory backed by a file (ZeRO-Infinity's NVMe offload): mapped while in use, written back and dropped on demand.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace zero {

// `nbytes` of zeroed memory mapped from a new file in `dir`, its blocks reserved on the drive (so a full
// drive fails here, not at a later write-back). The file is unlinked at once, so nothing is left
// behind, whatever happens to the process; `fd` keeps it open until file_free.
struct FileMemory {
  void* data = nullptr;
  int fd = -1;
};
absl::StatusOr<FileMemory> file_alloc(const std::string& dir, size_t nbytes);
void file_free(const FileMemory& memory, size_t nbytes);

// Writes the memory's pages to its file and drops them from RAM (and the page cache); the next access
// reads them back. What keeps an offloaded optimizer's resident memory to the unit being updated.
absl::Status file_page_out(const FileMemory& memory, size_t nbytes);

// How many of the memory's bytes are in RAM now (whole pages, by mincore): 0 right after file_page_out.
size_t file_resident_bytes(const FileMemory& memory, size_t nbytes);

// True when `dir` is on a file system that keeps files in RAM (tmpfs, ramfs): paging out there frees no
// memory, so offloading to it saves none.
bool files_stay_in_ram(const std::string& dir);

// OK if files can be created in `dir`; otherwise an error naming it.
absl::Status check_file_dir(const std::string& dir);

}  // namespace zero
