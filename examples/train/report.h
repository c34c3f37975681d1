// What zero-train shows: the progress line, the JSON-lines metrics file, the end-of-run memory, traffic and time
// tables.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/engine.h"

namespace zero::train {

// The in-place progress line for a terminal `columns` wide: a bar of step/steps before `text` where it fits,
// `text` cut to the width where even it does not.
std::string progress_bar_line(absl::string_view text, int64_t step, int64_t steps, int columns);

// Rank 0's progress: on a terminal one line rewritten in place ("\r"), otherwise a log line every
// steps_per_print steps (and the first and last).
class Progress {
 public:
  // A run of `steps` steps that starts after step `first_step` (0, or where a checkpoint stopped); the
  // rate is predictions per second, shown as `rate_unit` ("tok/s" for GPT-2, "samples/s" for the MLP).
  Progress(int64_t first_step, int64_t steps, int64_t steps_per_print, bool tty, std::string rate_unit)
      : first_step_(first_step), steps_(steps), steps_per_print_(steps_per_print), tty_(tty),
        rate_unit_(std::move(rate_unit)) {}
  // `rate` and `elapsed_s` over the steps this process ran; ETA from their mean step time.
  void step(int64_t step, const StepResult& result, float lr, double rate, double elapsed_s);
  // A line of its own (an evaluation, the summary), after the in-place line if there is one.
  void line(const std::string& text);

 private:
  int64_t first_step_;
  int64_t steps_;
  int64_t steps_per_print_;
  bool tty_;
  std::string rate_unit_;
  bool open_line_ = false;
};

// One JSON object per line; a no-op without a path.
class MetricsFile {
 public:
  MetricsFile() = default;  // writes nothing
  // Appends to what is there when `append` (a resumed run), else starts the file afresh.
  static absl::StatusOr<MetricsFile> open(const std::string& path, bool append);
  // One JSON line, flushed; the OS's reason when it could not be written (a full disk).
  absl::Status write(const nlohmann::json& record);

 private:
  MetricsFile(std::FILE* file, std::string path) : file_(file, &std::fclose), path_(std::move(path)) {}
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
  std::string path_;
};

// Every rank's peak bytes per category, gathered on rank 0 (empty elsewhere). A collective.
absl::StatusOr<std::vector<MemoryStats>> gather_peaks(Communicator& comm, const Allocator& allocator);
// Every rank's phase times, likewise.
absl::StatusOr<std::vector<PhaseTimes>> gather_phase_times(Communicator& comm, const PhaseTimes& mine);

struct RunFacts {
  int stage = 0;
  int world_size = 1;
  int accumulation_steps = 1;
  DType precision = DType::kF32;
  bool tf32 = false;              // the fp32 GEMMs on tensor cores (ZeroConfig::tf32)
  Device device = Device::cpu();  // rank 0's training device (ZeroConfig::device; nccl rank r's is cuda:r)
  std::string backend = "local";  // the communicator's
  int optimizer_state_floats = 2;
  bool offload_optimizer = false;          // master weights and optimizer state in files (MemoryStats::in_files)
  bool offload_param = false;              // stage 3 parameter shards in files
  bool offload_optimizer_to_host = false;  // ZeRO-Offload: fp32 master weights and optimizer state in host memory
  bool offload_param_to_host = false;      // and stage 3's parameter shards
  int64_t params = 0;                      // Ψ
  int64_t padded_params = 0;               // Ψ as the engine lays it out: each unit padded to a multiple of N
  int64_t steps = 0;                       // this process ran (after a resume, the steps since)
  CommVolume traffic;                      // rank 0's bytes sent over those steps
  double train_seconds = 0;                // those steps
  double median_step_seconds = 0;          // median_after_warmup of their times
  std::vector<PhaseTimes> phases;          // every rank's over those steps, with wall_clock_breakdown; else empty
  double predictions_per_s = 0;            // at the median step time
  std::string predictions = "tokens";      // what a prediction is: tokens (GPT-2) or samples (the MLP)
};

// The median of the step times after the first (which warms up caches, pools and, on a GPU, the kernels), as
// benchmarks report a step; the one time there is when there is one. 0 for none.
double median_after_warmup(std::vector<double> step_seconds);

// The tables: peak memory per category per rank beside the ZeRO formula, bytes sent per step beside
// theory, and step time. Also as JSON for the metrics file.
std::string summary_tables(const RunFacts& facts, const std::vector<MemoryStats>& peaks);
nlohmann::json summary_json(const RunFacts& facts, const std::vector<MemoryStats>& peaks);

}  // namespace zero::train
