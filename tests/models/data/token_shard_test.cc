#include "models/data/token_shard.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace zero::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Overwrites header[index] of the shard at path.
void patch_header(const std::string& path, int index, int32_t value) {
  std::string bytes = read_bytes(path);
  std::memcpy(bytes.data() + 4 * index, &value, 4);
  write_bytes(path, bytes);
}

TEST(TokenShard, WriteThenOpenRoundTripsHeaderAndTokens) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("a.bin");
  ASSERT_TRUE(write_token_shard(path, std::vector<uint16_t>{7, 65535, 0, 42}).ok());

  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 8u);
  std::vector<int32_t> header(256);
  std::memcpy(header.data(), bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 4);
  EXPECT_EQ(std::count(header.begin() + 3, header.end(), 0), 253);

  absl::StatusOr<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_THAT(shard->tokens(), ElementsAre(7, 65535, 0, 42));
}

TEST(TokenShard, EmptyShardIsValid) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("empty.bin");
  ASSERT_TRUE(write_token_shard(path, {}).ok());
  absl::StatusOr<TokenShard> shard = TokenShard::open(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->tokens().size(), 0u);
}

TEST(TokenShard, TruncatedHeaderNamesFileAndSizes) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("short.bin");
  write_bytes(path, std::string(10, '\0'));
  absl::StatusOr<TokenShard> shard = TokenShard::open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
  EXPECT_THAT(shard.status().message(), HasSubstr("expected at least 1024 bytes, found 10 bytes"));
}

TEST(TokenShard, WrongMagicNamesExpectedAndFound) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("magic.bin");
  ASSERT_TRUE(write_token_shard(path, std::vector<uint16_t>{1, 2}).ok());
  patch_header(path, 0, 20240521);
  absl::StatusOr<TokenShard> shard = TokenShard::open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
  EXPECT_THAT(shard.status().message(), HasSubstr("magic (header[0]) expected 20240520, found 20240521"));
}

TEST(TokenShard, WrongVersionNamesExpectedAndFound) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("version.bin");
  ASSERT_TRUE(write_token_shard(path, std::vector<uint16_t>{1, 2}).ok());
  patch_header(path, 1, 2);
  absl::StatusOr<TokenShard> shard = TokenShard::open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr("version (header[1]) expected 1, found 2"));
}

TEST(TokenShard, CountDisagreeingWithFileSizeNamesBoth) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("count.bin");
  ASSERT_TRUE(write_token_shard(path, std::vector<uint16_t>{1, 2, 3, 4}).ok());
  write_bytes(path, read_bytes(path).substr(0, 1031));  // one byte of the last token lost
  absl::StatusOr<TokenShard> shard = TokenShard::open(path);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr(path));
  EXPECT_THAT(shard.status().message(),
              HasSubstr("header[2] says 4 tokens, so the file size expected is 1032 bytes, found 1031 bytes"));
}

TEST(TokenShard, MissingFileIsNotFound) {
  const testing::ScopedTempDir temp;
  absl::StatusOr<TokenShard> shard = TokenShard::open(temp.file("absent.bin"));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(shard.status().message(), HasSubstr("absent.bin"));
}

TEST(TokenShard, WriteIntoAMissingDirectoryNamesThePathAndWhy) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("no_such_dir/a.bin");
  const absl::Status status = write_token_shard(path, std::vector<uint16_t>{1});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(path + ": No such file or directory"));
}

TEST(GlobShards, ReturnsMatchesSortedByPath) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  for (const char* name : {"s_02.bin", "s_00.bin", "s_01.bin", "other.bin"}) {
    ASSERT_TRUE(write_token_shard(dir + "/" + name, {}).ok());
  }
  absl::StatusOr<std::vector<std::string>> paths = glob_shards(dir + "/s_*.bin");
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_THAT(*paths, ElementsAre(dir + "/s_00.bin", dir + "/s_01.bin", dir + "/s_02.bin"));
}

TEST(GlobShards, NoMatchIsNotFound) {
  const testing::ScopedTempDir temp;
  absl::StatusOr<std::vector<std::string>> paths = glob_shards(temp.file("none_*.bin"));
  EXPECT_EQ(paths.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(paths.status().message(), HasSubstr("none_*.bin"));
}

std::vector<uint16_t> iota_tokens(uint16_t first, int count) {
  std::vector<uint16_t> tokens(count);
  for (int i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(first + i);
  return tokens;
}

TEST(TokenShardDataset, CutsOverlappingWindowsPerShardInPathOrder) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  ASSERT_TRUE(write_token_shard(dir + "/d_1.bin", iota_tokens(100, 5)).ok());  // 1 window of T + 1 = 4
  ASSERT_TRUE(write_token_shard(dir + "/d_0.bin", iota_tokens(0, 11)).ok());   // 3 windows, token 10 unused
  absl::StatusOr<TokenShardDataset> dataset = TokenShardDataset::open(dir + "/d_*.bin", 3, 65536);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->size(), 4);
  ASSERT_EQ(dataset->seq_len(), 3);

  std::vector<std::vector<int32_t>> inputs, targets;
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int32_t> in(3), tg(3);
    dataset->read(i, in, tg);
    inputs.push_back(in);
    targets.push_back(tg);
  }
  EXPECT_THAT(inputs, ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4, 5), ElementsAre(6, 7, 8),
                                  ElementsAre(100, 101, 102)));
  EXPECT_THAT(targets, ElementsAre(ElementsAre(1, 2, 3), ElementsAre(4, 5, 6), ElementsAre(7, 8, 9),
                                   ElementsAre(101, 102, 103)));
}

TEST(TokenShardDataset, NoFullSequenceIsAnError) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("tiny.bin");
  ASSERT_TRUE(write_token_shard(path, iota_tokens(0, 4)).ok());
  absl::StatusOr<TokenShardDataset> dataset = TokenShardDataset::open(path, 4, 65536);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr("no sequence of T + 1 = 5 tokens"));
}

TEST(TokenShardDataset, ATokenOutsideTheVocabularyIsFoundWhenTheShardOpensNamingItsPlace) {
  const testing::ScopedTempDir temp;
  const std::string path = temp.file("d_0.bin");
  std::vector<uint16_t> tokens = iota_tokens(0, 40);
  tokens[33] = 50;  // the vocabulary is 40 tokens: ids 0-39
  ASSERT_TRUE(write_token_shard(path, tokens).ok());
  absl::StatusOr<TokenShardDataset> dataset = TokenShardDataset::open(path, 4, 40);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dataset.status().message(), path + ": token 50 at position 33 is outside the vocabulary of 40 tokens");
  EXPECT_TRUE(TokenShardDataset::open(path, 4, 51).ok());
}

TEST(TokenShardDataset, InvalidShardFailsTheWholeOpen) {
  const testing::ScopedTempDir temp;
  const std::string dir = temp.path().string();
  ASSERT_TRUE(write_token_shard(dir + "/d_0.bin", iota_tokens(0, 9)).ok());
  write_bytes(dir + "/d_1.bin", "junk");
  absl::StatusOr<TokenShardDataset> dataset = TokenShardDataset::open(dir + "/d_*.bin", 2, 65536);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dataset.status().message(), HasSubstr(dir + "/d_1.bin"));
}

}  // namespace
}  // namespace zero::data
