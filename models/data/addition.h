// The embedded default task: multi-digit addition generated from a seed, which a small GPT-2 learns in minutes on a
// CPU.
#pragma once

// One example, digits D = 3:      "123+456=9750\n"
// Operands are zero-padded to D digits; the sum is written with D + 1 digits, least significant first
// (579 -> "9750"), the order in which a left-to-right model can compute it digit by digit with its carry.
// Vocabulary (kAdditionVocabSize = 13): tokens 0-9 are the digits 0-9, 10 is '+', 11 is '=', 12 is '\n'
// (end of example). An example is L = 3D + 4 tokens; a sequence (row) holds K examples back to back, so
// T = K * L (defaults D = 3, K = 4: L = 13, T = 52), and its T+1-th token is the next example's first.
//
// Loss mask: only the answer counts. targets[t] = inputs[t + 1] where inputs[t + 1] is an answer digit
// (positions 2D+1 ... 3D+1 of each example: the '=' and every answer digit but the last), kIgnoreTarget
// (-1) elsewhere, so D + 1 predictions per example. Operand digits are random and '+', '=', '\n' sit at
// fixed places, so counting them would only add noise to the gradient; with the mask the loss is the
// answer's cross-entropy and the model head's correct/predictions is the answer-digit accuracy.
//
// Examples are generated from (seed, example index) alone, so any row can be read in any order and
// every rank sees the same corpus. Each problem (a, b) belongs to the train split (90%) or the val
// split (10%) by a fixed hash of (a, b, D) that ignores the seed, so no val problem is ever trained on.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/data/dataset.h"
#include "runtime/tensor.h"

namespace zero::data {

inline constexpr int64_t kAdditionVocabSize = 13;
inline constexpr int32_t kPlusToken = 10;
inline constexpr int32_t kEqualsToken = 11;
inline constexpr int32_t kEndToken = 12;

// Text <-> tokens: the characters "0123456789+=\n". Encoding any other character fails, naming it and its
// position; decoding writes '?' for a token outside the vocabulary (kIgnoreTarget included).
absl::StatusOr<std::vector<int32_t>> addition_encode(absl::string_view text);
std::string addition_decode(std::span<const int32_t> tokens);

enum class AdditionSplit : uint8_t { kTrain, kVal };

struct AdditionConfig {
  int digits = 3;            // D, 1 to 9
  int examples_per_row = 4;  // K
  int64_t rows = 1 << 16;    // sequences in the dataset
  uint64_t seed = 1;
  AdditionSplit split = AdditionSplit::kTrain;
};

// How the model did on a batch: answer digits (D + 1 per example) and whole answers right.
struct AdditionScore {
  int64_t digits_correct = 0;
  int64_t digits = 0;
  int64_t answers_correct = 0;
  int64_t answers = 0;
};

class AdditionDataset final : public SequenceDataset {
 public:
  // Fails unless 1 <= D <= 9, K >= 1 and rows >= 1.
  static absl::StatusOr<AdditionDataset> create(const AdditionConfig& config);

  const AdditionConfig& config() const { return config_; }
  // L = 3D + 4 tokens per example.
  int64_t example_length() const { return 3 * config_.digits + 4; }
  int64_t size() const override { return config_.rows; }
  int64_t seq_len() const override { return config_.examples_per_row * example_length(); }
  void read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const override;

  // The operands of example n (row n / K, slot n % K), both in [0, 10^D).
  std::pair<int64_t, int64_t> problem(int64_t n) const;
  // The tokens of example n, (L).
  std::vector<int32_t> example_tokens(int64_t n) const;
  // Scores greedy predictions: logits fp32, bf16 or fp16 (B, T, V) with V >= 13 (a padded vocabulary is fine; the
  // argmax runs over the 13 real tokens only), targets int32 (B, T) as read() wrote them. Both are read on
  // the host: logits from a CUDA device must be copied back first.
  AdditionScore score(const Tensor& logits, const Tensor& targets) const;

 private:
  explicit AdditionDataset(const AdditionConfig& config) : config_(config) {}
  AdditionConfig config_;
};

// Writes the dataset as one llm.c token shard: examples 0 ... rows * K (one past the last row, so the
// last sequence has its T+1-th token). TokenShardDataset::open(path, T) then reads the same inputs as
// the dataset, with unmasked targets (a shard carries no mask).
absl::Status write_addition_shard(const AdditionConfig& config, const std::string& path);

}  // namespace zero::data
