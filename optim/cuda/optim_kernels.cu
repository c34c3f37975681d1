#include "optim/cuda/optim_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/cuda/cuda_check.h"

namespace zero::optim {
namespace {

constexpr int kMaxSegments = 48;  // per launch; kernel parameters stay under 4 KiB
constexpr int kMaxGroups = 8;
constexpr int kThreads = 256;

// A parameter's part of the shard [begin, end) (shard-local) and its group.
struct Segment {
  int64_t begin;
  int64_t end;
  int32_t group;
};

// Passed by value as a kernel parameter, so no device allocation per step.
template <typename Coeffs>
struct Table {
  Segment segments[kMaxSegments];
  int32_t num_segments;
  Coeffs coeffs[kMaxGroups];
};

struct HalfOut {
  uint16_t* out;  // null: no copy
  bool bf16;
  bool stochastic;
  uint64_t seed;
  int64_t flat_begin;
  int64_t step;
};

// The segment holding shard element i, or -1 for padding and gaps (binary search over sorted segments).
template <typename Coeffs>
__device__ int find_segment(const Table<Coeffs>& t, int64_t i) {
  int lo = 0, hi = t.num_segments;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (t.segments[mid].begin <= i ? lo : hi) = mid;
  }
  return t.segments[lo].begin <= i && i < t.segments[lo].end ? lo : -1;
}

__device__ void write_half(const HalfOut& h, int64_t i, float x) {
  if (h.out == nullptr) return;
  if (h.stochastic) {
    const uint32_t r = rounding_bits(h.seed, h.step, h.flat_begin + i);
    h.out[i] = h.bf16 ? bf16_stochastic(x, r) : fp16_stochastic(x, r);
  } else {
    h.out[i] = h.bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
  }
}

// Grid-stride loop over the table's span; fn(i, coeffs) returns the new parameter of element i.
template <typename Coeffs, typename Fn>
__device__ void for_each_element(const Table<Coeffs>& t, float* p, const HalfOut& h, Fn fn) {
  const int64_t first = t.segments[0].begin, last = t.segments[t.num_segments - 1].end;
  for (int64_t i = first + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < last;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int s = find_segment(t, i);
    if (s < 0) continue;
    const float x = fn(i, t.coeffs[t.segments[s].group]);
    p[i] = x;
    write_half(h, i, x);
  }
}

__global__ void sgd_kernel(Table<SgdCoeffs> t, float* p, const float* g, float* buf, HalfOut h) {
  for_each_element(t, p, h, [&](int64_t i, const SgdCoeffs& c) {
    float unused = 0.0f;
    return sgd_element(p[i], g[i], buf != nullptr ? buf[i] : unused, c);
  });
}

__global__ void adam_kernel(Table<AdamCoeffs> t, float* p, const float* g, float* m, float* v, HalfOut h) {
  for_each_element(t, p, h, [&](int64_t i, const AdamCoeffs& c) { return adam_element(p[i], g[i], m[i], v[i], c); });
}

HalfOut half_out(const ShardLayout& layout, const ShardStep& s) {
  if (!s.half->enabled()) return HalfOut{nullptr, false, false, 0, 0, 0};
  return HalfOut{static_cast<uint16_t*>(s.half->out.data()), s.half->out.dtype() == DType::kBF16, s.half->stochastic,
                 s.half->seed, layout.shard_begin(), s.step};
}

// Launches `launch(table)` once per kMaxSegments parameter segments of the shard.
template <typename Coeffs, typename Launch>
absl::Status for_each_table(const ShardLayout& layout, const std::vector<Coeffs>& coeffs, Launch launch) {
  if (coeffs.size() > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA optimizers take at most ", kMaxGroups,
                                                   " parameter groups, got ", coeffs.size()));
  }
  std::vector<Segment> segments;  // chunks merged back into whole parameter segments
  for (const ShardChunk& c : layout.chunks()) {
    if (!segments.empty() && segments.back().end == c.begin && segments.back().group == layout.params()[c.param].group) {
      segments.back().end = c.end;
    } else {
      segments.push_back({c.begin, c.end, layout.params()[c.param].group});
    }
  }
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    Table<Coeffs> t{};
    t.num_segments = static_cast<int32_t>(std::min<size_t>(kMaxSegments, segments.size() - first));
    std::copy_n(segments.begin() + first, t.num_segments, t.segments);
    std::copy(coeffs.begin(), coeffs.end(), t.coeffs);
    const int64_t span = t.segments[t.num_segments - 1].end - t.segments[0].begin;
    const int blocks = static_cast<int>(std::min<int64_t>((span + kThreads - 1) / kThreads, 65535));
    launch(t, blocks);
    ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(0));
  return absl::OkStatus();
}

}  // namespace

absl::Status cuda_zero(void* ptr, int64_t nbytes) {
  ZERO_CUDA_RETURN_IF_ERROR(cudaMemset(ptr, 0, static_cast<size_t>(nbytes)));
  return absl::OkStatus();
}

absl::Status sgd_cuda(const ShardLayout& layout, const std::vector<SgdCoeffs>& coeffs, const ShardStep& s,
                      float* momentum_buffer) {
  const HalfOut h = half_out(layout, s);
  return for_each_table(layout, coeffs, [&](const Table<SgdCoeffs>& t, int blocks) {
    sgd_kernel<<<blocks, kThreads>>>(t, s.params, s.grads, momentum_buffer, h);
  });
}

absl::Status adam_cuda(const ShardLayout& layout, const std::vector<AdamCoeffs>& coeffs, const ShardStep& s,
                       float* exp_avg, float* exp_avg_sq) {
  const HalfOut h = half_out(layout, s);
  return for_each_table(layout, coeffs, [&](const Table<AdamCoeffs>& t, int blocks) {
    adam_kernel<<<blocks, kThreads>>>(t, s.params, s.grads, exp_avg, exp_avg_sq, h);
  });
}

}  // namespace zero::optim
