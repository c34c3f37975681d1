#include "optim/square_sum.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"

namespace zero {
namespace {

SquareSum sum_of(const std::vector<float>& v, size_t begin, size_t end) {
  SquareSum s;
  SquareBins bins;
  for (size_t i = begin; i < end; ++i) bins.add(v[i]);
  s.add(bins);
  return s;
}

TEST(SquareSum, IsExactForRepresentableSums) {
  EXPECT_EQ(sum_of({3.0f, -4.0f}, 0, 2).value(), 25.0);
  std::vector<float> many(SquareBins::kMaxBinnedValues, 1.5f);
  EXPECT_EQ(sum_of(many, 0, many.size()).value(), 2.25 * SquareBins::kMaxBinnedValues);
}

TEST(SquareSum, KeepsTheSmallestSubnormalSquare) {
  EXPECT_EQ(sum_of({std::numeric_limits<float>::denorm_min()}, 0, 1).value(), std::ldexp(1.0, -298));
}

TEST(SquareSum, LargestFloatsDoNotOverflow) {
  const float big = std::numeric_limits<float>::max();
  const double want = 4.0 * static_cast<double>(big) * static_cast<double>(big);
  EXPECT_EQ(sum_of({big, -big, big, big}, 0, 4).value(), want);
}

TEST(SquareSum, NanAndInfinityPropagate) {
  EXPECT_TRUE(std::isnan(sum_of({1.0f, NAN, INFINITY}, 0, 3).value()));
  EXPECT_EQ(sum_of({1.0f, INFINITY}, 0, 2).value(), INFINITY);
}

// The property LAMB/LARS rely on: a parameter split across three ranks at arbitrary points, summed per
// rank and combined by the int32 allreduce, gives bitwise the unsharded sum, although a naive fp32 sum
// of the same values depends on the split.
TEST(SquareSum, SplitAcrossThreeRanksEqualsUnshardedBitwise) {
  std::mt19937 gen(3);
  std::lognormal_distribution<float> dist(0.0f, 8.0f);  // magnitudes spread over ~2^±30
  std::vector<float> v(30001);
  for (float& x : v) x = dist(gen);
  const double unsharded = sum_of(v, 0, v.size()).value();
  const size_t cuts[4] = {0, 7777, 20000, v.size()};
  std::vector<double> got(3);
  std::vector<absl::Status> st = run_local_ranks(3, [&](Communicator& comm) -> absl::Status {
    std::vector<int32_t> wire(SquareSum::kWireInts);
    sum_of(v, cuts[comm.rank()], cuts[comm.rank() + 1]).to_wire(wire.data());
    Tensor t(wire.data(), DType::kI32, {SquareSum::kWireInts});
    ZERO_RETURN_IF_ERROR(comm.allreduce(t, ReduceOp::kSum).wait());
    got[comm.rank()] = SquareSum::from_wire(wire.data()).value();
    return absl::OkStatus();
  });
  ASSERT_TRUE(root_cause(st).ok()) << root_cause(st);
  for (double g : got) EXPECT_EQ(g, unsharded);

  float whole = 0.0f, parts[3] = {0.0f, 0.0f, 0.0f};  // the naive way, for contrast
  for (float x : v) whole += x * x;
  for (int r = 0; r < 3; ++r) {
    for (size_t i = cuts[r]; i < cuts[r + 1]; ++i) parts[r] += v[i] * v[i];
  }
  EXPECT_NE(parts[0] + parts[1] + parts[2], whole) << "the data should make naive partial sums split-dependent";
}

// The engine's former loop: chunks of kMaxBinnedValues, each element widened to fp32 and divided.
SquareSum engine_loop_sum(const std::vector<unsigned char>& bytes, DType t, float divisor) {
  const int64_t n = static_cast<int64_t>(bytes.size() / dtype_size(t));
  SquareSum sum;
  for (int64_t c = 0; c < n; c += SquareBins::kMaxBinnedValues) {
    SquareBins bins;
    for (int64_t k = c; k < std::min(n, c + SquareBins::kMaxBinnedValues); ++k) {
      bins.add(load_as_float(bytes.data(), t, k) / divisor);
    }
    sum.add(bins);
  }
  return sum;
}

std::vector<int32_t> wire_of(const SquareSum& s) {
  std::vector<int32_t> wire(SquareSum::kWireInts);
  s.to_wire(wire.data());
  return wire;
}

// Lognormal magnitudes over ~2^±30 with random signs, in `t`, over three and a bit chunks.
std::vector<unsigned char> gradient_bytes(DType t, unsigned seed) {
  std::mt19937 gen(seed);
  std::lognormal_distribution<float> dist(0.0f, 8.0f);
  const int64_t n = 3 * SquareBins::kMaxBinnedValues + 123;
  std::vector<unsigned char> bytes(n * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) store_from_float(bytes.data(), t, i, (gen() & 1 ? 1.0f : -1.0f) * dist(gen));
  return bytes;
}

TEST(ExactSquareSum, EqualsTheChunkedSquareBinsOfEveryDtype) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<unsigned char> bytes = gradient_bytes(t, 11);
    const int64_t n = static_cast<int64_t>(bytes.size() / dtype_size(t));
    for (float divisor : {1.0f, 3.0f, 65536.0f}) {
      absl::StatusOr<SquareSum> got = exact_square_sum(Tensor(bytes.data(), t, {n}), divisor);
      ASSERT_TRUE(got.ok()) << got.status();
      const SquareSum want = engine_loop_sum(bytes, t, divisor);
      EXPECT_EQ(wire_of(*got), wire_of(want)) << t << " / " << divisor;
      EXPECT_EQ(got->value(), want.value()) << t << " / " << divisor;
    }
  }
}

// One sum over tensors of several dtypes (how the engine sums every unit's gradients): the merge of each one's.
TEST(ExactSquareSum, OverSeveralTensorsIsTheMergeOfEachOnesSum) {
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<Tensor> tensors;
  SquareSum want;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    bytes.push_back(gradient_bytes(t, 20 + static_cast<unsigned>(t)));
    tensors.emplace_back(bytes.back().data(), t, Shape{static_cast<int64_t>(bytes.back().size() / dtype_size(t))});
    want.merge(*exact_square_sum(tensors.back(), 3.0f));
  }
  tensors.emplace_back(nullptr, DType::kF32, Shape{0});
  absl::StatusOr<SquareSum> got = exact_square_sum(tensors, 3.0f);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(wire_of(*got), wire_of(want));
  EXPECT_EQ(exact_square_sum(std::span<const Tensor>(), 1.0f)->value(), 0.0);
}

TEST(ExactSquareSum, TensorsOnDifferentDevicesAreRefusedNamingBoth) {
  std::vector<float> x(4, 1.0f);
  const std::vector<Tensor> tensors = {Tensor(x.data(), DType::kF32, {4}),
                                       Tensor(x.data(), DType::kF32, {4}, Device::sim(0))};
  EXPECT_EQ(
      exact_square_sum(tensors, 1.0f).status(),
      absl::InvalidArgumentError("exact_square_sum: the tensors are on cpu and sim:0; sum each device's on its own"));
}

TEST(ExactSquareSum, NanAndInfinityPropagate) {
  std::vector<float> x(3 * SquareBins::kMaxBinnedValues, 1.0f);
  const Tensor t(x.data(), DType::kF32, {static_cast<int64_t>(x.size())});
  x[2 * SquareBins::kMaxBinnedValues + 5] = INFINITY;
  EXPECT_EQ(exact_square_sum(t, 2.0f)->value(), INFINITY);
  x[7] = NAN;
  EXPECT_TRUE(std::isnan(exact_square_sum(t, 2.0f)->value()));
  EXPECT_EQ(exact_square_sum(Tensor(x.data(), DType::kF32, {4}), 0.0f)->value(), INFINITY) << "1 / 0";
}

TEST(ExactSquareSum, EmptyTensorSumsToZero) {
  EXPECT_EQ(exact_square_sum(Tensor(nullptr, DType::kBF16, {0}), 1.0f)->value(), 0.0);
}

TEST(ExactSquareSum, NonFloatingOrStridedTensorsAreRefused) {
  std::vector<int32_t> ints(4);
  EXPECT_EQ(exact_square_sum(Tensor(ints.data(), DType::kI32, {4}), 1.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> x(8);
  EXPECT_EQ(exact_square_sum(Tensor(x.data(), DType::kF32, {4}, {2}, Device::cpu()), 1.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero
