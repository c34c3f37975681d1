// llm.c token shards: validation, memory mapping, writing, and the sequence windows over them.
#include "models/data/token_shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian; so must the host be");

namespace {

absl::Status bad_shard(const std::string& path, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat(path, " is not a valid llm.c token shard: ", detail,
                                                 "; rewrite it with write_token_shard or llm.c's dev/data scripts"));
}

// Checks the header (256 int32) against a file of `file_bytes` bytes and returns the token count.
absl::StatusOr<int64_t> validate_header(const std::string& path, const int32_t* header, int64_t file_bytes) {
  if (header[0] != kShardMagic) {
    return bad_shard(path, absl::StrCat("magic (header[0]) expected ", kShardMagic, ", found ", header[0]));
  }
  if (header[1] != kShardVersion) {
    return bad_shard(path, absl::StrCat("version (header[1]) expected ", kShardVersion, ", found ", header[1]));
  }
  const int64_t num_tokens = header[2];
  const int64_t expected_bytes = kShardHeaderBytes + 2 * num_tokens;
  if (num_tokens < 0 || file_bytes != expected_bytes) {
    return bad_shard(path, absl::StrCat("header[2] says ", num_tokens, " tokens, so the file size expected is ",
                                        expected_bytes, " bytes, found ", file_bytes, " bytes"));
  }
  return num_tokens;
}

}  // namespace

absl::Status write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("write_token_shard(", path, "): ", tokens.size(),
                                                   " tokens do not fit the int32 count; split them into shards"));
  }
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("write_token_shard: cannot create ", path, ": ", std::strerror(errno)));
  }
  out.write(reinterpret_cast<const char*>(header.data()), kShardHeaderBytes);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size_bytes()));
  if (!out.flush()) return absl::DataLossError(absl::StrCat("write_token_shard: error writing ", path));
  return absl::OkStatus();
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  std::swap(path_, other.path_);
  std::swap(map_, other.map_);
  std::swap(map_bytes_, other.map_bytes_);
  std::swap(tokens_, other.tokens_);
  std::swap(num_tokens_, other.num_tokens_);
  return *this;
}

TokenShard::~TokenShard() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

absl::StatusOr<TokenShard> TokenShard::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open token shard ", path, ": ", std::strerror(errno)));
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  const int64_t file_bytes = st.st_size;
  void* map = nullptr;
  if (stat_ok && file_bytes >= kShardHeaderBytes) map = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (!stat_ok || map == MAP_FAILED) {
    return absl::DataLossError(absl::StrCat("cannot read token shard ", path, ": ", std::strerror(map_errno)));
  }
  if (file_bytes < kShardHeaderBytes) {
    return bad_shard(path, absl::StrCat("truncated header: expected at least ", kShardHeaderBytes, " bytes, found ",
                                        file_bytes, " bytes"));
  }

  TokenShard shard;
  shard.path_ = path;
  shard.map_ = map;  // owned from here on, so every error below unmaps it
  shard.map_bytes_ = static_cast<size_t>(file_bytes);
  ZERO_ASSIGN_OR_RETURN(shard.num_tokens_, validate_header(path, static_cast<const int32_t*>(map), file_bytes));
  shard.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kShardHeaderBytes);
  return shard;
}

absl::StatusOr<std::vector<std::string>> glob_shards(const std::string& pattern) {
  glob_t matches{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + (rc == 0 ? matches.gl_pathc : 0));
  globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return absl::NotFoundError(absl::StrCat("no token shard matches '", pattern, "'; check the path or glob"));
  }
  if (rc != 0) return absl::InternalError(absl::StrCat("glob('", pattern, "') failed with code ", rc));
  std::sort(paths.begin(), paths.end());
  return paths;
}

absl::StatusOr<TokenShardDataset> TokenShardDataset::open(const std::string& pattern, int64_t seq_len,
                                                          int64_t vocab_size) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("TokenShardDataset: sequence length ", seq_len, " must be >= 1"));
  }
  ZERO_ASSIGN_OR_RETURN(std::vector<std::string> paths, glob_shards(pattern));
  TokenShardDataset dataset;
  dataset.seq_len_ = seq_len;
  dataset.sequence_starts_.push_back(0);
  for (const std::string& path : paths) {
    ZERO_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(path));
    const std::span<const uint16_t> tokens = shard.tokens();
    if (const auto bad = std::find_if(tokens.begin(), tokens.end(), [&](uint16_t t) { return t >= vocab_size; });
        bad != tokens.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", *bad, " at position ", bad - tokens.begin(),
                                                     " is outside the vocabulary of ", vocab_size, " tokens"));
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    dataset.sequence_starts_.push_back(dataset.sequence_starts_.back() + (n > 0 ? (n - 1) / seq_len : 0));
    dataset.shards_.push_back(std::move(shard));
  }
  if (dataset.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the shards matching '", pattern, "' hold no sequence of T + 1 = ",
                                                   seq_len + 1, " tokens; use more data or a smaller T"));
  }
  return dataset;
}

void TokenShardDataset::read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  ZERO_CHECK(i >= 0 && i < size(), "sequence ", i, " out of [0, ", size(), ")");
  ZERO_CHECK(static_cast<int64_t>(inputs.size()) == seq_len_ && static_cast<int64_t>(targets.size()) == seq_len_,
             "inputs and targets must hold T = ", seq_len_, " tokens");
  const auto it = std::upper_bound(sequence_starts_.begin(), sequence_starts_.end(), i) - 1;
  const std::span<const uint16_t> tokens = shards_[it - sequence_starts_.begin()].tokens();
  const uint16_t* window = tokens.data() + (i - *it) * seq_len_;  // T + 1 tokens
  std::copy(window, window + seq_len_, inputs.begin());
  std::copy(window + 1, window + seq_len_ + 1, targets.begin());
}

}  // namespace zero::data
