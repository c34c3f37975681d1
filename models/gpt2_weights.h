// Hugging Face GPT-2 checkpoints (safetensors): reading one into zero's layout and writing zero's parameters as one.
#pragma once

// Hugging Face names a parameter as gpt2_hf_name does ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.weight",
// as the hub's gpt2 model.safetensors). Two layouts differ from zero's:
// - Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are stored (in, out), the transpose
//   of zero's (out, in) (nn.Linear's, the matmul kernel's);
// - wte has the real vocab's V rows; zero's has Vp (padded_vocab_size): rows V..Vp-1 are zero on load
//   and dropped on save.
// Files are read as transformers writes them: names with or without GPT2LMHeadModel's "transformer." prefix,
// F32, BF16 or F16 (widened exactly to fp32), an lm_head.weight equal to wte.weight (zero ties the head),
// and a wpe of more positions than max_seq_len (the model takes the first max_seq_len rows).
// Files are written in fp32, unprefixed, with the model's own max_seq_len rows of wpe.

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
  // Reads `path` and checks it holds every tensor the config needs, F32, BF16 or F16, in Hugging Face's
  // shape (wpe with max_seq_len positions or more); the error names the first tensor that is missing or
  // wrong. Tensors of a model with other sizes (another layer, say) are errors too. HF's causal-mask buffers
  // (h.{i}.attn.bias, h.{i}.attn.masked_bias) are skipped by name; an lm_head.weight is checked equal to
  // wte.weight, and refused if it differs.
  static absl::StatusOr<Gpt2HfReader> open(const std::string& path, const Gpt2Config& config);

  // Writes parameter `param` of `unit` into dst in zero's layout (fp32, contiguous CPU, the ParamSpec's
  // shape). The signature of Engine::load_params' fill.
  absl::Status fill(absl::string_view unit, absl::string_view param, const Tensor& dst) const;

  // What the load does beyond copying, one phrase each ("tensors in BF16, widened exactly to fp32"), for
  // the log; empty for a file in zero's own format.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  Gpt2HfReader(SafetensorsFile file, std::map<std::string, Gpt2HfTensor> tensors, std::string prefix,
               std::vector<std::string> notes)
      : file_(std::move(file)), tensors_(std::move(tensors)), prefix_(std::move(prefix)), notes_(std::move(notes)) {}

  SafetensorsFile file_;
  std::map<std::string, Gpt2HfTensor> tensors_;  // by Hugging Face name
  std::string prefix_;                           // of the file's names: "" or "transformer."
  std::vector<std::string> notes_;
};

// The config.json transformers' from_pretrained reads beside the weights, for a GPT2LMHeadModel of `config`'s
// shape: vocab_size V (wte's rows in the file, not Vp), n_positions max_seq_len (wpe's rows), gelu_new,
// layer_norm_epsilon 1e-5, a tied head, float32; bos/eos 50256 for GPT-2's own 50257 tokens only.
std::string gpt2_hf_config_json(const Gpt2Config& config);

// The safetensors file an export to `path` writes: path/model.safetensors when `path` names a directory
// (ends in '/' or is an existing one), else `path` itself.
std::string gpt2_hf_export_file(const std::string& path);

// Collects zero's parameters and writes them as a Hugging Face GPT-2 file.
class Gpt2HfWriter {
 public:
  explicit Gpt2HfWriter(const Gpt2Config& config);

  // Copies parameter `param` of `unit` (zero's layout, a CPU tensor in fp32, or bf16/fp16 widened exactly
  // to the file's fp32) in Hugging Face's. The signature of Engine::visit_full_params' visit.
  absl::Status add(absl::string_view unit, absl::string_view param, const Tensor& value);
  // Fails, naming it, if a parameter was never added.
  absl::Status write(const std::string& path) const;
  // A model transformers loads: the weights written to gpt2_hf_export_file(path) and config.json
  // (gpt2_hf_config_json) beside them. Beside a model.safetensors config.json is replaced: the two are
  // Hugging Face's layout of one model, which from_pretrained(dir) reads. Beside another name it is written
  // unless a different config.json is there already (it may describe another model), which is kept.
  // Returns a line saying what it wrote, for the log.
  absl::StatusOr<std::string> export_to(const std::string& path) const;

 private:
  Gpt2Config config_;
  std::vector<Gpt2HfTensor> order_;
  std::map<std::string, std::vector<float>> data_;  // by Hugging Face name, Hugging Face's layout
};

}  // namespace zero
