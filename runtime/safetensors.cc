#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <new>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/atomic_file.h"
#include "runtime/status.h"

namespace zero {
namespace {

using Json = nlohmann::json;

constexpr std::array<DType, 6> kSupported = {DType::kF32, DType::kBF16, DType::kF16,
                                             DType::kI32, DType::kU16,  DType::kU8};
// Headers beyond this are rejected rather than parsed (the reference implementation uses 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

absl::StatusOr<DType> dtype_from_name(absl::string_view name, absl::string_view tensor) {
  for (DType t : kSupported) {
    if (safetensors_dtype_name(t) == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", tensor, "' has dtype ", name, ", which zero does not read; supported: F32, BF16, F16, I32, U16, U8"));
}

// `bytes` copied to 64-byte aligned memory.
std::shared_ptr<uint8_t> aligned_copy(absl::string_view bytes) {
  auto* p = static_cast<uint8_t*>(::operator new[](std::max<size_t>(bytes.size(), 1), std::align_val_t(64)));
  std::memcpy(p, bytes.data(), bytes.size());
  return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { ::operator delete[](q, std::align_val_t(64)); });
}

// The whole file at `path` mapped copy-on-write: a page is read from the drive when first touched.
absl::StatusOr<std::shared_ptr<uint8_t>> map_file(const std::string& path, size_t& size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open safetensors file ", path));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::DataLossError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  size = static_cast<size_t>(st.st_size);
  void* base = size == 0 ? nullptr : mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) return absl::DataLossError(absl::StrCat("cannot map ", path, ": ", std::strerror(errno)));
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(base), [size](uint8_t* p) {
    if (p != nullptr) munmap(p, size);
  });
}

uint64_t read_le64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

absl::StatusOr<SafetensorsEntry> parse_entry(const std::string& name, const Json& j, uint64_t data_bytes) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", what));
  };
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data_offsets")) {
    return bad("header entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  const Json& dt = j["dtype"];
  const Json& shape = j["shape"];
  const Json& offsets = j["data_offsets"];
  if (!dt.is_string()) return bad("\"dtype\" is not a string");
  if (!shape.is_array()) return bad("\"shape\" is not an array");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return bad("\"data_offsets\" must be two non-negative integers [begin, end]");
  }
  SafetensorsEntry e;
  e.name = name;
  ZERO_ASSIGN_OR_RETURN(e.dtype, dtype_from_name(dt.get<std::string>(), name));
  e.shape.clear();
  uint64_t numel = 1;
  for (const Json& d : shape) {
    if (!d.is_number_unsigned()) return bad("\"shape\" holds something other than non-negative integers");
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && numel > (uint64_t{1} << 62) / dim) return bad("shape has more elements than fit in memory");
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_bytes) {
    return bad(absl::StrCat("data_offsets [", begin, ", ", end, ") lie outside the data section of ", data_bytes,
                            " bytes (truncated or corrupt file?)"));
  }
  if (end - begin != numel * dtype_size(e.dtype)) {
    return bad(absl::StrCat("dtype ", dt.get<std::string>(), " and shape ", shape_string(e.shape), " need ",
                            numel * dtype_size(e.dtype), " bytes but data_offsets span ", end - begin));
  }
  e.begin = static_cast<int64_t>(begin);
  e.end = static_cast<int64_t>(end);
  return e;
}

absl::Status check_no_overlap(const std::vector<SafetensorsEntry>& sorted) {
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].begin < sorted[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat("tensors '", sorted[i - 1].name, "' [", sorted[i - 1].begin, ", ",
                                                     sorted[i - 1].end, ") and '", sorted[i].name, "' [",
                                                     sorted[i].begin, ", ", sorted[i].end, ") overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kU16: return "U16";
    case DType::kU8: return "U8";
  }
  return "?";
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
  size_t size = 0;
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> mapping, map_file(path, size));
  const absl::string_view bytes(reinterpret_cast<const char*>(mapping.get()), size);
  SafetensorsFile file;
  ZERO_ASSIGN_OR_RETURN(const uint64_t data_offset, file.parse_header(bytes, path));
  // Tensors are views into the mapping where the data section is 8-byte aligned (every file zero writes,
  // and the reference implementation's); otherwise into an aligned copy.
  file.data_ = data_offset % 8 == 0 ? std::shared_ptr<uint8_t>(mapping, mapping.get() + data_offset)
                                    : aligned_copy(bytes.substr(data_offset));
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::parse(absl::string_view bytes, absl::string_view source) {
  SafetensorsFile file;
  ZERO_ASSIGN_OR_RETURN(const uint64_t data_offset, file.parse_header(bytes, source));
  file.data_ = aligned_copy(bytes.substr(data_offset));
  return file;
}

absl::StatusOr<uint64_t> SafetensorsFile::parse_header(absl::string_view bytes, absl::string_view source) {
  auto bad = [&](absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat(source, ": ", what)); };
  if (bytes.size() < 8) {
    return bad(absl::StrCat("truncated: ", bytes.size(),
                            " bytes, but a safetensors file starts with an 8-byte header length"));
  }
  const uint64_t header_len = read_le64(bytes.data());
  if (header_len > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_len, " runs past the end of the file (", bytes.size(),
                            " bytes); the file is truncated or not safetensors"));
  }
  if (header_len > kMaxHeaderBytes) return bad(absl::StrCat("header of ", header_len, " bytes is implausibly large"));
  Json header = Json::parse(bytes.substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("header is not a JSON object");

  source_ = std::string(source);
  const uint64_t data_bytes = bytes.size() - 8 - header_len;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return bad("\"__metadata__\" is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) return bad(absl::StrCat("metadata value for '", mk, "' is not a string"));
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> e = parse_entry(key, value, data_bytes);
    if (!e.ok()) return bad(e.status().message());
    entries_.push_back(*std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  if (absl::Status s = check_no_overlap(entries_); !s.ok()) return bad(s.message());
  return 8 + header_len;
}

bool SafetensorsFile::contains(absl::string_view name) const { return find(name).ok(); }

absl::StatusOr<const SafetensorsEntry*> SafetensorsFile::find(absl::string_view name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : entries_) names.push_back(e.name);
  return absl::NotFoundError(
      absl::StrCat(source_, " has no tensor '", name, "'; it has: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<Tensor> SafetensorsFile::get(absl::string_view name) const {
  ZERO_ASSIGN_OR_RETURN(const SafetensorsEntry* e, find(name));
  return Tensor(data_.get() + e->begin, e->dtype, e->shape);
}

absl::StatusOr<Tensor> SafetensorsFile::get(absl::string_view name, DType dtype, const Shape& shape) const {
  ZERO_ASSIGN_OR_RETURN(Tensor t, get(name));
  if (t.dtype() != dtype || t.shape() != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": tensor '", name, "' is ", safetensors_dtype_name(t.dtype()), shape_string(t.shape()),
                     " but ", safetensors_dtype_name(dtype), shape_string(shape), " was expected"));
  }
  return t;
}

namespace {

// The file's first part: the header's length (8 bytes, little-endian) and the JSON header; the data section,
// the tensors' bytes in the given order, follows it.
absl::StatusOr<std::string> safetensors_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                               const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", name, "' is reserved or used twice"));
    }
    if (!t.device().is_cpu() || !t.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ", t.to_string(),
                                                     "; copy it to a contiguous CPU tensor before writing"));
    }
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    const int64_t n = static_cast<int64_t>(t.nbytes());
    header[name] = {{"dtype", std::string(safetensors_dtype_name(t.dtype()))},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned, as the reference does
  return le64(json.size()) + json;
}

std::vector<absl::string_view> data_parts(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<absl::string_view> parts;
  for (const auto& [name, t] : tensors) parts.emplace_back(static_cast<const char*>(t.data()), t.nbytes());
  return parts;
}

}  // namespace

absl::StatusOr<std::string> serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                  const std::map<std::string, std::string>& metadata) {
  ZERO_ASSIGN_OR_RETURN(std::string out, safetensors_header(tensors, metadata));
  for (const absl::string_view part : data_parts(tensors)) out.append(part.data(), part.size());
  return out;
}

absl::Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  ZERO_ASSIGN_OR_RETURN(const std::string header, safetensors_header(tensors, metadata));
  std::vector<absl::string_view> parts = data_parts(tensors);
  parts.insert(parts.begin(), header);
  return write_file_atomically(path, parts);  // each tensor from where it is: no copy of the file in memory
}

}  // namespace zero
