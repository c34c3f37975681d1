// The optimizers and the exact square sum on a device against the CPU, bitwise: on the simulated device always, on
// CUDA where a GPU is (the CUDA cases skip without one).
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optim/optimizers.h"
#include "optim/square_sum.h"
#include "runtime/comm/local.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "tests/skip_without_gpu.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {
namespace {

using Factory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(ShardLayout, Allocator&, Device)>;

constexpr int kRanks = 3;
constexpr int64_t kFlat = 300001;  // padded to 300003: every rank's shard spans several 2^16-element chunks
constexpr int64_t kShard = (kFlat + kRanks - 1) / kRanks;
constexpr int kSteps = 3;

// Every rank's slice of the flat buffers after the steps; state in the optimizer's order of names (zeros past its
// last).
struct Trajectory {
  std::vector<float> params;
  std::vector<uint16_t> half;
  std::vector<std::vector<float>> state;
};
constexpr int kMaxState = 2;

std::vector<float> normal_vector(int64_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = scale * dist(gen);
  return v;
}

// Moves a rank's slice of host vector `v` to or from a device tensor (any device; copy_bytes waits).
template <typename T>
absl::Status upload(const std::vector<T>& v, int64_t begin, const Tensor& t) {
  return copy_bytes(t.data(), t.device(), v.data() + begin, Device::cpu(), t.nbytes());
}
template <typename T>
absl::Status download(const Tensor& t, std::vector<T>& v, int64_t begin) {
  return copy_bytes(v.data() + begin, Device::cpu(), t.data(), t.device(), t.nbytes());
}

// How run_rank hands the optimizer its gradients: fp32, or rounded to bf16/fp16 and stored so, with a loss scale to
// divide by and a clipping coefficient to multiply by; or `prescaled`: that division and multiplication done on the
// host, the optimizer given the fp32 results alone (what the optimizer's own reading must give).
struct GradientForm {
  DType dtype = DType::kF32;
  float loss_scale = 1.0f;
  float clip = 1.0f;
  bool prescaled = false;
};

// The rank's slice of gradients `grads` as `form` says: the host bytes to upload, and their dtype.
std::pair<std::vector<uint8_t>, DType> gradient_bytes(std::vector<float> grads, const GradientForm& form) {
  const int64_t n = static_cast<int64_t>(grads.size());
  for (float& g : grads) {
    uint8_t stored[4];
    store_from_float(stored, form.dtype, 0, g);
    g = load_as_float(stored, form.dtype, 0);
    if (form.prescaled) g = g / form.loss_scale * form.clip;
  }
  const DType dtype = form.prescaled ? DType::kF32 : form.dtype;
  std::vector<uint8_t> bytes(n * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) store_from_float(bytes.data(), dtype, i, grads[i]);
  return {std::move(bytes), dtype};
}

// Parameters that straddle ranks (LAMB/LARS norms need the allreduce), 60 small ones (more segments than one CUDA
// launch takes), a gap that is never written, two groups; padding grads are NaN, which no update may read. With
// `measure_first`, an optimizer that communicates takes its steps as the engine does: measure() queued, the device
// waited for once, the norms reduced, then step() with them.
absl::Status run_rank(const Factory& make, Device device, bool measure_first, const GradientForm& form,
                      Communicator& comm, Trajectory& out) {
  std::vector<FlatParam> params = {{"a.weight", 0, 150000}, {"a.bias", 150000, 30}};
  for (int i = 0; i < 60; ++i) params.push_back({absl::StrCat("h", i, ".weight"), 150040 + 100 * i, 100});
  params.push_back({"b.weight", 156040, kFlat - 156040});
  std::vector<ParamGroup> groups = assign_decay_groups(params, 0.05f);
  groups[1].lr_scale = 0.25f;
  ZERO_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::for_rank(params, groups, kFlat, comm.rank(), kRanks));
  Allocator allocator(comm.rank());
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, make(std::move(layout), allocator, device));
  ZERO_ASSIGN_OR_RETURN(Buffer p, allocator.allocate(kShard * 4, MemoryCategory::kParams, device));
  ZERO_ASSIGN_OR_RETURN(Buffer g, allocator.allocate(kShard * 4, MemoryCategory::kGrads, device));
  ZERO_ASSIGN_OR_RETURN(Buffer h, allocator.allocate(kShard * 2, MemoryCategory::kParams, device));
  const Tensor pt = p.tensor(DType::kF32, {kShard});
  const HalfCopy half{h.tensor(DType::kBF16, {kShard}), /*stochastic=*/true, /*seed=*/9};
  const int64_t begin = comm.rank() * kShard;
  ZERO_RETURN_IF_ERROR(upload(out.params, begin, pt));
  ZERO_RETURN_IF_ERROR(upload(out.half, begin, half.out));
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<float> grads = normal_vector(kFlat, 100 + t, 0.1f);
    grads.resize(kShard * kRanks, std::numeric_limits<float>::quiet_NaN());
    const auto [bytes, dtype] =
        gradient_bytes(std::vector<float>(grads.begin() + begin, grads.begin() + begin + kShard), form);
    const Tensor tensor = g.tensor(dtype, {kShard});
    ZERO_RETURN_IF_ERROR(upload(bytes, 0, tensor));
    const Gradients gt = form.prescaled ? Gradients(tensor) : Gradients(tensor, form.loss_scale, form.clip);
    if (!measure_first || !opt->communicates()) {
      ZERO_RETURN_IF_ERROR(opt->step(pt, gt, t, 0.01f, &comm, half));
      continue;
    }
    ZERO_ASSIGN_OR_RETURN(const NormParts parts, opt->measure(pt, gt, t, 0.01f));
    ZERO_RETURN_IF_ERROR(synchronize(device));
    ZERO_ASSIGN_OR_RETURN(const std::vector<WholeParamNorms> norms, reduce_norm_parts({parts}, &comm));
    ZERO_RETURN_IF_ERROR(opt->step(pt, gt, t, 0.01f, &comm, half, &norms[0]));
  }
  ZERO_RETURN_IF_ERROR(download(pt, out.params, begin));
  ZERO_RETURN_IF_ERROR(download(half.out, out.half, begin));
  const std::vector<std::pair<std::string, Tensor>> state = opt->state();
  for (size_t i = 0; i < state.size(); ++i) ZERO_RETURN_IF_ERROR(download(state[i].second, out.state.at(i), begin));
  return absl::OkStatus();
}

// kRanks ranks, rank r on `device(r)`.
Trajectory run(const Factory& make, const std::function<Device(int)>& device, bool measure_first = false,
               const GradientForm& form = {}) {
  Trajectory out{normal_vector(kShard * kRanks, 5, 1.0f), std::vector<uint16_t>(kShard * kRanks),
                 std::vector<std::vector<float>>(kMaxState, std::vector<float>(kShard * kRanks))};
  const std::vector<absl::Status> statuses = run_local_ranks(
      kRanks, [&](Communicator& comm) { return run_rank(make, device(comm.rank()), measure_first, form, comm, out); });
  EXPECT_TRUE(root_cause(statuses).ok()) << root_cause(statuses);
  return out;
}

struct OptimizerCase {
  const char* name;
  Factory make;
};
void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

// Where the device side runs: the simulated device gives every rank a device of its own; CUDA's ranks share cuda:0.
enum class Where { kSim, kCuda };
Device device_of(Where where, int rank) { return where == Where::kSim ? Device::sim(rank) : Device::cuda(0); }
std::string where_name(Where where) { return where == Where::kSim ? "Sim" : "Cuda"; }

void expect_same_bits(const Trajectory& cpu, const Trajectory& dev) {
  EXPECT_EQ(std::memcmp(cpu.params.data(), dev.params.data(), cpu.params.size() * 4), 0);
  EXPECT_EQ(std::memcmp(cpu.half.data(), dev.half.data(), cpu.half.size() * 2), 0);
  for (int i = 0; i < kMaxState; ++i) {
    EXPECT_EQ(std::memcmp(cpu.state[i].data(), dev.state[i].data(), cpu.state[i].size() * 4), 0) << "state " << i;
  }
}

class DeviceMatchesCpu : public ::testing::TestWithParam<std::tuple<Where, OptimizerCase>> {};

// Bitwise: the simulated device runs the CPU loops; the CUDA kernels call the CPU's element functions
// (element_math.h), both sides built without FMA contraction (-ffp-contract=off, --fmad=false) with IEEE division
// and sqrt, and the LAMB/LARS norms come from the same exact integer square sums (square_sum.h) whatever the order
// of the device's atomics.
// With the norms measured first (the engine's way), the device's first pass is queued and its sums read after one
// wait (on CUDA, from the bins' queued copy), and the steps keep step() alone's bits.
TEST_P(DeviceMatchesCpu, Bitwise) {
  const Where where = std::get<0>(GetParam());
  const OptimizerCase& optimizer = std::get<1>(GetParam());
  if (where == Where::kCuda) ZERO_SKIP_WITHOUT_GPU();
  const Trajectory cpu = run(optimizer.make, [](int) { return Device::cpu(); });
  for (const bool measure_first : {false, true}) {
    SCOPED_TRACE(measure_first ? "norms measured first" : "step alone");
    expect_same_bits(cpu, run(
                              optimizer.make, [where](int rank) { return device_of(where, rank); }, measure_first));
  }
}

// fp32, bf16 and fp16 gradients, with a loss scale and a clipping coefficient, read by the optimizer itself (on the CPU
// and on the device) give the bits of the step on their fp32 copy divided and multiplied beforehand: what the engine
// did before the optimizers read the training dtype, and the bits every stage and device must keep.
TEST_P(DeviceMatchesCpu, HalfGradientsUnscaledAndClippedAsReadGiveTheirFp32CopysBits) {
  const Where where = std::get<0>(GetParam());
  const OptimizerCase& optimizer = std::get<1>(GetParam());
  if (where == Where::kCuda) ZERO_SKIP_WITHOUT_GPU();
  const auto on_cpu = [](int) { return Device::cpu(); };
  const auto on_device = [where](int rank) { return device_of(where, rank); };
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const GradientForm form{.dtype = dtype, .loss_scale = 1000.0f, .clip = 0.3f};  // the order matters
    GradientForm prescaled = form;
    prescaled.prescaled = true;
    const Trajectory reference = run(optimizer.make, on_cpu, false, prescaled);
    for (const bool measure_first : {false, true}) {
      SCOPED_TRACE(absl::StrCat(dtype_name(dtype), measure_first ? ", norms measured first" : ", step alone"));
      expect_same_bits(reference, run(optimizer.make, on_cpu, measure_first, form));
      expect_same_bits(reference, run(optimizer.make, on_device, measure_first, form));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, DeviceMatchesCpu,
    ::testing::Combine(
        ::testing::Values(Where::kSim, Where::kCuda),
        ::testing::Values(
            OptimizerCase{"SgdNesterov",
                          [](ShardLayout l, Allocator& a, Device d) {
                            return make_sgd({.momentum = 0.9, .nesterov = true}, std::move(l), a, d);
                          }},
            OptimizerCase{"SgdWithoutState",
                          [](ShardLayout l, Allocator& a, Device d) { return make_sgd({}, std::move(l), a, d); }},
            OptimizerCase{"Adam",
                          [](ShardLayout l, Allocator& a,
                             Device d) { return make_adam({.decoupled_weight_decay = false}, std::move(l), a, d); }},
            OptimizerCase{"AdamW",
                          [](ShardLayout l, Allocator& a, Device d) { return make_adam({}, std::move(l), a, d); }},
            OptimizerCase{"Lamb",
                          [](ShardLayout l, Allocator& a, Device d) { return make_lamb({}, std::move(l), a, d); }},
            OptimizerCase{"Lars",
                          [](ShardLayout l, Allocator& a,
                             Device d) { return make_lars({.trust_coefficient = 0.02}, std::move(l), a, d); }})),
    [](const auto& info) { return where_name(std::get<0>(info.param)) + std::get<1>(info.param).name; });

// The engine's gradient norm: the same exact integers as the CPU's in every dtype, specials included, and for an
// empty tensor; on CUDA over 513 chunks, as many blocks of one launch.
class DeviceSquareSum : public ::testing::TestWithParam<Where> {};

TEST_P(DeviceSquareSum, EqualsCpuBitwise) {
  const Where where = GetParam();
  if (where == Where::kCuda) ZERO_SKIP_WITHOUT_GPU();
  const int64_t chunks = where == Where::kCuda ? 513 : 3;
  std::vector<float> values = normal_vector(chunks * SquareBins::kMaxBinnedValues + 77, 9, 1e3f);
  values.back() = std::numeric_limits<float>::denorm_min();
  const int64_t n = static_cast<int64_t>(values.size());
  Allocator allocator;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> bytes(n * dtype_size(t));
    for (int64_t i = 0; i < n; ++i) store_from_float(bytes.data(), t, i, values[i]);
    absl::StatusOr<Buffer> device =
        allocator.allocate(static_cast<int64_t>(bytes.size()), MemoryCategory::kWorkspace, device_of(where, 0));
    ASSERT_TRUE(device.ok()) << device.status();
    ASSERT_TRUE(upload(bytes, 0, device->tensor(DType::kU8, {static_cast<int64_t>(bytes.size())})).ok());
    for (int64_t numel : {n, int64_t{0}}) {
      for (float divisor : {1.0f, 3.0f}) {
        absl::StatusOr<SquareSum> cpu = exact_square_sum(Tensor(bytes.data(), t, {numel}), divisor);
        absl::StatusOr<SquareSum> on_device = exact_square_sum(device->tensor(t, {numel}), divisor);
        ASSERT_TRUE(cpu.ok() && on_device.ok()) << cpu.status() << on_device.status();
        std::vector<int32_t> cpu_wire(SquareSum::kWireInts), device_wire(SquareSum::kWireInts);
        cpu->to_wire(cpu_wire.data());
        on_device->to_wire(device_wire.data());
        EXPECT_EQ(device_wire, cpu_wire) << t << " / " << divisor << ", " << numel << " elements";
      }
    }
    values[n / 2] = std::numeric_limits<float>::infinity();  // the next dtype also checks the flags
  }
}

// Several tensors in one sum, as the engine sums every unit's gradients: the CPU's integers. On CUDA also with reads
// of 2 chunks' bins, so the reads split tensors and join others.
TEST_P(DeviceSquareSum, OverSeveralTensorsEqualsCpuBitwise) {
  const Where where = GetParam();
  if (where == Where::kCuda) ZERO_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<DType, int64_t>> parts = {
      {DType::kBF16, 2 * SquareBins::kMaxBinnedValues + 3}, {DType::kF32, 0}, {DType::kF16, 5}, {DType::kF32, 9000}};
  Allocator allocator;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<Buffer> buffers;
  std::vector<Tensor> on_cpu, on_device;
  for (const auto& [t, numel] : parts) {
    const std::vector<float> values = normal_vector(numel, 30 + static_cast<unsigned>(bytes.size()), 1e2f);
    std::vector<uint8_t>& b = bytes.emplace_back(numel * dtype_size(t));
    for (int64_t i = 0; i < numel; ++i) store_from_float(b.data(), t, i, values[i]);
    absl::StatusOr<Buffer> device =
        allocator.allocate(std::max<int64_t>(b.size(), 1), MemoryCategory::kWorkspace, device_of(where, 0));
    ASSERT_TRUE(device.ok()) << device.status();
    ASSERT_TRUE(upload(b, 0, device->tensor(DType::kU8, {static_cast<int64_t>(b.size())})).ok());
    on_cpu.emplace_back(b.data(), t, Shape{numel});
    on_device.push_back(device->tensor(t, {numel}));
    buffers.push_back(std::move(device).value());
  }
  absl::StatusOr<SquareSum> cpu = exact_square_sum(on_cpu, 3.0f);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<absl::StatusOr<SquareSum>> sums = {exact_square_sum(on_device, 3.0f)};
#if ZERO_HAS_CUDA
  if (where == Where::kCuda) sums.push_back(optim::exact_square_sum_cuda(0, on_device, 3.0f, /*chunks_per_read=*/2));
#endif
  std::vector<int32_t> cpu_wire(SquareSum::kWireInts);
  cpu->to_wire(cpu_wire.data());
  for (const absl::StatusOr<SquareSum>& sum : sums) {
    ASSERT_TRUE(sum.ok()) << sum.status();
    std::vector<int32_t> device_wire(SquareSum::kWireInts);
    sum->to_wire(device_wire.data());
    EXPECT_EQ(device_wire, cpu_wire);
  }
}

INSTANTIATE_TEST_SUITE_P(SimAndCuda, DeviceSquareSum, ::testing::Values(Where::kSim, Where::kCuda),
                         [](const auto& info) { return where_name(info.param); });

}  // namespace
}  // namespace zero
