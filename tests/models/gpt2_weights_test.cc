// Hugging Face GPT-2 weights IO: round trip through the tiny fixture, layouts, and errors that name the tensor.
#include "models/gpt2_weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "tests/temp_dir.h"

namespace zero {
namespace {

const std::string kFixture = ZERO_FIXTURES_DIR "/gpt2_tiny.safetensors";

Gpt2Config tiny() { return *Gpt2Config::preset("tiny"); }

// Every parameter of the tiny config in zero's layout, NaN until filled.
struct Params {
  std::vector<std::pair<Gpt2UnitParams, std::vector<std::vector<float>>>> units;

  explicit Params(const Gpt2Config& config) {
    for (Gpt2UnitParams& unit : gpt2_unit_params(config)) {
      std::vector<std::vector<float>> values;
      for (const ParamSpec& spec : unit.params) {
        values.emplace_back(shape_numel(spec.shape), std::numeric_limits<float>::quiet_NaN());
      }
      units.emplace_back(std::move(unit), std::move(values));
    }
  }
  absl::Status for_each(const std::function<absl::Status(const std::string&, const std::string&, const Tensor&)>& f) {
    for (auto& [unit, values] : units) {
      for (size_t i = 0; i < unit.params.size(); ++i) {
        ZERO_RETURN_IF_ERROR(
            f(unit.unit, unit.params[i].name, Tensor(values[i].data(), DType::kF32, unit.params[i].shape)));
      }
    }
    return absl::OkStatus();
  }
  Tensor get(const std::string& unit, const std::string& param) {
    Tensor out;
    (void)for_each([&](const std::string& u, const std::string& p, const Tensor& t) {
      if (u == unit && p == param) out = t;
      return absl::OkStatus();
    });
    return out;
  }
};

Params load_fixture() {
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(kFixture, tiny());
  EXPECT_TRUE(reader.ok()) << reader.status();
  Params params(tiny());
  absl::Status s = params.for_each([&](const std::string& unit, const std::string& param, const Tensor& dst) {
    return reader->fill(unit, param, dst);
  });
  EXPECT_TRUE(s.ok()) << s;
  return params;
}

// The fixture's tensors with `edit` applied to the list, written to `name` in `dir`.
std::string edited_fixture(const testing::ScopedTempDir& dir, const std::string& name,
                           const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(kFixture);
  EXPECT_TRUE(file.ok()) << file.status();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& e : file->entries()) tensors.emplace_back(e.name, *file->get(e.name));
  edit(tensors);
  const std::string path = dir.file(name);
  EXPECT_TRUE(write_safetensors(path, tensors).ok());
  return path;
}

// The fixture as GPT2LMHeadModel.save_pretrained(torch_dtype=dtype) writes it: every tensor rounded to `dtype`
// (bf16 or fp16) under "transformer." + its name.
std::string save_pretrained_fixture(const testing::ScopedTempDir& dir, DType dtype) {
  std::vector<std::vector<uint16_t>> halves;  // the data, until it is written
  return edited_fixture(dir, "save_pretrained.safetensors", [&](auto& tensors) {
    halves.reserve(tensors.size());
    for (auto& [name, t] : tensors) {
      std::vector<uint16_t>& half = halves.emplace_back(t.numel());
      for (int64_t i = 0; i < t.numel(); ++i) store_from_float(half.data(), dtype, i, t.template data_as<float>()[i]);
      t = Tensor(half.data(), dtype, t.shape());
      name = "transformer." + name;
    }
  });
}

// A file of the fixture's values in bf16 or fp16 loads as those values widened: the fp32 fixture's values,
// rounded to `dtype` and back, bit for bit.
void expect_loads_widened_exactly(DType dtype) {
  const testing::ScopedTempDir dir;
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(save_pretrained_fixture(dir, dtype), tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT(reader->notes(), ::testing::ElementsAre(absl::StrCat("tensors in ", safetensors_dtype_name(dtype),
                                                                   ", widened exactly to fp32")));
  Params want = load_fixture();
  Params got(tiny());
  const absl::Status filled = got.for_each([&](const std::string& unit, const std::string& param, const Tensor& dst) {
    return reader->fill(unit, param, dst);
  });
  ASSERT_TRUE(filled.ok()) << filled;
  for (size_t u = 0; u < want.units.size(); ++u) {
    for (size_t p = 0; p < want.units[u].second.size(); ++p) {
      const std::vector<float>& w = want.units[u].second[p];
      const std::vector<float>& g = got.units[u].second[p];
      for (size_t i = 0; i < w.size(); ++i) {
        uint16_t half = 0;
        store_from_float(&half, dtype, 0, w[i]);
        ASSERT_EQ(float_bits(g[i]), float_bits(load_as_float(&half, dtype, 0)))
            << want.units[u].first.unit << " " << want.units[u].first.params[p].name << " element " << i;
      }
    }
  }
}

// The fixture with lm_head.weight: wte's values, `element` of it set to 1 unless it is -1.
std::string fixture_with_head(const testing::ScopedTempDir& dir, std::vector<float>& head, int64_t element) {
  return edited_fixture(dir, "head.safetensors", [&](auto& tensors) {
    for (const auto& [name, t] : std::vector(tensors)) {
      if (name != "wte.weight") continue;
      head.assign(t.template data_as<float>(), t.template data_as<float>() + t.numel());
      if (element >= 0) head[element] = 1.0f;
      tensors.emplace_back("lm_head.weight", Tensor(head.data(), DType::kF32, t.shape()));
    }
  });
}

// The fixture with a wpe of `rows` positions holding 0, 1, 2, ... in `wpe`.
std::string fixture_with_positions(const testing::ScopedTempDir& dir, std::vector<float>& wpe, int64_t rows) {
  wpe.resize(rows * 32);
  for (size_t i = 0; i < wpe.size(); ++i) wpe[i] = static_cast<float>(i);
  return edited_fixture(dir, "positions.safetensors", [&](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "wpe.weight") t = Tensor(wpe.data(), DType::kF32, {rows, 32});
    }
  });
}

// The tiny model at max_seq_len 64 (the fixture's wpe has 16 positions).
Gpt2Config tiny_at_64_positions() { return Gpt2Config::make(64, 100, 2, 2, 32); }

void expect_open_error_names(const std::string& path, const Gpt2Config& config, const std::string& tensor) {
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(path, config);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  EXPECT_NE(reader.status().message().find(tensor), absl::string_view::npos) << reader.status();
}

TEST(Gpt2Weights, LoadTransposesConv1DWeightsToOutIn) {
  Params params = load_fixture();
  SafetensorsFile file = *SafetensorsFile::read(kFixture);
  Tensor file_w = *file.get("h.1.mlp.c_fc.weight");  // (C, 4C)
  Tensor w = params.get("h.1", "mlp.c_fc.weight");   // (4C, C)
  ASSERT_EQ(file_w.shape(), (Shape{32, 128}));
  ASSERT_EQ(w.shape(), (Shape{128, 32}));
  for (int64_t o = 0; o < 128; ++o) {
    for (int64_t i = 0; i < 32; ++i) ASSERT_EQ(w.data_as<float>()[o * 32 + i], file_w.data_as<float>()[i * 128 + o]);
  }
}

TEST(Gpt2Weights, LoadZeroesPaddedVocabRows) {
  Params params = load_fixture();
  Tensor wte = params.get("embedding", "wte.weight");  // (128, 32), 100 real rows
  SafetensorsFile file = *SafetensorsFile::read(kFixture);
  Tensor file_wte = *file.get("wte.weight");
  ASSERT_EQ(file_wte.shape(), (Shape{100, 32}));
  for (int64_t i = 0; i < 100 * 32; ++i) ASSERT_EQ(wte.data_as<float>()[i], file_wte.data_as<float>()[i]);
  for (int64_t i = 100 * 32; i < 128 * 32; ++i) ASSERT_EQ(wte.data_as<float>()[i], 0.0f) << i;
}

// Load then save gives the fixture back bit for bit, tensor by tensor: transposes undone, padding dropped.
TEST(Gpt2Weights, SaveOfLoadedWeightsReproducesFile) {
  Params params = load_fixture();
  Gpt2HfWriter writer(tiny());
  ASSERT_TRUE(
      params.for_each([&](const std::string& u, const std::string& p, const Tensor& v) { return writer.add(u, p, v); })
          .ok());
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("roundtrip.safetensors");
  ASSERT_TRUE(writer.write(path).ok());

  SafetensorsFile want = *SafetensorsFile::read(kFixture);
  SafetensorsFile got = *SafetensorsFile::read(path);
  ASSERT_EQ(got.entries().size(), want.entries().size());
  for (const SafetensorsEntry& e : want.entries()) {
    absl::StatusOr<Tensor> g = got.get(e.name, e.dtype, e.shape);
    ASSERT_TRUE(g.ok()) << g.status();
    Tensor w = *want.get(e.name);
    EXPECT_EQ(std::memcmp(g->data(), w.data(), w.nbytes()), 0) << e.name;
  }
  EXPECT_EQ(got.metadata().at("format"), "pt");
}

TEST(Gpt2Weights, MissingTensorIsNamed) {
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "missing.safetensors", [](auto& tensors) {
    std::erase_if(tensors, [](const auto& t) { return t.first == "h.1.attn.c_proj.bias"; });
  });
  expect_open_error_names(path, tiny(), "h.1.attn.c_proj.bias");
}

TEST(Gpt2Weights, ANaNInTheWeightsIsRefusedNamingTheTensorAndElement) {
  std::vector<float> bias(32, 0.5f);
  bias[7] = std::nanf("");
  const testing::ScopedTempDir dir;
  const std::string path = edited_fixture(dir, "nan.safetensors", [&](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "h.0.ln_1.bias") t = Tensor(bias.data(), DType::kF32, {32});
    }
  });
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(path, tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  Params params(tiny());
  const absl::Status filled = params.for_each([&](const std::string& unit, const std::string& param,
                                                  const Tensor& dst) { return reader->fill(unit, param, dst); });
  EXPECT_TRUE(absl::IsInvalidArgument(filled)) << filled;
  EXPECT_EQ(filled.message(), "tensor 'h.0.ln_1.bias' holds nan at element 7; a model starts from finite weights");
}

TEST(Gpt2Weights, WrongShapeIsNamed) {
  std::vector<float> bigger(33, 1.0f);
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "shape.safetensors", [&](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "ln_f.weight") t = Tensor(bigger.data(), DType::kF32, {33});
    }
  });
  expect_open_error_names(path, tiny(), "ln_f.weight");
}

// A file saved as (out, in) instead of Conv1D's (in, out) has the wrong shape for a non-square weight.
TEST(Gpt2Weights, UntransposedConv1DWeightIsNamed) {
  std::vector<float> out_in(96 * 32, 0.0f);
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "untransposed.safetensors", [&](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "h.0.attn.c_attn.weight") t = Tensor(out_in.data(), DType::kF32, {96, 32});
    }
  });
  expect_open_error_names(path, tiny(), "h.0.attn.c_attn.weight");
}

TEST(Gpt2Weights, WrongDtypeIsNamed) {
  std::vector<int32_t> ints(32, 1);
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "dtype.safetensors", [&](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name == "h.0.ln_2.bias") t = Tensor(ints.data(), DType::kI32, {32});
    }
  });
  expect_open_error_names(path, tiny(), "h.0.ln_2.bias");
}

// The fixture's last tensor in data order is ln_f.bias; cutting the file short leaves it incomplete.
TEST(Gpt2Weights, TruncatedFileNamesTheCutTensor) {
  std::ifstream in(kFixture, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const testing::ScopedTempDir dir;
  const std::string path = dir.file("truncated.safetensors");
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 8);
  expect_open_error_names(path, tiny(), "ln_f.bias");
}

// A 2-layer file opened with a 1-layer config: h.1's tensors are not the config's.
TEST(Gpt2Weights, TensorsOfALargerModelAreNamed) {
  Gpt2Config one_layer = tiny();
  one_layer.num_layers = 1;
  expect_open_error_names(kFixture, one_layer, "h.1.");
}

TEST(Gpt2Weights, VocabMismatchIsNamed) {
  Gpt2Config bigger_vocab = Gpt2Config::make(16, 120, 2, 2, 32);
  expect_open_error_names(kFixture, bigger_vocab, "wte.weight");
}

// Hugging Face files carry causal-mask buffers (h.{i}.attn.bias); they are not parameters.
TEST(Gpt2Weights, AttentionMaskBuffersAreSkipped) {
  std::vector<float> mask(16 * 16, 1.0f);
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "mask.safetensors", [&](auto& tensors) {
    tensors.emplace_back("h.0.attn.bias", Tensor(mask.data(), DType::kF32, {1, 1, 16, 16}));
  });
  EXPECT_TRUE(Gpt2HfReader::open(path, tiny()).ok());
}

// Older transformers also wrote masked_bias; save_pretrained's files name both under "transformer.".
TEST(Gpt2Weights, MaskBuffersUnderSavePretrainedNamesAreSkipped) {
  std::vector<float> mask(16 * 16, 1.0f);
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "mask.safetensors", [&](auto& tensors) {
    for (auto& [name, t] : tensors) name = "transformer." + name;
    tensors.emplace_back("transformer.h.1.attn.bias", Tensor(mask.data(), DType::kF32, {1, 1, 16, 16}));
    tensors.emplace_back("transformer.h.1.attn.masked_bias", Tensor(mask.data(), DType::kF32, {}));
  });
  EXPECT_TRUE(Gpt2HfReader::open(path, tiny()).ok());
}

// Buffers are skipped by name: the mask of a layer the config lacks says the file is another model's.
TEST(Gpt2Weights, MaskBufferOfALayerTheConfigLacksIsNamed) {
  std::vector<float> mask(16 * 16, 1.0f);
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "mask.safetensors", [&](auto& tensors) {
    tensors.emplace_back("h.2.attn.bias", Tensor(mask.data(), DType::kF32, {1, 1, 16, 16}));
  });
  expect_open_error_names(path, tiny(), "h.2.attn.bias");
}

TEST(Gpt2Weights, F16FileUnderSavePretrainedNamesLoadsAsItsValuesWidenedExactly) {
  expect_loads_widened_exactly(DType::kF16);
}

TEST(Gpt2Weights, Bf16FileUnderSavePretrainedNamesLoadsAsItsValuesWidenedExactly) {
  expect_loads_widened_exactly(DType::kBF16);
}

// A file mixing "transformer."-prefixed and bare names is no file transformers writes.
TEST(Gpt2Weights, ABareNameInAPrefixedFileIsNamed) {
  const testing::ScopedTempDir dir;
  std::string path = edited_fixture(dir, "mixed.safetensors", [](auto& tensors) {
    for (auto& [name, t] : tensors) {
      if (name != "ln_f.bias") name = "transformer." + name;
    }
  });
  expect_open_error_names(path, tiny(), "transformer.ln_f.bias");
}

TEST(Gpt2Weights, LmHeadEqualToWteIsTakenAsTheTiedHead) {
  std::vector<float> head;
  const testing::ScopedTempDir dir;
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(fixture_with_head(dir, head, -1), tiny());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT(reader->notes(), ::testing::ElementsAre("lm_head.weight equals wte.weight (the tied head)"));
}

TEST(Gpt2Weights, LmHeadThatDiffersFromWteIsRefusedNamingTheElement) {
  std::vector<float> head;
  const testing::ScopedTempDir dir;
  const std::string path = fixture_with_head(dir, head, 37);
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(path, tiny());
  ASSERT_TRUE(absl::IsInvalidArgument(reader.status())) << reader.status();
  EXPECT_THAT(reader.status().message(),
              ::testing::HasSubstr("tensor 'lm_head.weight' differs from 'wte.weight' at element 37 (1 vs "));
  EXPECT_THAT(reader.status().message(), ::testing::HasSubstr("remove lm_head.weight from the file"));
}

// The hub's gpt2 has 1024 positions; fine-tuning at a shorter context takes the first ones, as GPT-2 trainers do.
TEST(Gpt2Weights, WpeOfMorePositionsLoadsItsFirstMaxSeqLenRows) {
  std::vector<float> wpe;
  const testing::ScopedTempDir dir;
  absl::StatusOr<Gpt2HfReader> reader =
      Gpt2HfReader::open(fixture_with_positions(dir, wpe, 1024), tiny_at_64_positions());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT(reader->notes(),
              ::testing::ElementsAre("wpe.weight has 1024 positions; the model (max_seq_len 64) takes the first 64"));
  Params params(tiny_at_64_positions());
  const absl::Status filled = params.for_each([&](const std::string& unit, const std::string& param,
                                                  const Tensor& dst) { return reader->fill(unit, param, dst); });
  ASSERT_TRUE(filled.ok()) << filled;
  const Tensor got = params.get("embedding", "wpe.weight");
  ASSERT_EQ(got.shape(), (Shape{64, 32}));
  EXPECT_EQ(std::vector<float>(got.data_as<float>(), got.data_as<float>() + got.numel()),
            std::vector<float>(wpe.begin(), wpe.begin() + 64 * 32));
}

TEST(Gpt2Weights, WpeOfFewerPositionsThanMaxSeqLenIsRefusedNamingBoth) {
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(kFixture, tiny_at_64_positions());
  ASSERT_TRUE(absl::IsInvalidArgument(reader.status())) << reader.status();
  EXPECT_EQ(reader.status().message(),
            absl::StrCat(kFixture,
                         ": tensor 'wpe.weight' has 16 positions but the model's max_seq_len is 64; train on "
                         "sequences of at most 16 tokens, or start from a file with 64 positions or more"));
}

// An export writes the model's own positions: the file it started from had more, which it never trained.
TEST(Gpt2Weights, SaveAfterALongerWpeWritesTheModelsMaxSeqLenRows) {
  std::vector<float> wpe;
  const testing::ScopedTempDir dir;
  absl::StatusOr<Gpt2HfReader> reader =
      Gpt2HfReader::open(fixture_with_positions(dir, wpe, 1024), tiny_at_64_positions());
  ASSERT_TRUE(reader.ok()) << reader.status();
  Gpt2HfWriter writer(tiny_at_64_positions());
  Params params(tiny_at_64_positions());
  const absl::Status saved = params.for_each([&](const std::string& unit, const std::string& param, const Tensor& v) {
    ZERO_RETURN_IF_ERROR(reader->fill(unit, param, v));
    return writer.add(unit, param, v);
  });
  ASSERT_TRUE(saved.ok()) << saved;
  ASSERT_TRUE(writer.write(dir.file("out.safetensors")).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(dir.file("out.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<Tensor> written = file->get("wpe.weight");
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->shape(), (Shape{64, 32}));
  EXPECT_EQ(std::memcmp(written->data(), wpe.data(), written->nbytes()), 0);
}

// The fixture's weights in a writer, ready to export.
std::unique_ptr<Gpt2HfWriter> fixture_writer() {
  Params params = load_fixture();
  auto writer = std::make_unique<Gpt2HfWriter>(tiny());
  const absl::Status added = params.for_each(
      [&](const std::string& unit, const std::string& param, const Tensor& v) { return writer->add(unit, param, v); });
  EXPECT_TRUE(added.ok()) << added;
  return writer;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The folder transformers' GPT2LMHeadModel.from_pretrained(dir) loads: model.safetensors and its config.json.
TEST(Gpt2Weights, ExportToADirectoryWritesModelSafetensorsAndTheConfigJsonTransformersReads) {
  const testing::ScopedTempDir dir;
  const std::string folder = dir.path().string() + "/";
  absl::StatusOr<std::string> exported = fixture_writer()->export_to(folder);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(*exported, absl::StrCat("exported ", folder, "model.safetensors and ", folder, "config.json"));

  const nlohmann::json config = read_json(folder + "config.json");
  const nlohmann::json want = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", 100},
      {"n_positions", 16},
      {"n_ctx", 16},
      {"n_embd", 32},
      {"n_layer", 2},
      {"n_head", 2},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  EXPECT_EQ(config, want) << config.dump(2);  // no bos/eos: the vocabulary is not GPT-2's
  // The file's wte and wpe have the rows the config says: V, not the padded Vp, and n_positions.
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::read(folder + "model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->get("wte.weight", DType::kF32, {100, 32}).ok());
  EXPECT_TRUE(file->get("wpe.weight", DType::kF32, {16, 32}).ok());
}

TEST(Gpt2Weights, ConfigJsonNamesEndOfTextAsBosAndEosForGpt2sVocabularyOnly) {
  const nlohmann::json d12 = nlohmann::json::parse(gpt2_hf_config_json(*Gpt2Config::preset("d12")));
  EXPECT_EQ(d12["vocab_size"], 50257);  // wte's rows in the file, not the 50304 zero trains
  EXPECT_EQ(d12["n_positions"], 1024);
  EXPECT_EQ(d12["bos_token_id"], 50256);
  EXPECT_EQ(d12["eos_token_id"], 50256);
  const nlohmann::json tiny_config = nlohmann::json::parse(gpt2_hf_config_json(tiny()));
  EXPECT_FALSE(tiny_config.contains("bos_token_id"));
  EXPECT_FALSE(tiny_config.contains("eos_token_id"));
}

TEST(Gpt2Weights, ExportFileOfAnExistingDirectoryIsModelSafetensorsInIt) {
  const testing::ScopedTempDir dir;
  EXPECT_EQ(gpt2_hf_export_file(dir.path().string()), dir.file("model.safetensors"));
  EXPECT_EQ(gpt2_hf_export_file("no/such/dir/"), "no/such/dir/model.safetensors");
  EXPECT_EQ(gpt2_hf_export_file(dir.file("ft.safetensors")), dir.file("ft.safetensors"));
}

// An export named otherwise shares its directory: a config.json there may describe another model.
TEST(Gpt2Weights, ExportBesideAnotherFileKeepsADifferentConfigJson) {
  const testing::ScopedTempDir dir;
  std::ofstream(dir.file("config.json")) << R"({"model_type": "bert"})";
  absl::StatusOr<std::string> exported = fixture_writer()->export_to(dir.file("ft.safetensors"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_THAT(*exported, ::testing::StartsWith(absl::StrCat("exported ", dir.file("ft.safetensors"), "; kept ",
                                                            dir.file("config.json"), ", which describes another")));
  EXPECT_EQ(read_json(dir.file("config.json")), nlohmann::json({{"model_type", "bert"}}));
  EXPECT_TRUE(SafetensorsFile::read(dir.file("ft.safetensors")).ok());
}

// Exporting the same model again beside another name (a resumed run) finds its own config.json.
TEST(Gpt2Weights, ExportBesideAnotherFileWritesConfigJsonWhenNoneOrTheSameIsThere) {
  const testing::ScopedTempDir dir;
  for (const std::string name : {"a.safetensors", "b.safetensors"}) {
    absl::StatusOr<std::string> exported = fixture_writer()->export_to(dir.file(name));
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(*exported, absl::StrCat("exported ", dir.file(name), " and ", dir.file("config.json")));
  }
  EXPECT_EQ(read_json(dir.file("config.json")), nlohmann::json::parse(gpt2_hf_config_json(tiny())));
}

// model.safetensors and config.json are one model in Hugging Face's layout: replacing one replaces both.
TEST(Gpt2Weights, ExportToModelSafetensorsReplacesTheConfigJsonBesideIt) {
  const testing::ScopedTempDir dir;
  std::ofstream(dir.file("config.json")) << R"({"model_type": "gpt2", "n_positions": 1024})";
  absl::StatusOr<std::string> exported = fixture_writer()->export_to(dir.file("model.safetensors"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(read_json(dir.file("config.json")), nlohmann::json::parse(gpt2_hf_config_json(tiny())));
}

TEST(Gpt2Weights, FillRejectsUnknownParameter) {
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(kFixture, tiny());
  ASSERT_TRUE(reader.ok());
  std::vector<float> v(32);
  absl::Status s = reader->fill("h.0", "ln_3.weight", Tensor(v.data(), DType::kF32, {32}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ln_3.weight"), absl::string_view::npos) << s;
}

TEST(Gpt2Weights, FillRejectsDestinationOfWrongShape) {
  absl::StatusOr<Gpt2HfReader> reader = Gpt2HfReader::open(kFixture, tiny());
  ASSERT_TRUE(reader.ok());
  std::vector<float> v(100 * 32);
  absl::Status s = reader->fill("embedding", "wte.weight", Tensor(v.data(), DType::kF32, {100, 32}));  // needs Vp rows
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("wte.weight"), absl::string_view::npos) << s;
}

TEST(Gpt2Weights, WriteNamesParameterNeverAdded) {
  Params params = load_fixture();
  Gpt2HfWriter writer(tiny());
  ASSERT_TRUE(params
                  .for_each([&](const std::string& u, const std::string& p, const Tensor& v) {
                    return p == "ln_2.weight" && u == "h.1" ? absl::OkStatus() : writer.add(u, p, v);
                  })
                  .ok());
  const testing::ScopedTempDir dir;
  absl::Status s = writer.write(dir.file("incomplete.safetensors"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("ln_2.weight"), absl::string_view::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir.file("incomplete.safetensors")));
}

}  // namespace
}  // namespace zero
