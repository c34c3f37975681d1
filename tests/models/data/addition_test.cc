#include "models/data/addition.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/data/token_shard.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "tests/temp_dir.h"

namespace zero::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

AdditionDataset make(AdditionConfig config) {
  absl::StatusOr<AdditionDataset> dataset = AdditionDataset::create(config);
  ZERO_CHECK(dataset.ok(), dataset.status().ToString());
  return *dataset;
}

struct Row {
  std::vector<int32_t> inputs, targets;
};

Row read_row(const AdditionDataset& dataset, int64_t i) {
  Row row{std::vector<int32_t>(dataset.seq_len()), std::vector<int32_t>(dataset.seq_len())};
  dataset.read(i, row.inputs, row.targets);
  return row;
}

std::string reversed(std::string s) { return {s.rbegin(), s.rend()}; }

TEST(AdditionTokenizer, EncodesAndDecodesTheAlphabet) {
  absl::StatusOr<std::vector<int32_t>> tokens = addition_encode("123+456=9750\n");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_THAT(*tokens, ElementsAre(1, 2, 3, 10, 4, 5, 6, 11, 9, 7, 5, 0, 12));
  EXPECT_EQ(addition_decode(*tokens), "123+456=9750\n");
}

TEST(AdditionTokenizer, EncodeNamesAnUnknownCharacterAndItsPosition) {
  absl::StatusOr<std::vector<int32_t>> tokens = addition_encode("12a");
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokens.status().message(), HasSubstr("character 97 at position 2"));
}

TEST(AdditionTokenizer, DecodeWritesQuestionMarksOutsideTheVocabulary) {
  EXPECT_EQ(addition_decode(std::vector<int32_t>{kIgnoreTarget, 13, 5}), "??5");
}

TEST(AdditionDataset, DefaultLayoutIsThirteenTokensPerExampleFourPerRow) {
  const AdditionDataset dataset = make({});
  EXPECT_EQ(dataset.example_length(), 13);
  EXPECT_EQ(dataset.seq_len(), 52);
  EXPECT_EQ(dataset.size(), 65536);
}

TEST(AdditionDataset, RowsAreAFunctionOfTheSeed) {
  const AdditionDataset a = make({.seed = 5}), b = make({.seed = 5}), c = make({.seed = 6});
  for (int64_t i : {0, 1, 977, 65535}) {
    EXPECT_EQ(read_row(a, i).inputs, read_row(b, i).inputs) << "row " << i;
    EXPECT_NE(read_row(a, i).inputs, read_row(c, i).inputs) << "row " << i;
  }
}

TEST(AdditionDataset, EveryExampleIsACorrectlyWrittenSum) {
  for (int digits : {1, 3, 5}) {
    const AdditionDataset dataset = make({.digits = digits, .examples_per_row = 3, .rows = 300});
    for (int64_t i = 0; i < dataset.size(); ++i) {
      const std::string text = addition_decode(read_row(dataset, i).inputs);
      ASSERT_EQ(text.back(), '\n') << text;
      const std::vector<std::string> examples = absl::StrSplit(text.substr(0, text.size() - 1), '\n');
      ASSERT_EQ(examples.size(), 3u) << text;
      for (const std::string& example : examples) {
        const std::vector<std::string> parts = absl::StrSplit(example, absl::ByAnyChar("+="));
        ASSERT_EQ(parts.size(), 3u) << example;
        ASSERT_EQ(parts[0].size(), static_cast<size_t>(digits)) << example;
        ASSERT_EQ(parts[1].size(), static_cast<size_t>(digits)) << example;
        ASSERT_EQ(parts[2].size(), static_cast<size_t>(digits + 1)) << example;
        int64_t a = 0, b = 0, sum = 0;
        ASSERT_TRUE(absl::SimpleAtoi(parts[0], &a) && absl::SimpleAtoi(parts[1], &b) &&
                    absl::SimpleAtoi(reversed(parts[2]), &sum))
            << example;
        EXPECT_EQ(a + b, sum) << example;
      }
    }
  }
}

TEST(AdditionDataset, ProblemIsWhatTheRowSays) {
  const AdditionDataset dataset = make({.digits = 2, .examples_per_row = 2});
  const int64_t length = dataset.example_length();  // 10
  const auto [a, b] = dataset.problem(7);           // row 3, second example: tokens [L, 2L)
  const Row row = read_row(dataset, 3);
  const std::vector<int32_t> second(row.inputs.begin() + length, row.inputs.begin() + 2 * length);
  char expected[16];
  std::snprintf(expected, sizeof(expected), "%02lld+%02lld=", static_cast<long long>(a), static_cast<long long>(b));
  EXPECT_EQ(addition_decode(second).substr(0, 6), expected) << addition_decode(row.inputs);
  EXPECT_EQ(dataset.example_tokens(7), second);
}

TEST(AdditionDataset, TargetsAreTheNextTokenOnAnswerDigitsAndIgnoredElsewhere) {
  const AdditionDataset dataset = make({.digits = 2, .examples_per_row = 1});
  // L = 10: a a + b b = s s s \n; counted: positions 5 ('='), 6, 7, predicting the three answer digits.
  for (int64_t i = 0; i < 50; ++i) {
    const Row row = read_row(dataset, i);
    const std::vector<int32_t>& x = row.inputs;
    EXPECT_THAT(row.targets, ElementsAre(-1, -1, -1, -1, -1, x[6], x[7], x[8], -1, -1)) << "row " << i;
  }
}

TEST(AdditionDataset, EveryRowCountsDigitsPlusOneTargetsPerExample) {
  const AdditionDataset dataset = make({.digits = 3, .examples_per_row = 4});
  const Row row = read_row(dataset, 12);
  int counted = 0;
  for (size_t t = 0; t < row.targets.size(); ++t) {
    if (row.targets[t] == kIgnoreTarget) continue;
    ++counted;
    EXPECT_EQ(row.targets[t], row.inputs.at(t + 1)) << "position " << t;
  }
  EXPECT_EQ(counted, 4 * 4);
}

TEST(AdditionDataset, TrainAndValPartitionEveryProblem) {
  // D = 2: 10^4 problems, about 9000 train and 1000 val. With m uniform draws over k problems, the chance
  // that some problem is never drawn is at most k (1 - 1/k)^m < k e^(-m/k); m = 250000 makes that
  // 9000 e^(-27.7) < 1e-8 for train (and far less for val), so the union of what both draw is every
  // problem, and any problem drawn by both would break the split.
  std::set<std::pair<int64_t, int64_t>> train, val;
  const AdditionDataset train_set = make({.digits = 2, .seed = 1, .split = AdditionSplit::kTrain});
  const AdditionDataset val_set = make({.digits = 2, .seed = 2, .split = AdditionSplit::kVal});
  for (int64_t n = 0; n < 250000; ++n) {
    train.insert(train_set.problem(n));
    val.insert(val_set.problem(n));
  }
  for (const auto& p : val) EXPECT_FALSE(train.contains(p)) << p.first << "+" << p.second;
  EXPECT_EQ(train.size() + val.size(), 10000u);
  EXPECT_NEAR(static_cast<double>(val.size()), 1000.0, 100.0);  // Binomial(10^4, 0.1): sd 30, so 3.3 sd
}

TEST(AdditionDataset, ShardHoldsTheSameSequencesUnmasked) {
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("addition.bin");
  const AdditionConfig config{.digits = 2, .examples_per_row = 3, .rows = 20, .seed = 9};
  ASSERT_TRUE(write_addition_shard(config, path).ok());
  const AdditionDataset dataset = make(config);
  absl::StatusOr<TokenShardDataset> shard = TokenShardDataset::open(path, dataset.seq_len(), kAdditionVocabSize);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_EQ(shard->size(), 20);
  for (int64_t i = 0; i < 20; ++i) {
    std::vector<int32_t> inputs(dataset.seq_len()), targets(dataset.seq_len());
    shard->read(i, inputs, targets);
    EXPECT_EQ(inputs, read_row(dataset, i).inputs) << "row " << i;
    EXPECT_EQ(targets.back(), dataset.example_tokens((i + 1) * 3)[0]) << "row " << i;
  }
}

// Logits (B, T, V) putting the largest value on each position's target (token 0 where ignored).
std::vector<float> perfect_logits(const std::vector<int32_t>& targets, int64_t vocab) {
  std::vector<float> logits(targets.size() * vocab, 0.0f);
  for (size_t p = 0; p < targets.size(); ++p) logits[p * vocab + std::max(targets[p], 0)] = 1.0f;
  return logits;
}

TEST(AdditionDataset, ScoreCountsAnswerDigitsAndWholeAnswers) {
  const AdditionDataset dataset = make({.digits = 3, .examples_per_row = 2});
  const int64_t t = dataset.seq_len(), vocab = 16;  // a padded vocabulary
  std::vector<int32_t> targets;
  for (int64_t i = 0; i < 2; ++i) {  // B = 2
    const Row row = read_row(dataset, i);
    targets.insert(targets.end(), row.targets.begin(), row.targets.end());
  }
  std::vector<float> logits = perfect_logits(targets, vocab);
  const Tensor targets_view(targets.data(), DType::kI32, {2, t});
  const Tensor logits_view(logits.data(), DType::kF32, {2, t, vocab});

  AdditionScore score = dataset.score(logits_view, targets_view);
  EXPECT_EQ(score.digits_correct, 16);
  EXPECT_EQ(score.digits, 16);
  EXPECT_EQ(score.answers_correct, 4);
  EXPECT_EQ(score.answers, 4);

  // The padding columns are not tokens: however large their logits, they are never the prediction.
  for (size_t p = 0; p < targets.size(); ++p) logits[p * vocab + 15] = 5.0f;
  score = dataset.score(logits_view, targets_view);
  EXPECT_EQ(score.digits_correct, 16);

  // Two wrong digits in the second example of row 1 (positions 7 and 8 of example 3): one wrong answer.
  for (int64_t p : {3 * 13 + 7, 3 * 13 + 8}) logits[p * vocab + (targets[p] + 1) % 10] = 2.0f;
  score = dataset.score(logits_view, targets_view);
  EXPECT_EQ(score.digits_correct, 14);
  EXPECT_EQ(score.answers_correct, 3);

  // A bf16 or fp16 model's logits score alike (0, 1, 2 and 5 are exact in both).
  for (const DType half : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> rounded(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) store_from_float(rounded.data(), half, i, logits[i]);
    const AdditionScore s = dataset.score(Tensor(rounded.data(), half, {2, t, vocab}), targets_view);
    EXPECT_EQ(s.digits_correct, 14) << dtype_name(half);
    EXPECT_EQ(s.answers_correct, 3) << dtype_name(half);
  }
}

TEST(AdditionDataset, InvalidConfigIsAnError) {
  EXPECT_EQ(AdditionDataset::create({.digits = 10}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdditionDataset::create({.examples_per_row = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdditionDataset::create({.rows = 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::data
