// Fuzzes the safetensors reader: any bytes as a file, then every tensor it lists is looked up and read whole,
// so an offset or shape the header lies about shows as an out-of-bounds read.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<zero::SafetensorsFile> file =
      zero::SafetensorsFile::parse(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!file.ok()) return 0;
  volatile uint8_t sink = 0;
  for (const zero::SafetensorsEntry& entry : file->entries()) {
    const absl::StatusOr<zero::Tensor> tensor = file->get(entry.name);
    if (!tensor.ok()) continue;
    const auto* bytes = static_cast<const uint8_t*>(tensor->data());
    for (size_t i = 0; i < tensor->nbytes(); ++i) sink = sink ^ bytes[i];
  }
  return 0;
}
