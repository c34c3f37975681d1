// Hugging Face GPT-2 checkpoints (safetensors): reading one into zero's layout and writing zero's parameters as one.
#pragma once

// Hugging Face names a parameter as gpt2_hf_name does ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.weight";
// no "transformer." prefix, as the hub's gpt2 model.safetensors). Two layouts differ from zero's:
// - Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are stored (in, out), the transpose
//   of zero's (out, in) (nn.Linear's, the matmul kernel's);
// - wte has the real vocab's V rows; zero's has Vp (padded_vocab_size): rows V..Vp-1 are zero on load
//   and dropped on save.
// Only fp32 files are read.

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/gpt2_config.h"
#include "runtime/safetensors.h"
#include "runtime/tensor.h"

namespace zero {

// One parameter as both sides store it.
struct Gpt2HfTensor {
  std::string unit;         // zero's unit ("h.0")
  std::string param;        // its name in the unit ("attn.c_attn.weight")
  Shape shape;              // zero's layout
  Shape hf_shape;           // Hugging Face's layout
  bool transposed = false;  // a Conv1D weight
};

// A Hugging Face GPT-2 file checked against a config, ready to fill zero's parameters.
class Gpt2HfReader {
 public:
  // Reads `path` and checks it holds every tensor the config needs, fp32, in Hugging Face's shape; the
  // error names the first tensor that is missing or wrong. Tensors of a model with other sizes (another
  // layer, say) are errors too; only HF's causal-mask buffers (h.{i}.attn.bias, h.{i}.attn.masked_bias)
  // are skipped.
  static absl::StatusOr<Gpt2HfReader> open(const std::string& path, const Gpt2Config& config);

  // Writes parameter `param` of `unit` into dst in zero's layout (fp32, contiguous CPU, the ParamSpec's
  // shape). The signature of Engine::load_params' fill.
  absl::Status fill(absl::string_view unit, absl::string_view param, const Tensor& dst) const;

 private:
  Gpt2HfReader(SafetensorsFile file, std::map<std::string, Gpt2HfTensor> tensors)
      : file_(std::move(file)), tensors_(std::move(tensors)) {}

  SafetensorsFile file_;
  std::map<std::string, Gpt2HfTensor> tensors_;  // by Hugging Face name
};

// Collects zero's parameters and writes them as a Hugging Face GPT-2 file.
class Gpt2HfWriter {
 public:
  explicit Gpt2HfWriter(const Gpt2Config& config);

  // Copies parameter `param` of `unit` (zero's layout, a CPU tensor in fp32, or bf16/fp16 widened exactly
  // to the file's fp32) in Hugging Face's. The signature of Engine::visit_full_params' visit.
  absl::Status add(absl::string_view unit, absl::string_view param, const Tensor& value);
  // Fails, naming it, if a parameter was never added.
  absl::Status write(const std::string& path) const;

 private:
  std::vector<Gpt2HfTensor> order_;
  std::map<std::string, std::vector<float>> data_;  // by Hugging Face name, Hugging Face's layout
};

}  // namespace zero
