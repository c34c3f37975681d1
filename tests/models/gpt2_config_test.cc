// GPT-2 configs: presets, validation and parameter counts against the published figures.
#include "models/gpt2_config.h"

#include <cmath>

#include "gtest/gtest.h"

namespace zero {
namespace {

TEST(Gpt2Config, PaddedVocabRoundsUpToMultipleOf128) {
  EXPECT_EQ(padded_vocab(50257), 50304);
  EXPECT_EQ(padded_vocab(128), 128);
  EXPECT_EQ(padded_vocab(129), 256);
}

// llm.c prints "num_parameters: 124475904" for GPT-2 124M with the vocab padded to 50304.
TEST(Gpt2Config, D12CountsLlmcParameters) {
  absl::StatusOr<Gpt2Config> c = Gpt2Config::preset("d12");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->padded_vocab_size, 50304);
  EXPECT_EQ(c->num_parameters(), 124475904);
}

TEST(Gpt2Config, ParameterCountFromTheShapeEqualsTheDeclaredParameters) {
  for (const char* name : {"tiny", "d12", "d24", "d36", "d48"}) {
    const Gpt2Config c = *Gpt2Config::preset(name);
    EXPECT_EQ(c.parameter_count(), static_cast<double>(c.num_parameters())) << name;
  }
  const Gpt2Config odd = Gpt2Config::make(52, 13, 3, 4, 64);
  EXPECT_EQ(odd.parameter_count(), static_cast<double>(odd.num_parameters()));
}

// Hugging Face's gpt2 (50257 rows of wte): 124,439,808 parameters.
TEST(Gpt2Config, D12CountsHuggingFaceParametersUnpadded) {
  EXPECT_EQ(Gpt2Config::preset("d12")->num_real_parameters(), 124439808);
}

// Hugging Face's gpt2-medium, gpt2-large and gpt2-xl (unpadded vocab).
TEST(Gpt2Config, LargerPresetsCountHuggingFaceParameters) {
  EXPECT_EQ(Gpt2Config::preset("d24")->num_real_parameters(), 354823168);
  EXPECT_EQ(Gpt2Config::preset("d36")->num_real_parameters(), 774030080);
  EXPECT_EQ(Gpt2Config::preset("d48")->num_real_parameters(), 1557611200);
}

TEST(Gpt2Config, PresetsAreValid) {
  for (const char* name : {"tiny", "d12", "d24", "d36", "d48"}) {
    absl::StatusOr<Gpt2Config> c = Gpt2Config::preset(name);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->validate().ok()) << name << ": " << c->validate();
  }
}

TEST(Gpt2Config, UnknownPresetNamesTheKnownOnes) {
  absl::StatusOr<Gpt2Config> c = Gpt2Config::preset("d13");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("d12"), absl::string_view::npos) << c.status();
}

TEST(Gpt2Config, ValidateRejectsChannelsNotDivisibleByHeads) {
  absl::Status s = Gpt2Config::make(16, 100, 2, 3, 32).validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_heads"), absl::string_view::npos) << s;
}

TEST(Gpt2Config, ValidateRejectsPaddedVocabBelowVocab) {
  Gpt2Config c = Gpt2Config::make(16, 100, 2, 2, 32);
  c.padded_vocab_size = 64;
  EXPECT_EQ(c.validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Gpt2Config, UnitsAreEmbeddingBlocksHeadWithHuggingFaceNames) {
  std::vector<Gpt2UnitParams> units = gpt2_unit_params(*Gpt2Config::preset("tiny"));
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].unit, "embedding");
  EXPECT_EQ(units[1].unit, "h.0");
  EXPECT_EQ(units[3].unit, "head");
  EXPECT_EQ(gpt2_hf_name(units[0].unit, units[0].params[0].name), "wte.weight");
  EXPECT_EQ(gpt2_hf_name(units[2].unit, units[2].params[2].name), "h.1.attn.c_attn.weight");
  EXPECT_EQ(gpt2_hf_name(units[3].unit, units[3].params[0].name), "ln_f.weight");
}

// GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2L).
TEST(Gpt2Config, ResidualProjectionsInitScaledByInverseSqrtTwoL) {
  std::vector<Gpt2UnitParams> units = gpt2_unit_params(*Gpt2Config::preset("d12"));
  for (const ParamSpec& spec : units[1].params) {
    if (spec.name == "attn.c_proj.weight" || spec.name == "mlp.c_proj.weight") {
      EXPECT_FLOAT_EQ(spec.init.std, 0.02f / std::sqrt(24.0f)) << spec.name;
    } else if (spec.name == "attn.c_attn.weight" || spec.name == "mlp.c_fc.weight") {
      EXPECT_FLOAT_EQ(spec.init.std, 0.02f) << spec.name;
    }
  }
}

}  // namespace
}  // namespace zero
