#include "examples/bench/kernels_bench.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "examples/bench/bench_common.h"
#include "examples/common/result_table.h"
#include "kernels/kernels.h"
#include "runtime/cpu_threads.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, kernels, "all",
          "kernels: comma-separated kernels to measure (matmul_forward, gelu_forward, ...; an unknown name "
          "lists them all), or `all`");
ABSL_FLAG(int64_t, tokens, 1024,
          "kernels: B*T rows the shapes derive from (>= 1): matmuls are tokens x 768 x 3072 and back, "
          "elementwise ops tokens x 3072, layernorm 4*tokens x 768, cross-entropy tokens/4 rows of GPT-2's vocab, "
          "attention 4 sequences of tokens/4");

namespace zero {
namespace {

// One measured kernel: what a call does and how much (GFLOP or GB) that is, and the same for its baseline.
struct Case {
  std::string kernel;
  std::string shape;
  std::string unit;  // "GFLOP/s" or "GB/s"
  double amount = 0;
  std::function<absl::Status()> run;
  std::string baseline_name;
  double baseline_amount = 0;
  std::function<void()> baseline;
};

constexpr const char* kKernels[] = {
    "matmul_forward",    "matmul_backward",    "gelu_forward",   "gelu_backward",
    "residual_forward",  "residual_backward",  "cast_fp32_bf16", "cast_fp32_bf16_stochastic",
    "layernorm_forward", "layernorm_backward", "crossentropy",   "attention_forward",
    "attention_backward"};

struct Buffers {  // keeps every case's data alive, at stable addresses, for the whole run
  std::deque<std::vector<float>> f;
  std::deque<std::vector<uint16_t>> h;
  std::deque<std::vector<int32_t>> i;
  std::vector<float>& add(int64_t n, float v = 0.5f) { return f.emplace_back(static_cast<size_t>(n), v); }
};

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::kF32, std::move(s)); }

std::string shape_name(std::initializer_list<int64_t> dims) { return absl::StrJoin(dims, "x"); }

// Raw OpenBLAS on cpu_threads() of its own threads; zero's kernels set it back to one.
void raw_sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
               float* c, int ldc) {
  openblas_set_num_threads(cpu_threads());
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b,
              ldb, beta, c, ldc);
  openblas_set_num_threads(1);
}

// memcpy of bytes/2 split over the OpenMP team: `bytes` read plus written.
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

// A memory-bound case: `gb` read plus written per call, beside a parallel memcpy of as many bytes.
Case bandwidth_case(std::string kernel, std::string shape, double gb, std::function<absl::Status()> run) {
  return {std::move(kernel), std::move(shape), "GB/s", gb, std::move(run), "memcpy", gb, parallel_memcpy(gb * 1e9)};
}

void matmul_cases(std::vector<Case>& cases, Buffers& buf, int64_t n, int64_t c, int64_t oc) {
  auto &inp = buf.add(n * c), &w = buf.add(oc * c, 0.01f), &b = buf.add(oc), &out = buf.add(n * oc);
  auto &dout = buf.add(n * oc), &dinp = buf.add(n * c), &dw = buf.add(oc * c), &db = buf.add(oc);
  const std::string shape = shape_name({n, c, oc});
  const double gflop = 2.0 * n * c * oc / 1e9;
  const int N = static_cast<int>(n), C = static_cast<int>(c), OC = static_cast<int>(oc);
  cases.push_back(
      {"matmul_forward", shape, "GFLOP/s", gflop,
       [&, n, c, oc] {
         return kernels::matmul_forward(f32(out, {n, oc}), f32(inp, {n, c}), f32(w, {oc, c}), f32(b, {oc}));
       },
       "cblas_sgemm", gflop,
       [&, N, C, OC] { raw_sgemm(false, true, N, OC, C, inp.data(), C, w.data(), C, 0.0f, out.data(), OC); }});
  cases.push_back({"matmul_backward", shape, "GFLOP/s", 2 * gflop,
                   [&, n, c, oc] {
                     return kernels::matmul_backward(f32(dinp, {n, c}), f32(dw, {oc, c}), f32(db, {oc}),
                                                     f32(dout, {n, oc}), f32(inp, {n, c}), f32(w, {oc, c}));
                   },
                   "2xcblas_sgemm", 2 * gflop,
                   [&, N, C, OC] {
                     raw_sgemm(false, false, N, C, OC, dout.data(), OC, w.data(), C, 0.0f, dinp.data(), C);
                     raw_sgemm(true, false, OC, C, N, dout.data(), OC, inp.data(), C, 1.0f, dw.data(), C);
                   }});
}

void elementwise_cases(std::vector<Case>& cases, Buffers& buf, int64_t tokens) {
  const int64_t n = tokens * 3072;  // B*T rows of GPT-2 small's MLP width
  auto &x = buf.add(n), &y = buf.add(n), &g = buf.add(n);
  auto& h = buf.h.emplace_back(n);
  const std::string shape = shape_name({tokens, 3072});
  auto add = [&](std::string kernel, double bytes_per_elem, std::function<absl::Status()> run) {
    cases.push_back(bandwidth_case(std::move(kernel), shape, bytes_per_elem * n / 1e9, std::move(run)));
  };
  add("gelu_forward", 8, [&, n] { return kernels::gelu_forward(f32(y, {n}), f32(x, {n})); });
  add("gelu_backward", 12, [&, n] { return kernels::gelu_backward(f32(y, {n}), f32(x, {n}), f32(g, {n})); });
  add("residual_forward", 12, [&, n] { return kernels::residual_forward(f32(y, {n}), f32(x, {n}), f32(g, {n})); });
  add("residual_backward", 12, [&, n] { return kernels::residual_backward(f32(y, {n}), f32(g, {n})); });
  add("cast_fp32_bf16", 6, [&, n] { return kernels::cast(Tensor(h.data(), DType::kBF16, {n}), f32(x, {n})); });
  static const kernels::StochasticRounding sr{.seed = 1};
  add("cast_fp32_bf16_stochastic", 6,
      [&, n] { return kernels::cast(Tensor(h.data(), DType::kBF16, {n}), f32(x, {n}), &sr); });
}

void layernorm_cases(std::vector<Case>& cases, Buffers& buf, int64_t rows) {
  constexpr int64_t c = 768;
  auto &x = buf.add(rows * c), &y = buf.add(rows * c), &d = buf.add(rows * c), &w = buf.add(c), &b = buf.add(c);
  auto &mean = buf.add(rows), &rstd = buf.add(rows), &dw = buf.add(c), &db = buf.add(c);
  const std::string shape = shape_name({rows, c});
  const double gb = rows * c / 1e9;
  cases.push_back(bandwidth_case("layernorm_forward", shape, 8 * gb, [&, rows] {
    return kernels::layernorm_forward(f32(y, {rows, c}), f32(mean, {rows}), f32(rstd, {rows}), f32(x, {rows, c}),
                                      f32(w, {c}), f32(b, {c}));
  }));
  cases.push_back(bandwidth_case("layernorm_backward", shape, 12 * gb, [&, rows] {
    return kernels::layernorm_backward(f32(y, {rows, c}), f32(dw, {c}), f32(db, {c}), f32(d, {rows, c}),
                                       f32(x, {rows, c}), f32(w, {c}), f32(mean, {rows}), f32(rstd, {rows}));
  }));
}

void crossentropy_cases(std::vector<Case>& cases, Buffers& buf, int64_t rows) {
  constexpr int64_t vp = 50304, vocab = 50257;  // GPT-2's padded vocab
  auto &logits = buf.add(rows * vp, 0.1f), &dlogits = buf.add(rows * vp);
  auto& targets = buf.i.emplace_back(rows, 7);
  cases.push_back(bandwidth_case("crossentropy", shape_name({rows, vp}), 8.0 * rows * vp / 1e9, [&, rows] {
    return kernels::crossentropy_forward_backward(f32(dlogits, {rows, vp}), f32(logits, {rows, vp}),
                                                  Tensor(targets.data(), DType::kI32, {rows}), vocab)
        .status();
  }));
}

// Attention beside the raw sgemm rate of the first matmul case (`gemm`): how close to GEMM speed it runs.
void attention_cases(std::vector<Case>& cases, Buffers& buf, int64_t t, const Case& gemm) {
  constexpr int64_t b = 4, nh = 12, c = 768;
  auto &inp = buf.add(b * t * 3 * c, 0.01f), &out = buf.add(b * t * c), &lse = buf.add(b * nh * t);
  auto &dout = buf.add(b * t * c), &dinp = buf.add(b * t * 3 * c);
  const std::string shape = shape_name({b, t, nh, c});
  const std::string baseline = absl::StrCat("cblas_sgemm@", gemm.shape);
  // Causal: T(T+1)/2 scores per head; QK^T and PV take 2 flops per score and head-dim element each.
  const double gflop = 2.0 * 2.0 * b * nh * (t * (t + 1) / 2.0) * (c / nh) / 1e9;
  cases.push_back(
      {"attention_forward", shape, "GFLOP/s", gflop,
       [&, t] {
         return kernels::attention_forward(f32(out, {b, t, c}), f32(lse, {b, nh, t}), f32(inp, {b, t, 3 * c}), nh);
       },
       baseline, gemm.baseline_amount, gemm.baseline});
  cases.push_back({"attention_backward", shape, "GFLOP/s", 2.5 * gflop,  // QK^T again, dP, dV, dQ, dK: 5 products
                   [&, t] {
                     return kernels::attention_backward(f32(dinp, {b, t, 3 * c}), f32(dout, {b, t, c}),
                                                        f32(inp, {b, t, 3 * c}), f32(out, {b, t, c}),
                                                        f32(lse, {b, nh, t}), nh);
                   },
                   baseline, gemm.baseline_amount, gemm.baseline});
}

std::vector<Case> all_cases(Buffers& buf, int64_t tokens) {
  const int64_t quarter = std::max<int64_t>(1, tokens / 4);
  std::vector<Case> cases;
  matmul_cases(cases, buf, tokens, 768, 3072);
  matmul_cases(cases, buf, tokens, 3072, 768);
  elementwise_cases(cases, buf, tokens);
  layernorm_cases(cases, buf, 4 * tokens);
  crossentropy_cases(cases, buf, quarter);
  attention_cases(cases, buf, quarter, cases[0]);
  return cases;
}

// --kernels as a set of names; every name must be one of kKernels.
absl::StatusOr<std::set<std::string>> kernels_flag() {
  const std::string list = absl::GetFlag(FLAGS_kernels);
  const std::set<std::string> known(std::begin(kKernels), std::end(kKernels));
  if (list == "all") return known;
  std::set<std::string> chosen;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    if (!known.count(std::string(name))) {
      return flag_error("kernels",
                        absl::StrCat("unknown kernel '", name, "'; choose from all, ", absl::StrJoin(kKernels, ", ")));
    }
    chosen.emplace(name);
  }
  return chosen;
}

// Seconds per call of fn: `warmup` untimed calls, then the wall time of `iters` calls / iters.
absl::StatusOr<double> seconds_per_call(const Repetitions& reps, const std::function<absl::Status()>& fn) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < reps.warmup; ++i) ZERO_RETURN_IF_ERROR(fn());
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < reps.iters; ++i) ZERO_RETURN_IF_ERROR(fn());
  return std::chrono::duration<double>(Clock::now() - start).count() / reps.iters;
}

absl::Status add_row(ResultTable& table, const Case& c, const Repetitions& reps) {
  ZERO_ASSIGN_OR_RETURN(const double seconds, seconds_per_call(reps, c.run));
  ZERO_ASSIGN_OR_RETURN(const double baseline_seconds, seconds_per_call(reps, [&] {
                          c.baseline();
                          return absl::OkStatus();
                        }));
  const double rate = c.amount / seconds, baseline_rate = c.baseline_amount / baseline_seconds;
  table.add_row({c.kernel, c.shape, seconds * 1e6, rate, c.unit, c.baseline_name, baseline_rate, rate / baseline_rate});
  return absl::OkStatus();
}

}  // namespace

absl::Status kernels_command() {
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  if (tokens < 1) return flag_error("tokens", absl::StrCat(tokens, " rows requested; give at least 1"));
  ZERO_ASSIGN_OR_RETURN(const std::set<std::string> chosen, kernels_flag());
  ZERO_ASSIGN_OR_RETURN(const Repetitions reps, repetitions_flags());
  set_cpu_threads(omp_get_max_threads());
  std::printf(
      "# zero-bench kernels: %d kernel threads, tokens %lld, warmup %d, iters %d; every rate beside its "
      "baseline from this run\n",
      cpu_threads(), static_cast<long long>(tokens), reps.warmup, reps.iters);
  Buffers buf;
  ResultTable table(
      {{"kernel"}, {"shape"}, {"time_us", 1}, {"rate", 2}, {"unit"}, {"baseline"}, {"baseline_rate", 2}, {"ratio", 3}});
  for (const Case& c : all_cases(buf, tokens)) {
    if (chosen.count(c.kernel)) ZERO_RETURN_IF_ERROR(add_row(table, c, reps));
  }
  std::fputs(table.to_text().c_str(), stdout);
  return write_csv_flag(table);
}

}  // namespace zero
