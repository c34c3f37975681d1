// The CPU's fp32 stand-ins for half tensors (widened.h), in per-thread scratch kept between calls.
#include "kernels/widened.h"

#include <memory>

#include "kernels/check.h"
#include "kernels/kernels.h"
#include "runtime/status.h"

namespace zero::kernels::detail {
namespace {

// Scratch up to this size stays with its thread for the next call: every GEMM of a half model widens its operands,
// and fresh memory costs a page fault per 4 KiB. Larger copies (a big vocabulary's logits) are freed after the call.
constexpr size_t kKeptFloats = size_t{16} << 20;  // 64 MiB

class Scratch {
 public:
  // At least n floats, uninitialized: the outputs are written whole, the inputs widened over.
  float* at_least(size_t n) {
    if (capacity_ < n) {
      data_.reset(new float[n]);
      capacity_ = n;
    }
    return data_.get();
  }
  void trim() {
    if (capacity_ > kKeptFloats) *this = Scratch();
  }

 private:
  std::unique_ptr<float[]> data_;
  size_t capacity_ = 0;
};

}  // namespace

absl::Status on_widened(const std::vector<std::pair<Tensor, Role>>& args,
                        const std::function<absl::Status(const std::vector<Tensor>&)>& fp32_call) {
  thread_local std::vector<Scratch> scratch;  // one per argument
  if (scratch.size() < args.size()) scratch.resize(args.size());
  const auto widens = [&](size_t k) { return given(args[k].first) && args[k].first.dtype() != DType::kF32; };
  std::vector<Tensor> fp32;
  for (size_t k = 0; k < args.size(); ++k) {
    const auto& [t, role] = args[k];
    if (!widens(k)) {
      fp32.push_back(t);
      continue;
    }
    fp32.emplace_back(scratch[k].at_least(static_cast<size_t>(t.numel())), DType::kF32, t.shape());
    if (role != Role::kOut) ZERO_RETURN_IF_ERROR(cast(fp32.back(), t));
  }
  absl::Status status = fp32_call(fp32);
  for (size_t k = 0; k < args.size() && status.ok(); ++k) {
    if (widens(k) && args[k].second != Role::kIn) status = cast(args[k].first, fp32[k]);
  }
  for (Scratch& s : scratch) s.trim();
  return status;
}

}  // namespace zero::kernels::detail
