// GPT-2 forward+backward tokens/s on the CPU, tiny and d12 (124M), beside the same model in PyTorch (eager and
// torch.compile) measured in the same run. Usage: models_bench [B=4] [T=64] [iterations=3] [threads=2] (T capped at
// a preset's max_seq_len). PyTorch is optional: the benchmarks' Python (examples/common/bench_python.h:
// $ZERO_BENCH_PYTHON or .venv-bench). Both sides time the model alone, as loss.backward() does: zero's units
// through testing::ModelRunner, without the engine's reductions or an optimizer step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/common/bench_python.h"
#include "kernels/kernels.h"
#include "models/gpt2.h"
#include "runtime/cpu_threads.h"
#include "runtime/status.h"
#include "tests/models/model_runner.h"

namespace zero {
namespace {

struct Args {
  int64_t batch = 4, seq_len = 64;
  int iterations = 3, threads = 2;
};

// Both sides time at least `iterations` iterations and at least this long, so the tiny model's
// milliseconds are not lost in timer and scheduling noise.
constexpr double kMinSeconds = 2.0;

// Tokens/s of zero's forward+backward: one warm-up iteration, then the timed ones, gradients adding up.
absl::StatusOr<double> zero_tokens_per_second(const Gpt2Config& config, const Args& args) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> model, Gpt2::create(config));
  testing::ModelRunner runner(*model);
  runner.init(/*seed=*/1234);
  std::vector<int32_t> tokens(args.batch * args.seq_len), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919) % config.vocab_size);
    targets[i] = static_cast<int32_t>((i * 104729 + 1) % config.vocab_size);
  }
  const Batch batch{.inputs = Tensor(tokens.data(), DType::kI32, {args.batch, args.seq_len}),
                    .targets = Tensor(targets.data(), DType::kI32, {args.batch, args.seq_len})};
  Allocator allocator;
  ZERO_RETURN_IF_ERROR(runner.forward_backward(allocator, batch).status());
  const auto start = std::chrono::steady_clock::now();
  std::chrono::duration<double> elapsed{};
  int done = 0;
  for (; done < args.iterations || elapsed.count() < kMinSeconds; ++done) {
    ZERO_RETURN_IF_ERROR(runner.forward_backward(allocator, batch).status());
    elapsed = std::chrono::steady_clock::now() - start;
  }
  return static_cast<double>(args.batch * args.seq_len * done) / elapsed.count();
}

// PyTorch's run of the same model and batch; its tokens/s is on a "tokens_per_s N" line.
BaselineOutput run_torch(const Gpt2Config& c, const Args& args) {
  const std::string shape = absl::StrCat(c.max_seq_len, " ", c.vocab_size, " ", c.padded_vocab_size, " ", c.num_layers,
                                         " ", c.num_heads, " ", c.channels, " ", args.batch, " ", args.seq_len, " ",
                                         args.iterations, " ", kMinSeconds, " ", args.threads);
  return run_baseline(benchmark_python(), ZERO_BENCH_SCRIPT, shape);
}

// Its tokens/s per mode (eager, compile); its other lines are echoed.
std::vector<std::pair<std::string, double>> tokens_per_second(const BaselineOutput& run) {
  std::vector<std::pair<std::string, double>> rates;
  for (const std::string& line : run.lines) {
    char mode[32];
    double rate = 0;
    if (std::sscanf(line.c_str(), "tokens_per_s %31s %lf", mode, &rate) == 2) {
      rates.emplace_back(mode, rate);
    } else {
      std::printf("  %s\n", line.c_str());
    }
  }
  return rates;
}

int run(const Args& args) {
  set_cpu_threads(args.threads);
  std::printf("GPT-2 forward+backward, fp32, >= %d iterations and >= %.0f s after one warm-up, %d threads\n",
              args.iterations, kMinSeconds, args.threads);
  for (const char* preset : {"tiny", "d12"}) {
    const Gpt2Config config = *Gpt2Config::preset(preset);
    Args shape = args;
    shape.seq_len = std::min(args.seq_len, config.max_seq_len);  // tiny has 16 positions
    absl::StatusOr<double> zero = zero_tokens_per_second(config, shape);
    if (!zero.ok()) {
      std::fprintf(stderr, "models_bench: %s: %s\n", preset, std::string(zero.status().message()).c_str());
      return 1;
    }
    std::printf("%-4s %11lld params, B=%lld T=%lld  zero  %9.1f tokens/s\n", preset,
                static_cast<long long>(config.num_parameters()), static_cast<long long>(shape.batch),
                static_cast<long long>(shape.seq_len), *zero);
    const BaselineOutput torch_run = run_torch(config, shape);
    const auto torch = tokens_per_second(torch_run);
    for (const auto& [mode, rate] : torch) {
      std::printf("%-4s %28s torch %-7s %9.1f tokens/s; zero is %.2fx\n", preset, "", mode.c_str(), rate, *zero / rate);
    }
    if (torch.empty()) std::fputs(missing_torch_note(benchmark_python(), torch_run).c_str(), stdout);
  }
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) {
  zero::Args args;
  if (argc > 1) args.batch = std::atoll(argv[1]);
  if (argc > 2) args.seq_len = std::atoll(argv[2]);
  if (argc > 3) args.iterations = std::atoi(argv[3]);
  if (argc > 4) args.threads = std::atoi(argv[4]);
  if (args.batch <= 0 || args.seq_len <= 0 || args.iterations <= 0 || args.threads <= 0) {
    std::fprintf(stderr, "usage: models_bench [B=4] [T=64] [iterations=3] [threads=2], all positive\n");
    return 1;
  }
  return zero::run(args);
}
