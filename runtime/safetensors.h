// Reading and writing the safetensors format: fixtures, checkpoints and pretrained (GPT-2) weights.
#pragma once

// Layout: an 8-byte little-endian header length H, H bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data section that follows the
// header) plus an optional "__metadata__" object of strings, then the raw little-endian data.
// Supported dtypes: F32, BF16, F16, I32, U16, U8.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/tensor.h"

namespace zero {

// What the header says about one tensor.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t begin = 0;  // byte offsets into the data section
  int64_t end = 0;
};

// The name a dtype has in safetensors headers ("F32", "BF16", ...).
absl::string_view safetensors_dtype_name(DType dtype);

// A safetensors file; tensors are views into its data (aligned to at least 8 bytes).
class SafetensorsFile {
 public:
  // Maps the file copy-on-write, so only the tensors that are read come from the drive (a rank loading
  // its pieces of another layout's checkpoint touches those alone), and nothing is read twice.
  static absl::StatusOr<SafetensorsFile> read(const std::string& path);
  // Parses an in-memory file (copied, 64-byte aligned); `source` names it in error messages.
  static absl::StatusOr<SafetensorsFile> parse(absl::string_view bytes, absl::string_view source = "<memory>");

  // Entries in data order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(absl::string_view name) const;
  // A read-only-by-convention CPU view of tensor `name`; NotFound names the tensors that exist.
  absl::StatusOr<Tensor> get(absl::string_view name) const;
  // As get, and fails with InvalidArgument unless dtype and shape are the expected ones.
  absl::StatusOr<Tensor> get(absl::string_view name, DType dtype, const Shape& shape) const;

 private:
  SafetensorsFile() = default;
  // Reads the header of a whole file's `bytes` into entries_ and metadata_; returns where the data starts.
  absl::StatusOr<uint64_t> parse_header(absl::string_view bytes, absl::string_view source);
  absl::StatusOr<const SafetensorsEntry*> find(absl::string_view name) const;

  std::string source_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<uint8_t> data_;  // the data section (mapped or copied); shared so copies stay cheap
};

// The file's bytes for `tensors` (CPU, contiguous), stored in the given order. Names must be unique.
absl::StatusOr<std::string> serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                  const std::map<std::string, std::string>& metadata = {});
// The same, written to `path` atomically (runtime/atomic_file.h): a failed write leaves the old file.
absl::Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace zero
