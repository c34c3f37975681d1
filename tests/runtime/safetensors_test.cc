#include "runtime/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

// A file made by hand: header length, JSON header, data. `data` is the data section.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x7f80};
  std::vector<uint16_t> f16 = {0x3c00, 0xfbff};
  std::vector<int32_t> i32 = {-7, 2147483647};
  std::vector<uint16_t> u16 = {65535, 0};
  std::vector<uint8_t> u8 = {1, 2, 3};
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w", Tensor(f32.data(), DType::kF32, {2, 3})},  {"b", Tensor(bf16.data(), DType::kBF16, {3})},
      {"h", Tensor(f16.data(), DType::kF16, {2, 1})},  {"i", Tensor(i32.data(), DType::kI32, {2})},
      {"u", Tensor(u16.data(), DType::kU16, {1, 2})},  {"c", Tensor(u8.data(), DType::kU8, {3})},
      {"empty", Tensor(nullptr, DType::kF32, {0, 4})},
  };
  absl::StatusOr<std::string> bytes = serialize_safetensors(tensors, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::parse(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_EQ(file->entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    absl::StatusOr<Tensor> got = file->get(name, t.dtype(), t.shape());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->nbytes(), t.nbytes());
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got->data(), t.data(), t.nbytes()), 0) << name;
    }
  }
}

TEST(Safetensors, DataSectionIsAlignedForEveryHeaderLength) {
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde"}) {
    std::vector<float> v = {1.0f};
    absl::StatusOr<std::string> bytes = serialize_safetensors({{name, Tensor(v.data(), DType::kF32, {1})}});
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ((bytes->size() - 4) % 8, 0u) << "header padded to 8 bytes";
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::parse(*bytes);
    ASSERT_TRUE(file.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(file->get(name)->data()) % 64, 0u);
  }
}

TEST(Safetensors, WritesAndReadsAFile) {
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("x.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"x", Tensor(v.data(), DType::kF32, {3})}}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->get("x")->data_as<float>()[2], 3.0f);
}

TEST(Safetensors, AReadFileIsMappedCopyOnWrite) {
  // Views are aligned for their dtype, and writing through one changes this reader's copy, not the file.
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("ab.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"ab", Tensor(v.data(), DType::kF32, {3})}}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  Tensor x = *file->get("ab");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data()) % 8, 0u);
  x.data_as<float>()[1] = 20.0f;
  EXPECT_EQ(file->get("ab")->data_as<float>()[1], 20.0f);
  EXPECT_EQ(SafetensorsFile::read(path)->get("ab")->data_as<float>()[1], 2.0f);
}

TEST(Safetensors, ReadsAHandWrittenFileInDataOrder) {
  const std::string header = R"({"second":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("first":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::parse(make_file(header, bytes_of({7.0f, 9.0f})));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->entries()[0].name, "first");
  EXPECT_EQ(file->get("second")->data_as<float>()[0], 9.0f);
}

TEST(Safetensors, MissingFileIsNotFound) {
  EXPECT_EQ(SafetensorsFile::read("/nonexistent/x.safetensors").status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, RejectsFileShorterThanHeaderLength) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::parse(std::string(5, '\0'));
  EXPECT_THAT(file.status().message(), HasSubstr("truncated"));
}

TEST(Safetensors, RejectsHeaderLengthPastTheEnd) {
  std::string bytes = make_file("{}", "");
  bytes[0] = 100;
  EXPECT_THAT(SafetensorsFile::parse(bytes).status().message(), HasSubstr("runs past the end"));
}

TEST(Safetensors, RejectsHeaderThatIsNotJson) {
  EXPECT_THAT(SafetensorsFile::parse(make_file("{nope", "")).status().message(), HasSubstr("not a JSON object"));
}

TEST(Safetensors, RejectsOffsetsPastTheDataSection) {
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  absl::Status s = SafetensorsFile::parse(make_file(header, bytes_of({1.0f}))).status();
  EXPECT_THAT(s.message(), HasSubstr("outside the data section of 4 bytes"));
}

TEST(Safetensors, RejectsOverlappingTensors) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  absl::Status s = SafetensorsFile::parse(make_file(header, bytes_of({1, 2, 3}))).status();
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
}

TEST(Safetensors, RejectsShapeThatDisagreesWithOffsets) {
  const std::string header = R"({"x":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})";
  absl::Status s = SafetensorsFile::parse(make_file(header, bytes_of({1, 2}))).status();
  EXPECT_THAT(s.message(), HasSubstr("need 6 bytes but data_offsets span 8"));
}

TEST(Safetensors, RejectsUnsupportedDtypeNamingIt) {
  const std::string header = R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  absl::Status s = SafetensorsFile::parse(make_file(header, bytes_of({1, 2}))).status();
  EXPECT_THAT(s.message(), HasSubstr("dtype F64"));
}

TEST(Safetensors, GetWithWrongDtypeOrShapeSaysWhatWasExpected) {
  std::vector<float> v = {1, 2};
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::parse(*serialize_safetensors({{"x", Tensor(v.data(), DType::kF32, {2})}}));
  ASSERT_TRUE(file.ok());
  EXPECT_THAT(file->get("x", DType::kF32, {1, 2}).status().message(), HasSubstr("F32(2) but F32(1, 2) was expected"));
  EXPECT_THAT(file->get("x", DType::kBF16, {2}).status().message(), HasSubstr("BF16(2) was expected"));
  EXPECT_THAT(file->get("y").status().message(), HasSubstr("it has: x"));
}

TEST(Safetensors, SerializeRejectsDuplicateNames) {
  std::vector<float> v = {1};
  Tensor t(v.data(), DType::kF32, {1});
  EXPECT_FALSE(serialize_safetensors({{"x", t}, {"x", t}}).ok());
}

}  // namespace
}  // namespace zero
