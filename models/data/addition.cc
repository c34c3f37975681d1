// The addition task: seeded problems, their token layout and loss mask, scoring, tokenizer and shard export.
#include "models/data/addition.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "models/data/random.h"
#include "models/data/token_shard.h"
#include "runtime/status.h"

namespace zero::data {
namespace {

constexpr absl::string_view kAlphabet = "0123456789+=\n";
static_assert(kAlphabet.size() == kAdditionVocabSize);

int64_t power_of_ten(int digits) {
  int64_t p = 1;
  for (int i = 0; i < digits; ++i) p *= 10;
  return p;
}

AdditionSplit split_of(int64_t a, int64_t b, int digits) {
  const uint64_t problem = static_cast<uint64_t>(a * power_of_ten(digits) + b);  // < 10^18 < 2^60
  return splitmix64(problem ^ (static_cast<uint64_t>(digits) << 60)) % 10 == 0 ? AdditionSplit::kVal
                                                                               : AdditionSplit::kTrain;
}

// Writes `value`'s lowest `count` decimal digits to out, most significant first (or least, reversed).
void write_digits(int64_t value, int count, bool reversed, int32_t* out) {
  for (int i = 0; i < count; ++i, value /= 10) out[reversed ? i : count - 1 - i] = static_cast<int32_t>(value % 10);
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> addition_encode(absl::string_view text) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t token = kAlphabet.find(text[i]);
    if (token == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("addition_encode: character ", static_cast<int>(text[i]),
                                                     " at position ", i, " is not one of \"0123456789+=\\n\""));
    }
    tokens.push_back(static_cast<int32_t>(token));
  }
  return tokens;
}

std::string addition_decode(std::span<const int32_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) text.push_back(t >= 0 && t < kAdditionVocabSize ? kAlphabet[t] : '?');
  return text;
}

absl::StatusOr<AdditionDataset> AdditionDataset::create(const AdditionConfig& config) {
  if (config.digits < 1 || config.digits > 9 || config.examples_per_row < 1 || config.rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AdditionDataset: digits ", config.digits, ", examples per row ",
                                                   config.examples_per_row, ", rows ", config.rows,
                                                   "; need 1 <= digits <= 9, examples per row >= 1, rows >= 1"));
  }
  return AdditionDataset(config);
}

std::pair<int64_t, int64_t> AdditionDataset::problem(int64_t n) const {
  const uint64_t range = static_cast<uint64_t>(power_of_ten(config_.digits));
  CounterRng rng(splitmix64(config_.seed) ^ static_cast<uint64_t>(n));
  while (true) {  // rejection: about 1.1 draws per train problem, 10 per val problem
    const auto a = static_cast<int64_t>(rng.below(range));
    const auto b = static_cast<int64_t>(rng.below(range));
    if (split_of(a, b, config_.digits) == config_.split) return {a, b};
  }
}

std::vector<int32_t> AdditionDataset::example_tokens(int64_t n) const {
  const auto [a, b] = problem(n);
  const int d = config_.digits;
  std::vector<int32_t> tokens(static_cast<size_t>(example_length()));
  write_digits(a, d, /*reversed=*/false, &tokens[0]);
  tokens[d] = kPlusToken;
  write_digits(b, d, /*reversed=*/false, &tokens[d + 1]);
  tokens[2 * d + 1] = kEqualsToken;
  write_digits(a + b, d + 1, /*reversed=*/true, &tokens[2 * d + 2]);
  tokens[3 * d + 3] = kEndToken;
  return tokens;
}

void AdditionDataset::read(int64_t i, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  ZERO_CHECK(i >= 0 && i < size(), "row ", i, " out of [0, ", size(), ")");
  ZERO_CHECK(static_cast<int64_t>(inputs.size()) == seq_len() && static_cast<int64_t>(targets.size()) == seq_len(),
             "inputs and targets must hold T = ", seq_len(), " tokens");
  const int64_t length = example_length();
  const int64_t first_counted = 2 * config_.digits + 1;  // '=': its target is the first answer digit
  for (int64_t k = 0; k < config_.examples_per_row; ++k) {
    const std::vector<int32_t> example = example_tokens(i * config_.examples_per_row + k);
    std::copy(example.begin(), example.end(), inputs.begin() + k * length);
    int32_t* row_targets = targets.data() + k * length;
    std::fill(row_targets, row_targets + length, kIgnoreTarget);
    std::copy(example.begin() + first_counted + 1, example.begin() + first_counted + 1 + config_.digits + 1,
              row_targets + first_counted);
  }
}

AdditionScore AdditionDataset::score(const Tensor& logits, const Tensor& targets) const {
  ZERO_CHECK(is_floating(logits.dtype()) && logits.dim() == 3 && logits.size(1) == seq_len() &&
                 logits.size(2) >= kAdditionVocabSize && logits.is_contiguous() && logits.device().is_cpu(),
             "logits must be contiguous fp32, bf16 or fp16 (B, T = ", seq_len(), ", V >= 13) on the host, got ",
             logits.to_string());
  ZERO_CHECK(targets.dtype() == DType::kI32 && targets.dim() == 2 && targets.size(0) == logits.size(0) &&
                 targets.size(1) == seq_len() && targets.is_contiguous() && targets.device().is_cpu(),
             "targets must be contiguous int32 (B, T) on the host matching the logits, got ", targets.to_string());
  const int64_t vocab = logits.size(2);
  const int64_t examples = logits.size(0) * config_.examples_per_row;
  const int64_t first_counted = 2 * config_.digits + 1;
  AdditionScore score;
  for (int64_t e = 0; e < examples; ++e) {
    bool answer_right = true;
    for (int64_t p = e * example_length() + first_counted; p <= e * example_length() + 3 * config_.digits + 1; ++p) {
      // Only real tokens compete: a padded vocabulary's extra columns are never a prediction.
      std::array<float, kAdditionVocabSize> row;
      for (int64_t v = 0; v < kAdditionVocabSize; ++v)
        row[v] = load_as_float(logits.data(), logits.dtype(), p * vocab + v);
      const auto predicted = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      const bool right = predicted == targets.data_as<int32_t>()[p];
      score.digits_correct += right;
      answer_right = answer_right && right;
    }
    score.digits += config_.digits + 1;
    score.answers_correct += answer_right;
    ++score.answers;
  }
  return score;
}

absl::Status write_addition_shard(const AdditionConfig& config, const std::string& path) {
  ZERO_ASSIGN_OR_RETURN(AdditionDataset dataset, AdditionDataset::create(config));
  const int64_t examples = config.rows * config.examples_per_row + 1;
  std::vector<uint16_t> tokens;
  tokens.reserve(static_cast<size_t>(examples * dataset.example_length()));
  for (int64_t n = 0; n < examples; ++n) {
    for (int32_t t : dataset.example_tokens(n)) tokens.push_back(static_cast<uint16_t>(t));
  }
  return write_token_shard(path, tokens);
}

}  // namespace zero::data
