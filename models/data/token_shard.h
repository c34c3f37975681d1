// llm.c token shards (.bin): reading them memory-mapped, writing them, and serving their sequences to a DataLoader.
#pragma once

// File layout, as llm.c's dev/data scripts write it and its dataloader.h reads it (little-endian):
//   int32 header[256]: header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = token count n,
//                      the rest zero;
//   uint16 tokens[n].
// So a valid file is exactly 1024 + 2n bytes. Vocabularies up to 65536 tokens fit (GPT-2: 50257).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/data/dataset.h"

namespace zero::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes `tokens` as one shard at `path` (replacing it). At most 2^31 - 1 tokens: the count is an int32.
absl::Status write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

// One shard file, validated and memory-mapped read-only. Move-only; unmaps on destruction.
class TokenShard {
 public:
  // Fails (InvalidArgument, naming the file, the expected and the found value) on a file shorter than
  // the header, a wrong magic or version, or a token count that disagrees with the file size.
  static absl::StatusOr<TokenShard> open(const std::string& path);

  TokenShard(TokenShard&& other) noexcept { *this = std::move(other); }
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  const std::string& path() const { return path_; }
  // The tokens, (n), pointing into the mapping.
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(num_tokens_)}; }

 private:
  TokenShard() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t num_tokens_ = 0;
};

// The shards a glob pattern names, sorted by path (a plain path matches itself). NotFound when none match.
absl::StatusOr<std::vector<std::string>> glob_shards(const std::string& pattern);

// The sequences of one or more shards, as llm.c cuts them: in a shard of n tokens, sequence j is tokens
// [j*T, j*T + T + 1), j < (n - 1) / T, so neighbours share one token and the last (n - 1) % T tokens are
// unused; sequences never cross shard boundaries. Shards follow each other in sorted path order.
// Targets are the next tokens everywhere (a shard carries no loss mask).
class TokenShardDataset final : public SequenceDataset {
 public:
  // Opens every shard `pattern` matches. Fails when a shard is invalid, holds a token id of `vocab_size`
  // or more (named with its shard and position: found now, not when its batch is drawn), or all of them
  // together hold no sequence of T + 1 tokens.
  static absl::StatusOr<TokenShardDataset> open(const std::string& pattern, int64_t seq_len, int64_t vocab_size);

  int64_t size() const override { return sequence_starts_.back(); }
  int64_t seq_len() const override { return seq_len_; }
  void read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const override;
  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  TokenShardDataset() = default;
  std::vector<TokenShard> shards_;
  // sequence_starts_[s] = sequences in shards [0, s); size shards_.size() + 1.
  std::vector<int64_t> sequence_starts_;
  int64_t seq_len_ = 0;
};

}  // namespace zero::data
