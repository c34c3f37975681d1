// GPT-2 shapes: the config, the standard presets, and the parameters each unit of the model owns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shard/module.h"

namespace zero {

struct Gpt2Config {
  int64_t max_seq_len = 1024;         // maxT: rows of wpe
  int64_t vocab_size = 50257;         // V: tokens the model predicts
  int64_t padded_vocab_size = 50304;  // Vp: rows of wte, V rounded up to a multiple of 128 (as llm.c)
  int64_t num_layers = 12;            // L
  int64_t num_heads = 12;             // NH
  int64_t channels = 768;             // C, a multiple of NH

  // A config with padded_vocab_size = padded_vocab(vocab_size).
  static Gpt2Config make(int64_t max_seq_len, int64_t vocab_size, int64_t num_layers, int64_t num_heads,
                         int64_t channels);
  // tiny (tests: maxT 16, V 100 -> Vp 128, L 2, NH 2, C 32), d12 (124M), d24 (350M), d36 (774M), d48 (1.5B).
  static absl::StatusOr<Gpt2Config> preset(absl::string_view name);

  // Fails, saying which field is wrong, unless every size is positive, C % NH == 0 and V <= Vp.
  absl::Status validate() const;

  // Every parameter the model allocates (wte with Vp rows): 124,475,904 for d12, as llm.c counts.
  int64_t num_parameters() const;
  // The same with wte at V rows, as Hugging Face counts: 124,439,808 for d12.
  int64_t num_real_parameters() const;
  // num_parameters() from the shape alone, in double: for a shape too large to declare or to count in
  // int64 (exact below 2^53 parameters).
  double parameter_count() const;
};

// vocab rounded up to a multiple of 128.
int64_t padded_vocab(int64_t vocab_size);

// The model's units, in forward order: "embedding" (wte, wpe), "h.0" ... "h.{L-1}" (one per transformer
// block), "head" (ln_f, and the embedding's wte through a TiedParam).
inline constexpr absl::string_view kGpt2EmbeddingUnit = "embedding";
inline constexpr absl::string_view kGpt2HeadUnit = "head";
std::string gpt2_block_unit(int64_t layer);

struct Gpt2UnitParams {
  std::string unit;
  std::vector<ParamSpec> params;  // zero's layout: linear weights (out, in) as nn.Linear, wte (Vp, C)
};
// Every unit's own parameters, in forward order. Inits as GPT-2: weights N(0, 0.02), the residual
// projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm gains 1.
std::vector<Gpt2UnitParams> gpt2_unit_params(const Gpt2Config& config);

// A parameter's Hugging Face name: "h.3" + "ln_1.weight" -> "h.3.ln_1.weight"; the embedding's and the
// head's parameters keep their own names ("wte.weight", "ln_f.weight").
std::string gpt2_hf_name(absl::string_view unit, absl::string_view param);

}  // namespace zero
