// Fuzzes zero-train's config parser: any bytes as the JSON of --config, then the batch rule over 4 ranks.
// Every input must end in a config or an error; a crash, an exception or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "examples/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<zero::train::TrainConfig> config = zero::train::parse_train_config(json, {});
  if (config.ok()) (void)zero::train::resolve_batch(*config, /*world_size=*/4);
  return 0;
}
