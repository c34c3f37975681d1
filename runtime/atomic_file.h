// Files that are replaced whole: readers, and a crash, see the old contents or the new, never a part.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace zero {

// Writes `parts`, one after the other, to a temporary file beside `path`, flushes it to the drive (fsync),
// renames it over `path` and flushes the directory. On any failure `path` is as it was, the temporary file
// is removed, and the error names `path` and the OS reason ("No space left on device"). The parts are
// written from where they are: a file of many tensors needs no copy of itself in memory.
absl::Status write_file_atomically(const std::string& path, const std::vector<absl::string_view>& parts);

// Flushes a directory's entries (a rename or a new file in it) to the drive.
absl::Status sync_directory(const std::string& dir);

}  // namespace zero
