#include "optim/square_sum.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/dtype_dispatch.h"
#include "runtime/parallel.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {

constexpr int kBitZeroExponent = -298;  // bit 0 of the fixed-point integer is 2^-298

void SquareSum::add(const SquareBins& b) {
  for (int e = 1; e < 255; ++e) {
    if (b.bins[e] == 0) continue;
    const int pos = 2 * e - 2;  // m^2 * 2^(2e-300) = m^2 at bit 2e-2
    const unsigned __int128 v = static_cast<unsigned __int128>(b.bins[e]) << (pos % 32);
    const int k = pos / 32;
    limbs_[k] += static_cast<uint64_t>(v & 0xffffffffu);
    limbs_[k + 1] += static_cast<uint64_t>((v >> 32) & 0xffffffffu);
    limbs_[k + 2] += static_cast<uint64_t>(v >> 64);
    normalize();
  }
  nan_ += b.nan;
  inf_ += b.inf;
}

void SquareSum::merge(const SquareSum& other) {
  for (int k = 0; k < kLimbs; ++k) limbs_[k] += other.limbs_[k];
  normalize();
  nan_ += other.nan_;
  inf_ += other.inf_;
}

void SquareSum::normalize() {
  uint64_t carry = 0;
  for (uint64_t& limb : limbs_) {
    const uint64_t v = limb + carry;
    limb = v & 0xffffffffu;
    carry = v >> 32;
  }
  ZERO_CHECK(carry == 0, "sum of squares overflowed ", kLimbs * 32, " bits");
}

void SquareSum::to_wire(int32_t* out) const {
  for (int k = 0; k < kLimbs; ++k) {
    out[2 * k] = static_cast<int32_t>(limbs_[k] & 0xffffu);
    out[2 * k + 1] = static_cast<int32_t>(limbs_[k] >> 16);
  }
  out[2 * kLimbs] = nan_ != 0;
  out[2 * kLimbs + 1] = inf_ != 0;
}

SquareSum SquareSum::from_wire(const int32_t* in) {
  SquareSum s;
  for (int k = 0; k < kLimbs; ++k) {
    s.limbs_[k] = static_cast<uint64_t>(static_cast<uint32_t>(in[2 * k])) +
                  (static_cast<uint64_t>(static_cast<uint32_t>(in[2 * k + 1])) << 16);
  }
  s.normalize();
  s.nan_ = static_cast<uint32_t>(in[2 * kLimbs]);
  s.inf_ = static_cast<uint32_t>(in[2 * kLimbs + 1]);
  return s;
}

double SquareSum::value() const {
  if (nan_ != 0) return std::numeric_limits<double>::quiet_NaN();
  if (inf_ != 0) return std::numeric_limits<double>::infinity();
  double acc = 0.0;
  for (int k = kLimbs - 1; k >= 0; --k) acc += std::ldexp(static_cast<double>(limbs_[k]), 32 * k + kBitZeroExponent);
  return acc;
}

namespace {

// One CPU tensor's exact sum, its chunks binned over the OpenMP threads.
SquareSum cpu_square_sum(const Tensor& x, float divisor) {
  constexpr int64_t kChunk = SquareBins::kMaxBinnedValues;
  std::vector<SquareSum> chunks(static_cast<size_t>(ceil_div(x.numel(), kChunk)));
  visit_floating(x.dtype(), [&](auto t) {
    for_blocks(x.numel(), kChunk, [&](int64_t begin, int64_t end) {
      SquareBins bins;
      for (int64_t i = begin; i < end; ++i) bins.add(load_as_float(x.data(), decltype(t)::value, i) / divisor);
      chunks[begin / kChunk].add(bins);
    });
  });
  SquareSum sum;
  for (const SquareSum& chunk : chunks) sum.merge(chunk);
  return sum;
}

absl::Status check_square_sum_inputs(std::span<const Tensor> xs) {
  for (const Tensor& x : xs) {
    if (!is_floating(x.dtype()) || !x.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat("exact_square_sum: x must be a contiguous fp32, bf16 or fp16 tensor, got ", x.to_string()));
    }
    if (x.device() != xs.front().device()) {
      return absl::InvalidArgumentError(absl::StrCat("exact_square_sum: the tensors are on ",
                                                     xs.front().device().to_string(), " and ", x.device().to_string(),
                                                     "; sum each device's on its own"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SquareSum> exact_square_sum(std::span<const Tensor> xs, float divisor) {
  ZERO_RETURN_IF_ERROR(check_square_sum_inputs(xs));
  if (xs.empty()) return SquareSum();
  const Device device = xs.front().device();
  if (device.is_sim()) {  // the CPU's bins in one launch, waited for: the host reads the sum
    auto sum = std::make_shared<SquareSum>();
    std::vector<Access> accesses;
    for (const Tensor& x : xs) accesses.push_back(reads(x));
    std::vector<Tensor> tensors(xs.begin(), xs.end());
    ZERO_RETURN_IF_ERROR(launch_on_sim(
        device, "exact_square_sum", std::move(accesses),
        [tensors, divisor, sum](HostTensors& host) -> absl::Status {
          std::vector<Tensor> on_host;
          for (const Tensor& x : tensors) on_host.push_back(host(x));
          ZERO_RETURN_IF_ERROR(host.status());
          ZERO_ASSIGN_OR_RETURN(*sum, exact_square_sum(on_host, divisor));
          return absl::OkStatus();
        },
        /*wait=*/true));
    return *sum;
  }
  if (device.is_cuda()) {
#if ZERO_HAS_CUDA
    return optim::exact_square_sum_cuda(device.index, xs, divisor);
#else
    return absl::FailedPreconditionError(absl::StrCat("exact_square_sum: x is on ", device.to_string(),
                                                      " but zero was built without CUDA (ZERO_WITH_CUDA=OFF)"));
#endif
  }
  SquareSum sum;
  for (const Tensor& x : xs) sum.merge(cpu_square_sum(x, divisor));
  return sum;
}

}  // namespace zero
