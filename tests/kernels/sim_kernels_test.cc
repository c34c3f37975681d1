// Every kernel on the simulated device gives the CPU's bits: there it runs the CPU code as a launch that declares
// what it touches (runtime/sim/sim_api.h), so equal inputs must give equal bytes, and the happens-before checker
// sees every access. No GPU needed.
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "runtime/allocator.h"
#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/sim/sim_api.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/runtime/stream_hold.h"

namespace zero::kernels {
namespace {

using testing::cast_inputs;
using testing::random_floats;

constexpr Device kSim = Device::sim(0);

// One argument of a kernel: its bytes on the host, dtype and shape.
struct Arg {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

template <typename T>
Arg arg(const std::vector<T>& values, Shape shape, DType dtype = DTypeOf<T>::value) {
  Arg a{dtype, std::move(shape), std::vector<uint8_t>(values.size() * sizeof(T))};
  std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
  return a;
}
Arg floats(Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return arg(random_floats(shape_numel(shape), seed, lo, hi), shape);
}
// Random values rounded to `half`, as its bits.
Arg halves(DType half, Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  const std::vector<float> v = random_floats(shape_numel(shape), seed, lo, hi);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = testing::round_to(half, v[i]);
  return arg(bits, std::move(shape), half);
}
// Random values in `dtype`: fp32, or rounded to bf16/fp16.
Arg floats_in(DType dtype, Shape shape, uint32_t seed) {
  return dtype == DType::kF32 ? floats(std::move(shape), seed) : halves(dtype, std::move(shape), seed);
}
Arg zeros(Shape shape, DType dtype = DType::kF32) {
  return {dtype, shape, std::vector<uint8_t>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype))};
}

using Kernel = std::function<absl::Status(const std::vector<Tensor>& args)>;

// Calls `kernel` on CPU views of `args`, then on copies of them on sim:0, and expects every argument to end with
// the same bytes on both: what the kernel wrote, and what it only read.
void expect_sim_equals_cpu(const std::vector<Arg>& args, const Kernel& kernel) {
  Allocator allocator;
  std::vector<Buffer> buffers;
  std::vector<Arg> cpu_args = args;
  std::vector<Tensor> cpu, sim;
  for (Arg& a : cpu_args) {
    absl::StatusOr<Buffer> b =
        allocator.allocate(static_cast<int64_t>(a.bytes.size()), MemoryCategory::kWorkspace, kSim);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(copy_bytes(b->data(), kSim, a.bytes.data(), Device::cpu(), a.bytes.size()).ok());
    cpu.emplace_back(a.bytes.data(), a.dtype, a.shape);
    sim.emplace_back(b->data(), a.dtype, a.shape, kSim);
    buffers.push_back(*std::move(b));
  }
  const absl::Status on_cpu = kernel(cpu);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu;
  const absl::Status on_sim = kernel(sim);
  ASSERT_TRUE(on_sim.ok()) << on_sim;
  for (size_t i = 0; i < cpu_args.size(); ++i) {
    std::vector<uint8_t> back(cpu_args[i].bytes.size());
    ASSERT_TRUE(copy_bytes(back.data(), Device::cpu(), sim[i].data(), kSim, back.size()).ok());
    EXPECT_TRUE(back == cpu_args[i].bytes) << "argument " << i << " " << sim[i].to_string() << " differs";
  }
}

TEST(SimKernels, MatmulEqualsCpuBitwise) {
  const int64_t n = 64, c = 96, oc = 80;
  const std::vector<Arg> args = {floats({n, c}, 1), floats({oc, c}, 2), floats({oc}, 3),    floats({n, oc}, 4),
                                 zeros({n, oc}),    zeros({n, c}),      floats({oc, c}, 5), floats({oc}, 6)};
  expect_sim_equals_cpu(args, [](const std::vector<Tensor>& t) {  // inp, weight, bias, dout, out, dinp, dw, db
    absl::Status s = matmul_forward(t[4], t[0], t[1], t[2]);
    s.Update(matmul_backward(t[5], t[6], t[7], t[3], t[0], t[1]));
    return s;
  });
  // The optional bias, dinp and dbias left out.
  expect_sim_equals_cpu(args, [](const std::vector<Tensor>& t) {
    absl::Status s = matmul_forward(t[4], t[0], t[1], Tensor());
    s.Update(matmul_backward(Tensor(), t[6], Tensor(), t[3], t[0], t[1]));
    return s;
  });
}

TEST(SimKernels, MatmulWithGeluFusedEqualsCpuBitwise) {
  const int64_t n = 40, c = 96, oc = 80;
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto values = [&](Shape shape, uint32_t seed) { return floats_in(t, std::move(shape), seed); };
    expect_sim_equals_cpu(
        {values({n, c}, 17), values({oc, c}, 18), values({oc}, 19), values({n, oc}, 20), zeros({n, oc}, t),
         zeros({n, oc}, t), values({n, c}, 21), zeros({n, c}, t), values({oc, c}, 22), values({oc}, 23)},
        [](const std::vector<Tensor>& a) {  // inp, weight, bias, dout, out, pre, inp's pre, dpre,
                                            // dweight, dbias
          absl::Status s = matmul_gelu_forward(a[4], a[5], a[0], a[1], a[2]);
          s.Update(matmul_backward_through_gelu(a[7], a[8], a[9], a[3], a[0], a[6], a[1]));
          return s;
        });
  }
}

TEST(SimKernels, MatmulWithResidualFusedEqualsCpuBitwise) {
  const int64_t n = 40, c = 96, oc = 80;
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto values = [&](Shape shape, uint32_t seed) { return floats_in(t, std::move(shape), seed); };
    expect_sim_equals_cpu(
        {values({n, c}, 24), values({oc, c}, 25), values({oc}, 26), values({n, oc}, 27), zeros({n, oc}, t)},
        [](const std::vector<Tensor>& a) {  // inp, weight, bias, residual, out
          return matmul_residual_forward(a[4], a[0], a[1], a[2], a[3]);
        });
  }
}

TEST(SimKernels, GeluAndResidualEqualCpuBitwise) {
  const int64_t n = 20000;  // more than one block of the CPU loops
  expect_sim_equals_cpu({floats({n}, 7, -5.0f, 5.0f), floats({n}, 8), zeros({n}), zeros({n}), floats({n}, 9)},
                        [](const std::vector<Tensor>& t) {  // x, dout, y, dx, acc
                          absl::Status s = gelu_forward(t[2], t[0]);
                          s.Update(gelu_backward(t[3], t[0], t[1]));
                          s.Update(residual_forward(t[2], t[2], t[1]));
                          s.Update(residual_backward(t[4], t[3]));
                          s.Update(gelu_backward(t[1], t[0], t[1]));  // in place: dinp aliases dout
                          s.Update(gelu_forward(t[0], t[0]));         // in place
                          return s;
                        });
}

// Kernels launch on the calling thread's current stream (runtime/device_api.h): under a StreamScope of a non-blocking
// stream, GELU's input goes up, the kernel runs and its output comes back, all on that stream, while the legacy
// default stream is held. A kernel queued on the legacy stream would never run here, and the copy back would not be
// ordered after it (a checker error).
TEST(SimKernels, KernelsRunOnTheCallingThreadsCurrentStream) {
  sim::SimDevice& sim = sim_device();
  absl::StatusOr<OwnedStream> stream = OwnedStream::create(sim, 0, StreamFlags::kNonBlocking);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const Stream s = stream->get();
  const std::vector<float> x = random_floats(1000, 11, -5.0f, 5.0f);
  const size_t bytes = x.size() * sizeof(float);
  absl::StatusOr<PinnedBuffer> in = PinnedBuffer::allocate(sim, bytes), out = PinnedBuffer::allocate(sim, bytes);
  absl::StatusOr<void*> x_dev = sim.allocate(bytes, s), y_dev = sim.allocate(bytes, s);
  ASSERT_TRUE(in.ok() && out.ok() && x_dev.ok() && y_dev.ok());
  std::memcpy(in->data(), x.data(), bytes);
  zero::testing::StreamHold legacy_held(sim, Stream::legacy(0));  // released also where an assertion returns early
  ASSERT_TRUE(legacy_held.launched().ok()) << legacy_held.launched();
  {
    const StreamScope on_s(kSim, s);
    ASSERT_TRUE(sim.copy_async(*x_dev, in->data(), bytes, s).ok());
    const Shape shape = {static_cast<int64_t>(x.size())};
    ASSERT_TRUE(gelu_forward(Tensor(*y_dev, DType::kF32, shape, kSim), Tensor(*x_dev, DType::kF32, shape, kSim)).ok());
    ASSERT_TRUE(sim.copy_async(out->data(), *y_dev, bytes, s).ok());
    ASSERT_TRUE(sim.synchronize(s).ok());
  }
  legacy_held.release();
  std::vector<float> want(x.size());
  ASSERT_TRUE(gelu_forward(Tensor(want.data(), DType::kF32, {static_cast<int64_t>(x.size())}),
                           Tensor(const_cast<float*>(x.data()), DType::kF32, {static_cast<int64_t>(x.size())}))
                  .ok());
  EXPECT_EQ(std::memcmp(out->data(), want.data(), bytes), 0);
  EXPECT_TRUE(sim.free(*x_dev, s).ok());
  EXPECT_TRUE(sim.free(*y_dev, s).ok());
  EXPECT_TRUE(sim.synchronize(s).ok());
}

TEST(SimKernels, LayerNormEqualsCpuBitwise) {
  const int64_t n = 40, c = 200;
  expect_sim_equals_cpu({floats({n, c}, 9), floats({c}, 10), floats({c}, 11), floats({n, c}, 12), zeros({n, c}),
                         zeros({n}), zeros({n}), zeros({n, c}), floats({c}, 13), floats({c}, 14)},
                        [](const std::vector<Tensor>& t) {  // x, w, b, dout, out, mean, rstd, dx, dw, db
                          absl::Status s = layernorm_forward(t[4], t[5], t[6], t[0], t[1], t[2]);
                          s.Update(layernorm_backward(t[7], t[8], t[9], t[3], t[0], t[1], t[5], t[6]));
                          return s;
                        });
}

TEST(SimKernels, LayerNormWithTheResidualEqualsCpuBitwise) {
  const int64_t n = 40, c = 200;
  expect_sim_equals_cpu(
      {floats({n, c}, 9), floats({c}, 10), floats({c}, 11), floats({n, c}, 12), zeros({n, c}), zeros({n}), zeros({n}),
       zeros({n, c}), floats({c}, 13), floats({c}, 14), floats({n, c}, 15), floats({n, c}, 16)},
      [](const std::vector<Tensor>& t) {  // x, w, b, dout, out, mean, rstd, dx, dw, db, res, dres
        absl::Status s = residual_layernorm_forward(t[4], t[5], t[6], t[0], t[10], t[1], t[2]);
        s.Update(layernorm_backward(t[7], t[8], t[9], t[3], t[0], t[1], t[5], t[6], t[11]));
        return s;
      });
}

// The kernels in the training precision declare their 2-byte tensors' accesses and give the CPU's bits.
TEST(SimKernels, KernelsInHalfEqualCpuBitwise) {
  const int64_t n = 40, c = 200;
  for (const DType h : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(h));
    expect_sim_equals_cpu({halves(h, {n, c}, 7, -5.0f, 5.0f), halves(h, {n, c}, 8), zeros({n, c}, h), zeros({n, c}, h)},
                          [](const std::vector<Tensor>& t) {  // x, dout, y, dx
                            absl::Status s = gelu_forward(t[2], t[0]);
                            s.Update(gelu_backward(t[3], t[0], t[1]));
                            s.Update(residual_forward(t[2], t[2], t[1]));
                            s.Update(residual_backward(t[3], t[2]));
                            return s;
                          });
    expect_sim_equals_cpu({halves(h, {n, c}, 9), halves(h, {c}, 10), halves(h, {c}, 11), halves(h, {n, c}, 12),
                           zeros({n, c}, h), zeros({n}), zeros({n}), zeros({n, c}, h), halves(h, {c}, 13),
                           halves(h, {c}, 14), halves(h, {n, c}, 15), halves(h, {n, c}, 16)},
                          [](const std::vector<Tensor>& t) {  // x, w, b, dout, out, mean, rstd, dx, dw, db, res, dres
                            absl::Status s = residual_layernorm_forward(t[4], t[5], t[6], t[0], t[10], t[1], t[2]);
                            s.Update(layernorm_backward(t[7], t[8], t[9], t[3], t[0], t[1], t[5], t[6], t[11]));
                            return s;
                          });
    const std::vector<int32_t> tokens = {3, 0, 3, 1, 3, 3};
    expect_sim_equals_cpu({arg(tokens, {2, 3}), halves(h, {4, c}, 23), halves(h, {5, c}, 24), zeros({2, 3, c}, h),
                           halves(h, {2, 3, c}, 25), halves(h, {4, c}, 26), halves(h, {5, c}, 27)},
                          [](const std::vector<Tensor>& t) {  // tokens, wte, wpe, out, dout, dwte, dwpe
                            absl::Status s = embedding_forward(t[3], t[0], t[1], t[2]);
                            s.Update(embedding_backward(t[5], t[6], t[4], t[0]));
                            return s;
                          });
    const std::vector<int32_t> targets = {5, kIgnoreIndex, 0, 129, 7, 64};
    expect_sim_equals_cpu({halves(h, {6, 136}, 28, -4.0f, 4.0f), arg(targets, {6})},
                          [](const std::vector<Tensor>& t) {  // logits (their gradient in place), targets
                            return crossentropy_forward_backward(t[0], t[0], t[1], 130).status();
                          });
    expect_sim_equals_cpu({halves(h, {2, 9, 24}, 29), zeros({2, 9, 8}, h), zeros({2, 2, 9}), halves(h, {2, 9, 8}, 30),
                           zeros({2, 9, 24}, h)},
                          [](const std::vector<Tensor>& t) {  // inp, out, lse, dout, dinp; 2 heads of 4
                            absl::Status s = attention_forward(t[1], t[2], t[0], 2);
                            s.Update(attention_backward(t[4], t[3], t[0], t[1], t[2], 2));
                            return s;
                          });
    const int64_t oc = 80;
    expect_sim_equals_cpu({halves(h, {n, c}, 17), halves(h, {oc, c}, 18), halves(h, {oc}, 19), halves(h, {n, oc}, 20),
                           zeros({n, oc}, h), zeros({n, c}, h), halves(h, {oc, c}, 21), floats({oc}, 22)},
                          [](const std::vector<Tensor>& t) {  // inp, weight, bias, dout, out, dinp, dw, db (fp32)
                            absl::Status s = matmul_forward(t[4], t[0], t[1], t[2]);
                            s.Update(matmul_backward(t[5], t[6], t[7], t[3], t[0], t[1]));
                            return s;
                          });
  }
}

TEST(SimKernels, EmbeddingEqualsCpuBitwise) {
  const int64_t b = 3, t = 7, c = 40, vocab = 11, max_t = 9;
  std::vector<int32_t> tokens(b * t);
  for (int64_t i = 0; i < b * t; ++i) tokens[i] = static_cast<int32_t>((i * 5) % 4 + (i % 3 == 0 ? 7 : 0));  // repeats
  expect_sim_equals_cpu({arg(tokens, {b, t}), floats({vocab, c}, 15), floats({max_t, c}, 16), floats({b, t, c}, 17),
                         zeros({b, t, c}), floats({vocab, c}, 18), floats({max_t, c}, 19)},
                        [](const std::vector<Tensor>& a) {  // tokens, wte, wpe, dout, out, dwte, dwpe
                          absl::Status s = embedding_forward(a[4], a[0], a[1], a[2]);
                          s.Update(embedding_backward(a[5], a[6], a[3], a[0]));
                          return s;
                        });
}

TEST(SimKernels, CrossEntropyEqualsCpuBitwise) {
  const int64_t n = 16, padded = 136, vocab = 130;
  std::vector<int32_t> targets(n);
  for (int64_t r = 0; r < n; ++r) targets[r] = r % 5 == 0 ? kIgnoreIndex : static_cast<int32_t>((r * 37) % vocab);
  std::vector<CrossEntropyResult> results;  // the CPU's, then the simulated device's, of each call
  expect_sim_equals_cpu({floats({n, padded}, 20, -4.0f, 4.0f), arg(targets, {n}), zeros({n, padded})},
                        [&](const std::vector<Tensor>& t) -> absl::Status {  // logits, targets, dlogits
                          absl::StatusOr<CrossEntropyResult> r = crossentropy_forward_backward(t[2], t[0], t[1], vocab);
                          if (!r.ok()) return r.status();
                          results.push_back(*r);
                          r = crossentropy_forward_backward(t[0], t[0], t[1], vocab);  // in place
                          if (r.ok()) results.push_back(*r);
                          return r.status();
                        });
  ASSERT_EQ(results.size(), 4u);
  for (int call = 0; call < 2; ++call) {
    const CrossEntropyResult& cpu = results[call];
    const CrossEntropyResult& sim = results[2 + call];
    EXPECT_EQ(float_bits(sim.loss), float_bits(cpu.loss)) << sim.loss << " vs " << cpu.loss;
    EXPECT_EQ(sim.counted, cpu.counted);
    EXPECT_EQ(sim.correct, cpu.correct);
  }
}

TEST(SimKernels, AttentionEqualsCpuBitwise) {
  // hs above the CUDA kernels' kMaxHeadDim: the simulated device takes what the CPU takes.
  for (const int64_t hs : {40, 300}) {
    const int64_t b = 2, t = 17, nh = 3, c = nh * hs;
    expect_sim_equals_cpu(
        {floats({b, t, 3 * c}, 21), floats({b, t, c}, 22), zeros({b, t, c}), zeros({b, nh, t}), zeros({b, t, 3 * c})},
        [&](const std::vector<Tensor>& a) {  // inp, dout, out, lse, dinp
          absl::Status s = attention_forward(a[2], a[3], a[0], nh);
          s.Update(attention_backward(a[4], a[1], a[0], a[2], a[3], nh));
          return s;
        });
  }
}

TEST(SimKernels, CastsEqualCpuBitwise) {
  const std::vector<float> x = cast_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  for (DType half : {DType::kBF16, DType::kF16}) {
    for (bool stochastic : {false, true}) {
      expect_sim_equals_cpu({arg(x, {n}), zeros({n}, half), zeros({n}), zeros({n})},
                            [stochastic](const std::vector<Tensor>& t) {  // x, half, back, copy
                              // A temporary: the launch keeps its own copy of the rounding's seed, step and offset.
                              const StochasticRounding sr{.seed = 99, .step = 3, .index_offset = 1000};
                              absl::Status s = cast(t[1], t[0], stochastic ? &sr : nullptr);
                              s.Update(cast(t[2], t[1]));  // back to fp32
                              s.Update(cast(t[3], t[2]));  // equal dtypes: a copy
                              return s;
                            });
    }
  }
}

TEST(SimKernels, BufferMathEqualsCpuBitwise) {
  const std::vector<float> a = cast_inputs();
  const int64_t n = static_cast<int64_t>(a.size());
  const std::vector<float> b = random_floats(n, 26, -70000.0f, 70000.0f);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> x(n * dtype_size(t)), y(n * dtype_size(t));
    for (int64_t i = 0; i < n; ++i) {
      store_from_float(x.data(), t, i, a[i]);
      store_from_float(y.data(), t, i, b[i]);
    }
    expect_sim_equals_cpu({arg(x, {n}, t), arg(y, {n}, t), arg(x, {n}, t)}, [](const std::vector<Tensor>& v) {
      absl::Status s = add_into(v[0], v[1]);
      s.Update(divide_by(v[0], 3.0f));
      s.Update(fill_zero(v[2]));
      return s;
    });
  }
}

TEST(SimKernels, Int32OnHostCopiesFromTheDevice) {
  const std::vector<int32_t> values = {3, -1, 7, 42, 0};
  expect_sim_equals_cpu({arg(values, {5})}, [&](const std::vector<Tensor>& t) -> absl::Status {
    std::vector<int32_t> copy;
    absl::StatusOr<const int32_t*> host = int32_on_host(t[0], Tensor(), copy);
    if (!host.ok()) return host.status();
    EXPECT_EQ(std::vector<int32_t>(*host, *host + values.size()), values) << t[0].to_string();
    return absl::OkStatus();
  });
}

// The sums left in a slot on the device (as the engine's training steps do) are the CPU's bytes, and the call does
// not wait for the device.
TEST(SimKernels, CrossEntropyIntoASlotLeavesTheCpusSumsWithoutWaiting) {
  const int64_t n = 16, padded = 136, vocab = 130;
  std::vector<int32_t> targets(n);
  for (int64_t r = 0; r < n; ++r) targets[r] = r % 5 == 0 ? kIgnoreIndex : static_cast<int32_t>((r * 29) % vocab);
  std::vector<int64_t> counted;
  expect_sim_equals_cpu({floats({n, padded}, 21, -4.0f, 4.0f), arg(targets, {n}), zeros({n, padded}),
                         zeros({sizeof(LossSums)}, DType::kU8)},
                        [&](const std::vector<Tensor>& t) -> absl::Status {  // logits, targets, dlogits, sums
                          const Tensor host_targets(targets.data(), DType::kI32, {n});
                          const uint64_t before = sim_device().host_synchronizations();
                          absl::StatusOr<int64_t> c =
                              crossentropy_forward_backward_into(t[3], t[2], t[0], t[1], vocab, host_targets);
                          EXPECT_EQ(sim_device().host_synchronizations(), before) << t[0].to_string();
                          if (c.ok()) counted.push_back(*c);
                          return c.status();
                        });
  EXPECT_EQ(counted, std::vector<int64_t>(2, 12));
  // On the CPU the slot holds what the reading call returns.
  const std::vector<float> logits = random_floats(n * padded, 21, -4.0f, 4.0f);
  std::vector<float> scratch(n * padded), dlogits(n * padded);
  LossSums sums;
  absl::StatusOr<int64_t> c = crossentropy_forward_backward_into(
      Tensor(&sums, DType::kU8, {sizeof(LossSums)}), Tensor(scratch.data(), DType::kF32, {n, padded}),
      Tensor(const_cast<float*>(logits.data()), DType::kF32, {n, padded}), Tensor(targets.data(), DType::kI32, {n}),
      vocab);
  absl::StatusOr<CrossEntropyResult> read =
      crossentropy_forward_backward(Tensor(dlogits.data(), DType::kF32, {n, padded}),
                                    Tensor(const_cast<float*>(logits.data()), DType::kF32, {n, padded}),
                                    Tensor(targets.data(), DType::kI32, {n}), vocab);
  ASSERT_TRUE(c.ok() && read.ok()) << c.status() << read.status();
  const CrossEntropyResult from_slot = loss_of(sums, *c);
  EXPECT_EQ(float_bits(from_slot.loss), float_bits(read->loss));
  EXPECT_EQ(from_slot.correct, read->correct);
  EXPECT_EQ(from_slot.counted, read->counted);
  EXPECT_GT(read->loss, 0.0f);
  EXPECT_EQ(dlogits, scratch);
  alignas(LossSums) unsigned char raw[2 * sizeof(LossSums)];
  const absl::Status misaligned =
      crossentropy_forward_backward_into(Tensor(raw + 4, DType::kU8, {sizeof(LossSums)}),
                                         Tensor(scratch.data(), DType::kF32, {n, padded}),
                                         Tensor(const_cast<float*>(logits.data()), DType::kF32, {n, padded}),
                                         Tensor(targets.data(), DType::kI32, {n}), vocab)
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(misaligned) && absl::StrContains(misaligned.message(), "8-byte aligned"))
      << misaligned;
}

// With the values' host copy (Batch::host_inputs) the host reads that copy and never waits for the device; a copy of
// another size is refused naming both.
TEST(SimKernels, Int32OnHostReadsTheCallersHostCopyWithoutWaiting) {
  Allocator allocator;
  absl::StatusOr<Buffer> buffer = allocator.allocate(5 * 4, MemoryCategory::kWorkspace, kSim);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<int32_t> values = {3, -1, 7, 42, 0};
  const Tensor on_device = buffer->tensor(DType::kI32, {5});
  std::vector<int32_t> copy;
  const uint64_t before = sim_device().host_synchronizations();
  absl::StatusOr<const int32_t*> host = int32_on_host(on_device, Tensor(values.data(), DType::kI32, {5}), copy);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(*host, values.data());
  EXPECT_EQ(sim_device().host_synchronizations(), before);
  EXPECT_TRUE(copy.empty());
  EXPECT_EQ(int32_on_host(on_device, Tensor(values.data(), DType::kI32, {4}), copy).status(),
            absl::InvalidArgumentError("the host copy Tensor(int32(4) on cpu) of Tensor(int32(5) on sim:0) must be a "
                                       "contiguous int32 CPU tensor of as many elements"));
}

// The checks run on the host before any launch, as the CPU's: what the CPU refuses is refused with its error, and
// a refused call leaves the device usable (a failed launch would be sticky).
TEST(SimKernels, ArgumentsAreCheckedOnTheHostAsTheCpuChecksThem) {
  Allocator allocator;
  absl::StatusOr<Buffer> buffer = allocator.allocate(64 * 4, MemoryCategory::kWorkspace, kSim);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  // Half operands and a result in the other half dtype.
  const Tensor bf16 = buffer->tensor(DType::kBF16, {2, 2});
  absl::Status s = matmul_forward(buffer->tensor(DType::kF16, {2, 2}), bf16, bf16, Tensor());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("fp32 or bf16"), absl::string_view::npos) << s;
  // Tokens and targets are read back and checked on the host.
  const std::vector<int32_t> bad = {0, 99};
  const Tensor ids = buffer->tensor(DType::kI32, {1, 2});
  ASSERT_TRUE(copy_bytes(ids.data(), kSim, bad.data(), Device::cpu(), 8).ok());
  const Tensor table = buffer->tensor(DType::kF32, {4, 2}), rows = buffer->tensor(DType::kF32, {1, 2, 2});
  s = embedding_forward(Tensor(static_cast<float*>(buffer->data()) + 8, DType::kF32, {1, 2, 2}, kSim), ids, table,
                        table);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("token 99"), absl::string_view::npos) << s;
  const Tensor logits(static_cast<float*>(buffer->data()) + 16, DType::kF32, {2, 8}, kSim);
  EXPECT_EQ(crossentropy_forward_backward(logits, logits, ids.flat(), 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Arguments on two devices.
  std::vector<float> host(4);
  s = gelu_forward(Tensor(host.data(), DType::kF32, {4}), Tensor(buffer->data(), DType::kF32, {4}, kSim));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The device still runs kernels.
  EXPECT_TRUE(fill_zero(rows).ok());
  EXPECT_TRUE(synchronize(kSim).ok());
}

// Empty tensors (no rows; no memory behind them) run as on the CPU.
TEST(SimKernels, EmptyTensors) {
  const int64_t padded = 8;
  expect_sim_equals_cpu({zeros({0, padded}), zeros({0}, DType::kI32), zeros({0, padded})},
                        [](const std::vector<Tensor>& t) -> absl::Status {
                          absl::StatusOr<CrossEntropyResult> r = crossentropy_forward_backward(t[2], t[0], t[1], 5);
                          if (r.ok()) {
                            EXPECT_EQ(r->counted, 0);
                          }
                          absl::Status s = r.status();
                          s.Update(gelu_forward(t[2], t[0]));
                          s.Update(fill_zero(t[2]));
                          return s;
                        });
}

}  // namespace
}  // namespace zero::kernels
