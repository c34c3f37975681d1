// Kernel throughput beside a baseline from the same run: matmul GFLOP/s vs one raw cblas_sgemm call of the
// same shape (OpenBLAS threading itself over the same threads), elementwise GB/s vs a parallel memcpy of
// the same bytes, attention GFLOP/s vs the raw sgemm rate. Usage: kernels_bench [--benchmark_* flags].
#include <cblas.h>
#include <omp.h>

#include <cstring>
#include <deque>
#include <memory>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/kernels.h"

namespace zero::kernels {
namespace {

std::vector<float> filled(int64_t n, float v = 0.5f) { return std::vector<float>(static_cast<size_t>(n), v); }
Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::kF32, std::move(s)); }

void check(const absl::Status& s) {
  if (!s.ok()) std::fprintf(stderr, "kernels_bench: %s\n", std::string(s.message()).c_str()), std::abort();
}

// One measured case: what it does per iteration and how much (GFLOP or GB) that is.
struct Case {
  std::string name;
  std::string unit;  // "GFLOP/s" or "GB/s"
  double amount;     // GFLOP or GB per iteration
  std::function<void()> zero;
  std::function<void()> baseline;  // empty: the baseline of case `baseline_of` is used
  std::string baseline_name;
  std::string baseline_of;
};

void register_case(const Case& c, const std::string& side, const std::function<void()>& fn) {
  const double amount = c.amount;
  benchmark::RegisterBenchmark((c.name + "/" + side).c_str(), [fn, amount](benchmark::State& state) {
    for (auto _ : state) fn();
    state.counters["rate"] = benchmark::Counter(amount, benchmark::Counter::kIsIterationInvariantRate);
  })->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

// Raw OpenBLAS on `threads` of its own threads; zero's kernels set it back to one.
void raw_sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
               float* c, int ldc) {
  openblas_set_num_threads(kernel_threads());
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b,
              ldb, beta, c, ldc);
  openblas_set_num_threads(1);
}

// memcpy of bytes/2 split over this thread's OpenMP team: `bytes` read plus written.
std::function<void()> parallel_memcpy(double bytes) {
  const int64_t n = static_cast<int64_t>(bytes / 2);
  auto src = std::make_shared<std::vector<char>>(n, 1), dst = std::make_shared<std::vector<char>>(n, 0);
  return [src, dst, n] {
    const int threads = omp_get_max_threads();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; ++t) {
      const int64_t b = n * t / threads, e = n * (t + 1) / threads;
      std::memcpy(dst->data() + b, src->data() + b, e - b);
    }
  };
}

struct Buffers {  // keeps every case's data alive, at stable addresses, for the whole run
  std::deque<std::vector<float>> f;
  std::deque<std::vector<uint16_t>> h;
  std::deque<std::vector<int32_t>> i;
  std::vector<float>& add(int64_t n, float v = 0.5f) { return f.emplace_back(filled(n, v)); }
};

void matmul_cases(std::vector<Case>& cases, Buffers& buf, int64_t n, int64_t c, int64_t oc) {
  auto &inp = buf.add(n * c), &w = buf.add(oc * c, 0.01f), &b = buf.add(oc), &out = buf.add(n * oc);
  auto &dout = buf.add(n * oc), &dinp = buf.add(n * c), &dw = buf.add(oc * c), &db = buf.add(oc);
  const std::string shape = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(oc);
  const double gflop = 2.0 * n * c * oc / 1e9;
  const int N = static_cast<int>(n), C = static_cast<int>(c), OC = static_cast<int>(oc);
  cases.push_back({"matmul_forward_" + shape, "GFLOP/s", gflop,
                   [&, n, c, oc] { check(matmul_forward(f32(out, {n, oc}), f32(inp, {n, c}), f32(w, {oc, c}), f32(b, {oc}))); },
                   [&, N, C, OC] { raw_sgemm(false, true, N, OC, C, inp.data(), C, w.data(), C, 0.0f, out.data(), OC); },
                   "cblas_sgemm"});
  cases.push_back({"matmul_backward_" + shape, "GFLOP/s", 2 * gflop,
                   [&, n, c, oc] {
                     check(matmul_backward(f32(dinp, {n, c}), f32(dw, {oc, c}), f32(db, {oc}), f32(dout, {n, oc}),
                                           f32(inp, {n, c}), f32(w, {oc, c})));
                   },
                   [&, N, C, OC] {
                     raw_sgemm(false, false, N, C, OC, dout.data(), OC, w.data(), C, 0.0f, dinp.data(), C);
                     raw_sgemm(true, false, OC, C, N, dout.data(), OC, inp.data(), C, 1.0f, dw.data(), C);
                   },
                   "2 x cblas_sgemm"});
}

void elementwise_cases(std::vector<Case>& cases, Buffers& buf) {
  constexpr int64_t n = 1024 * 3072;  // B*T = 1024 rows of GPT-2 small's MLP width
  auto &x = buf.add(n), &y = buf.add(n), &g = buf.add(n);
  auto& h = buf.h.emplace_back(n);
  auto add = [&](std::string name, double bytes_per_elem, std::function<void()> fn) {
    const double gb = bytes_per_elem * n / 1e9;
    cases.push_back({std::move(name), "GB/s", gb, std::move(fn), parallel_memcpy(gb * 1e9), "memcpy"});
  };
  add("gelu_forward", 8, [&] { check(gelu_forward(f32(y, {n}), f32(x, {n}))); });
  add("gelu_backward", 12, [&] { check(gelu_backward(f32(y, {n}), f32(x, {n}), f32(g, {n}))); });
  add("residual_forward", 12, [&] { check(residual_forward(f32(y, {n}), f32(x, {n}), f32(g, {n}))); });
  add("residual_backward", 12, [&] { check(residual_backward(f32(y, {n}), f32(g, {n}))); });
  add("cast_fp32_bf16", 6, [&] { check(cast(Tensor(h.data(), DType::kBF16, {n}), f32(x, {n}))); });
  static const StochasticRounding sr{.seed = 1};
  add("cast_fp32_bf16_stochastic", 6, [&] { check(cast(Tensor(h.data(), DType::kBF16, {n}), f32(x, {n}), &sr)); });
  add("squared_norm", 4, [&] { benchmark::DoNotOptimize(squared_norm(f32(x, {n}))); });

  constexpr int64_t rows = 4096, c = 768;  // layernorm: B*T = 4096 rows of C = 768
  auto &lx = buf.add(rows * c), &ly = buf.add(rows * c), &ld = buf.add(rows * c), &lw = buf.add(c), &lb = buf.add(c);
  auto &mean = buf.add(rows), &rstd = buf.add(rows), &dw = buf.add(c), &db = buf.add(c);
  const double lgb = rows * c / 1e9;
  cases.push_back({"layernorm_forward", "GB/s", 8 * lgb,
                   [&] { check(layernorm_forward(f32(ly, {rows, c}), f32(mean, {rows}), f32(rstd, {rows}),
                                                 f32(lx, {rows, c}), f32(lw, {c}), f32(lb, {c}))); },
                   parallel_memcpy(8 * lgb * 1e9), "memcpy"});
  cases.push_back({"layernorm_backward", "GB/s", 12 * lgb,
                   [&] { check(layernorm_backward(f32(ly, {rows, c}), f32(dw, {c}), f32(db, {c}), f32(ld, {rows, c}),
                                                  f32(lx, {rows, c}), f32(lw, {c}), f32(mean, {rows}),
                                                  f32(rstd, {rows}))); },
                   parallel_memcpy(12 * lgb * 1e9), "memcpy"});

  constexpr int64_t ce_rows = 256, vp = 50304, vocab = 50257;  // GPT-2's padded vocab
  auto &logits = buf.add(ce_rows * vp, 0.1f), &dlogits = buf.add(ce_rows * vp);
  auto& targets = buf.i.emplace_back(ce_rows, 7);
  cases.push_back({"crossentropy", "GB/s", 8.0 * ce_rows * vp / 1e9,
                   [&] { benchmark::DoNotOptimize(crossentropy_forward_backward(
                             f32(dlogits, {ce_rows, vp}), f32(logits, {ce_rows, vp}),
                             Tensor(targets.data(), DType::kI32, {ce_rows}), vocab)); },
                   parallel_memcpy(8.0 * ce_rows * vp), "memcpy"});
}

void attention_cases(std::vector<Case>& cases, Buffers& buf, const std::string& gemm_case) {
  constexpr int64_t b = 4, t = 256, nh = 12, c = 768;
  auto &inp = buf.add(b * t * 3 * c, 0.01f), &out = buf.add(b * t * c), &lse = buf.add(b * nh * t);
  auto &dout = buf.add(b * t * c), &dinp = buf.add(b * t * 3 * c);
  // Causal: T(T+1)/2 scores per head; QK^T and PV take 2 flops per score and head-dim element each.
  const double gflop = 2.0 * 2.0 * b * nh * (t * (t + 1) / 2.0) * (c / nh) / 1e9;
  cases.push_back({"attention_forward", "GFLOP/s", gflop,
                   [&] { check(attention_forward(f32(out, {b, t, c}), f32(lse, {b, nh, t}), f32(inp, {b, t, 3 * c}), nh)); },
                   {}, "cblas_sgemm (1st matmul)", gemm_case});
  cases.push_back({"attention_backward", "GFLOP/s", 2.5 * gflop,  // QK^T again, dP, dV, dQ, dK: 5 products
                   [&] { check(attention_backward(f32(dinp, {b, t, 3 * c}), f32(dout, {b, t, c}), f32(inp, {b, t, 3 * c}),
                                                  f32(out, {b, t, c}), f32(lse, {b, nh, t}), nh)); },
                   {}, "cblas_sgemm (1st matmul)", gemm_case});
}

// Collects each run's rate by name, then prints zero beside its baseline.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) rates_[r.run_name.function_name] = r.counters.at("rate");
    ConsoleReporter::ReportRuns(runs);
  }
  double rate(const std::string& name) const { return rates_.count(name) ? rates_.at(name) : 0; }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace
}  // namespace zero::kernels

int main(int argc, char** argv) {
  using namespace zero::kernels;
  benchmark::Initialize(&argc, argv);
  zero::kernels::set_kernel_threads(omp_get_max_threads());
  Buffers buf;
  std::vector<Case> cases;
  matmul_cases(cases, buf, 1024, 768, 3072);
  matmul_cases(cases, buf, 1024, 3072, 768);
  elementwise_cases(cases, buf);
  attention_cases(cases, buf, cases[0].name);
  for (const Case& c : cases) {
    register_case(c, "zero", c.zero);
    if (c.baseline) register_case(c, "baseline", c.baseline);
  }
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%d kernel threads; zero beside its baseline from this run\n", kernel_threads());
  std::printf("%-40s %12s %12s %-22s %7s\n", "case", "zero", "baseline", "baseline is", "ratio");
  for (const Case& c : cases) {
    const double z = reporter.rate(c.name + "/zero");
    const double b = reporter.rate((c.baseline ? c.name : c.baseline_of) + "/baseline");
    if (z == 0) continue;
    std::printf("%-40s %8.2f %-3s %8.2f %-3s %-22s %7.3f\n", c.name.c_str(), z, c.unit == "GB/s" ? "GB" : "GF", b,
                c.unit == "GB/s" ? "GB" : "GF", c.baseline_name.c_str(), b > 0 ? z / b : 0.0);
  }
  benchmark::Shutdown();
  return 0;
}
