// Fuzzes the llm.c token-shard reader: any bytes as a shard file (in memory, through memfd), opened as a data
// set of 8-token sequences over GPT-2's vocabulary, then every token read.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "models/data/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("shard", 0);
  if (fd < 0 || write(fd, data, size) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  absl::StatusOr<zero::data::TokenShard> shard = zero::data::TokenShard::open(path);
  volatile uint16_t sink = 0;
  if (shard.ok()) {
    for (uint16_t token : shard->tokens()) sink = sink ^ token;
  }
  (void)zero::data::TokenShardDataset::open(path, /*seq_len=*/8, /*vocab_size=*/50257);
  close(fd);
  return 0;
}
