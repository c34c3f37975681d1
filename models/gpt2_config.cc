#include "models/gpt2_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zero {

Gpt2Config Gpt2Config::make(int64_t max_seq_len, int64_t vocab_size, int64_t num_layers, int64_t num_heads,
                            int64_t channels) {
  return {.max_seq_len = max_seq_len,
          .vocab_size = vocab_size,
          .padded_vocab_size = padded_vocab(vocab_size),
          .num_layers = num_layers,
          .num_heads = num_heads,
          .channels = channels};
}

absl::StatusOr<Gpt2Config> Gpt2Config::preset(absl::string_view name) {
  if (name == "tiny") return make(16, 100, 2, 2, 32);
  if (name == "d12") return make(1024, 50257, 12, 12, 768);
  if (name == "d24") return make(1024, 50257, 24, 16, 1024);
  if (name == "d36") return make(1024, 50257, 36, 20, 1280);
  if (name == "d48") return make(1024, 50257, 48, 25, 1600);
  return absl::InvalidArgumentError(absl::StrCat("unknown GPT-2 preset '", name,
                                                 "'; use one of tiny, d12 (124M), d24 (350M), d36 (774M), d48 (1.5B)"));
}

absl::Status Gpt2Config::validate() const {
  const std::pair<const char*, int64_t> sizes[] = {{"max_seq_len", max_seq_len},
                                                   {"vocab_size", vocab_size},
                                                   {"num_layers", num_layers},
                                                   {"num_heads", num_heads},
                                                   {"channels", channels}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0)
      return absl::InvalidArgumentError(absl::StrCat("Gpt2Config.", field, " is ", value, "; it must be positive"));
  }
  if (channels % num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gpt2Config.channels (", channels, ") must be a multiple of num_heads (", num_heads, ")"));
  }
  if (padded_vocab_size < vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("Gpt2Config.padded_vocab_size (", padded_vocab_size,
                                                   ") is below vocab_size (", vocab_size, "); use padded_vocab(",
                                                   vocab_size, ") = ", padded_vocab(vocab_size)));
  }
  return absl::OkStatus();
}

int64_t Gpt2Config::num_parameters() const {
  int64_t n = 0;
  for (const Gpt2UnitParams& unit : gpt2_unit_params(*this)) {
    for (const ParamSpec& spec : unit.params) n += shape_numel(spec.shape);
  }
  return n;
}

int64_t Gpt2Config::num_real_parameters() const {
  return num_parameters() - (padded_vocab_size - vocab_size) * channels;
}

double Gpt2Config::parameter_count() const {
  // wte (Vp, C) and wpe (maxT, C); per block two LayerNorms (4C), c_attn (3C, C) + 3C, c_proj (C, C) + C,
  // c_fc (4C, C) + 4C and mlp c_proj (C, 4C) + C: 12C^2 + 13C; ln_f 2C.
  const double c = static_cast<double>(channels);
  return static_cast<double>(padded_vocab_size + max_seq_len) * c +
         static_cast<double>(num_layers) * (12 * c * c + 13 * c) + 2 * c;
}

int64_t padded_vocab(int64_t vocab_size) { return (vocab_size + 127) / 128 * 128; }

std::string gpt2_block_unit(int64_t layer) { return absl::StrCat("h.", layer); }

std::vector<Gpt2UnitParams> gpt2_unit_params(const Gpt2Config& config) {
  const int64_t C = config.channels;
  const float std = 0.02f;
  const float residual_std = std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  std::vector<Gpt2UnitParams> units;
  units.push_back({std::string(kGpt2EmbeddingUnit),
                   {{"wte.weight", {config.padded_vocab_size, C}, Init::normal(std)},
                    {"wpe.weight", {config.max_seq_len, C}, Init::normal(std)}}});
  for (int64_t l = 0; l < config.num_layers; ++l) {
    units.push_back({gpt2_block_unit(l),
                     {{"ln_1.weight", {C}, Init::ones()},
                      {"ln_1.bias", {C}, Init::zeros()},
                      {"attn.c_attn.weight", {3 * C, C}, Init::normal(std)},
                      {"attn.c_attn.bias", {3 * C}, Init::zeros()},
                      {"attn.c_proj.weight", {C, C}, Init::normal(residual_std)},
                      {"attn.c_proj.bias", {C}, Init::zeros()},
                      {"ln_2.weight", {C}, Init::ones()},
                      {"ln_2.bias", {C}, Init::zeros()},
                      {"mlp.c_fc.weight", {4 * C, C}, Init::normal(std)},
                      {"mlp.c_fc.bias", {4 * C}, Init::zeros()},
                      {"mlp.c_proj.weight", {C, 4 * C}, Init::normal(residual_std)},
                      {"mlp.c_proj.bias", {C}, Init::zeros()}}});
  }
  units.push_back(
      {std::string(kGpt2HeadUnit), {{"ln_f.weight", {C}, Init::ones()}, {"ln_f.bias", {C}, Init::zeros()}}});
  return units;
}

std::string gpt2_hf_name(absl::string_view unit, absl::string_view param) {
  if (unit == kGpt2EmbeddingUnit || unit == kGpt2HeadUnit) return std::string(param);
  return absl::StrCat(unit, ".", param);
}

}  // namespace zero
