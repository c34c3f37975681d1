#include "models/gpt2_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero {
namespace {

// Every parameter of `config` with both layouts, in forward order.
std::vector<Gpt2HfTensor> hf_tensors(const Gpt2Config& config) {
  std::vector<Gpt2HfTensor> out;
  for (const Gpt2UnitParams& unit : gpt2_unit_params(config)) {
    for (const ParamSpec& spec : unit.params) {
      Gpt2HfTensor t{unit.unit, spec.name, spec.shape, spec.shape, false};
      if (spec.name == "wte.weight") {
        t.hf_shape = {config.vocab_size, config.channels};
      } else if (unit.unit != kGpt2EmbeddingUnit && spec.shape.size() == 2) {  // a block's Conv1D weight
        t.hf_shape = {spec.shape[1], spec.shape[0]};
        t.transposed = true;
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::map<std::string, Gpt2HfTensor> by_hf_name(const std::vector<Gpt2HfTensor>& tensors) {
  std::map<std::string, Gpt2HfTensor> out;
  for (const Gpt2HfTensor& t : tensors) out.emplace(gpt2_hf_name(t.unit, t.param), t);
  return out;
}

bool is_attention_mask(absl::string_view name) {
  return absl::StartsWith(name, "h.") &&
         (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias"));
}

// dst (cols, rows) = src (rows, cols)^T.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

absl::StatusOr<const Gpt2HfTensor*> find_param(const std::map<std::string, Gpt2HfTensor>& tensors,
                                               absl::string_view unit, absl::string_view param) {
  auto it = tensors.find(gpt2_hf_name(unit, param));
  if (it == tensors.end() || it->second.unit != unit) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 has no parameter '", param, "' in unit '", unit, "'"));
  }
  return &it->second;
}

absl::Status check_param_view(const Gpt2HfTensor& t, const Tensor& view) {
  if (view.dtype() != DType::kF32 || view.shape() != t.shape || !view.is_contiguous() || !view.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", t.param, "' of unit '", t.unit,
                                                   "' must be a contiguous fp32 CPU tensor of shape ",
                                                   shape_string(t.shape), "; got ", view.to_string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Gpt2HfReader> Gpt2HfReader::open(const std::string& path, const Gpt2Config& config) {
  ZERO_RETURN_IF_ERROR(config.validate());
  ZERO_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::read(path));
  std::map<std::string, Gpt2HfTensor> tensors = by_hf_name(hf_tensors(config));
  for (const auto& [name, t] : tensors) {
    if (!file.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has no tensor '", name, "' (", shape_string(t.hf_shape),
                                                     "); is it a GPT-2 checkpoint with ", config.num_layers,
                                                     " layers?"));
    }
    ZERO_RETURN_IF_ERROR(file.get(name, DType::kF32, t.hf_shape).status());
  }
  for (const SafetensorsEntry& entry : file.entries()) {
    if (!tensors.contains(entry.name) && !is_attention_mask(entry.name)) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has tensor '", entry.name, "', which a GPT-2 with ",
                                                     config.num_layers, " layers, ", config.channels,
                                                     " channels does not have; check the config"));
    }
  }
  return Gpt2HfReader(std::move(file), std::move(tensors));
}

absl::Status Gpt2HfReader::fill(absl::string_view unit, absl::string_view param, const Tensor& dst) const {
  ZERO_ASSIGN_OR_RETURN(const Gpt2HfTensor* t, find_param(tensors_, unit, param));
  ZERO_RETURN_IF_ERROR(check_param_view(*t, dst));
  ZERO_ASSIGN_OR_RETURN(Tensor src, file_.get(gpt2_hf_name(unit, param)));
  const float* values = src.data_as<float>();
  if (const float* bad = std::find_if(values, values + src.numel(), [](float v) { return !std::isfinite(v); });
      bad != values + src.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", gpt2_hf_name(unit, param), "' holds ", *bad,
                                                   " at element ", bad - values,
                                                   "; a model starts from finite weights"));
  }
  if (t->transposed) {
    transpose(src.data_as<float>(), t->hf_shape[0], t->hf_shape[1], dst.data_as<float>());
    return absl::OkStatus();
  }
  std::memcpy(dst.data(), src.data(), src.nbytes());
  std::memset(static_cast<char*>(dst.data()) + src.nbytes(), 0, dst.nbytes() - src.nbytes());  // wte's padding rows
  return absl::OkStatus();
}

Gpt2HfWriter::Gpt2HfWriter(const Gpt2Config& config) : order_(hf_tensors(config)) {}

absl::Status Gpt2HfWriter::add(absl::string_view unit, absl::string_view param, const Tensor& value) {
  auto it = std::find_if(order_.begin(), order_.end(),
                         [&](const Gpt2HfTensor& t) { return t.unit == unit && t.param == param; });
  if (it == order_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 has no parameter '", param, "' in unit '", unit, "'"));
  }
  // bf16 and fp16 weights are widened, exactly: the file holds the weights the model computed with.
  std::vector<float> widened;
  Tensor value32 = value;
  if (is_floating(value.dtype()) && value.dtype() != DType::kF32 && value.device().is_cpu()) {
    widened.resize(value.numel());
    value32 = Tensor(widened.data(), DType::kF32, value.shape());
    ZERO_RETURN_IF_ERROR(kernels::cast(value32, value));
  }
  ZERO_RETURN_IF_ERROR(check_param_view(*it, value32));
  std::vector<float>& out = data_[gpt2_hf_name(unit, param)];
  out.resize(shape_numel(it->hf_shape));
  if (it->transposed) {
    transpose(value32.data_as<float>(), it->shape[0], it->shape[1], out.data());
  } else {
    std::memcpy(out.data(), value32.data(), out.size() * sizeof(float));  // wte: its first V rows
  }
  return absl::OkStatus();
}

absl::Status Gpt2HfWriter::write(const std::string& path) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Gpt2HfTensor& t : order_) {
    std::string name = gpt2_hf_name(t.unit, t.param);
    auto it = data_.find(name);
    if (it == data_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write ", path, ": parameter '", t.param, "' of unit '", t.unit, "' was never added"));
    }
    tensors.emplace_back(name, Tensor(const_cast<float*>(it->second.data()), DType::kF32, t.hf_shape));
  }
  return write_safetensors(path, tensors, {{"format", "pt"}});
}

}  // namespace zero
