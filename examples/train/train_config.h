// zero-train's JSON config: DeepSpeed's keys where the concept is the same, zero's own for model, data and ranks.
#pragma once

// Where a key is DeepSpeed's, so are its units and defaults: bucket and prefetch sizes count elements,
// fp16.loss_scale 0 means dynamic scaling. Every key can be overridden on the command line as
// `--zero_optimization.stage=3` (or `--ranks 4`); the value is read as JSON, else as a string, and null
// removes the key. Hugging Face's "auto" values are filled by auto_values.h, which the reader never sees.
// Unknown keys, wrong types and impossible values are refused by parse_train_config, naming the key;
// what needs the world size (the batch rule) or the model (the budget, stage-3 live parameters) is
// checked by resolve_batch and engine_config, still before any parameter is allocated.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "shard/config.h"

namespace zero::train {

struct Offload {                // "zero_optimization.offload_optimizer" and "offload_param"
  std::string device = "none";  // none or nvme; cpu is refused (see validate_offload)
  std::string nvme_path;        // a directory on the drive that holds the files
};

struct ZeroOptimization {  // "zero_optimization"
  int stage = 0;
  int64_t reduce_bucket_size = 500'000'000;              // elements
  int64_t allgather_bucket_size = 500'000'000;           // elements
  int64_t stage3_prefetch_bucket_size = 50'000'000;      // elements
  int64_t stage3_max_live_parameters = 1'000'000'000;    // elements
  int64_t stage3_param_persistence_threshold = 100'000;  // elements
  bool overlap_comm = true;
  Offload offload_optimizer;  // master weights and optimizer state to files on NVMe
  Offload offload_param;      // stage 3: the parameter shards to files on NVMe
  // offload_optimizer's buffer_count, pipeline_read and pipeline_write (DeepSpeed's defaults)
  ZeroConfig::OptimizerSwap optimizer_swap;
  // zero's own: DDP's no_sync for stages 0-1 (reduce once per step), and the wrap policy's size.
  bool no_sync = false;
  int64_t wrap_min_params = 0;        // elements; 0 = one flat unit per model unit
  int64_t delayed_update_after = -1;  // ZeRO-Offload's delayed parameter update after these steps; -1 = never
};

struct Fp16 {  // "fp16"
  bool enabled = false;
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
};

struct OptimizerConfig {       // "optimizer"
  std::string type = "AdamW";  // Adam, AdamW, Lamb or SGD
  double lr = 1e-3;            // params.lr
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool adam_w_mode = true;  // Adam only: DeepSpeed's Adam decouples weight decay by default
  double momentum = 0;      // SGD only
  // Lamb only, DeepSpeed's FusedLamb: bias correction as a step-size factor (else none), and the range the
  // trust ratio is clamped to.
  bool bias_correction = true;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
};

struct SchedulerConfig {        // "scheduler"; type "" = the optimizer's lr throughout
  std::string type;             // WarmupLR, WarmupDecayLR or WarmupCosineLR; "none" (any case) reads as ""
  double warmup_min_lr = 0;     // WarmupLR, WarmupDecayLR
  double warmup_max_lr = 1e-3;  // WarmupLR, WarmupDecayLR
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // log or linear
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR; 0 = the run's steps
  double warmup_min_ratio = 0;      // WarmupCosineLR
  double cos_min_ratio = 0.0001;    // WarmupCosineLR
};

struct ModelConfig {          // "model"
  std::string type = "gpt2";  // gpt2 or mlp
  // A Gpt2Config::preset name, or "custom": the sizes below, with max_seq_len and vocab from the data.
  std::string preset = "custom";
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t channels = 64;
  std::vector<int64_t> widths = {16, 64, 64, 4};  // mlp: {D, hidden..., K}, D and K the data's
  bool recompute = false;  // gpt2: every block recomputes its activations in backward (checkpointing)
};

struct BlobsKeys {        // "data.blobs": see models/data/blobs.h
  int64_t features = 16;  // D
  int64_t classes = 4;    // K
  double noise = 1.0;
  int64_t train_rows = 1 << 14;
  int64_t val_rows = 1024;
  uint64_t seed = 1;
};

struct DataConfig {  // "data"
  // addition (generated, embedded) or tokens (llm.c .bin shards) for gpt2; blobs (generated) for mlp
  std::string source = "addition";
  int digits = 3;  // addition.*: see models/data/addition.h
  int examples_per_row = 4;
  int64_t train_rows = 1 << 16;
  int64_t val_rows = 1024;
  uint64_t seed = 1;
  std::string train_glob;  // tokens.*
  std::string val_glob;
  int64_t seq_len = 64;
  int64_t vocab_size = 50257;
  BlobsKeys blobs;
};

struct CheckpointConfig {  // "checkpoint": zero's own (see shard/checkpoint.h)
  std::string dir;         // checkpoints go to <dir>/step-NNNNNNNN and <dir>/latest; "" = none
  int64_t interval = 0;    // steps between saves; 0 = only at the end of the run
  int64_t keep_last = 2;   // how many of the newest step-* to keep; 0 = all
  // "" starts fresh; "latest" resumes from <dir>/latest (an error if there is none); "auto" resumes from
  // it when there is one (for jobs that restart themselves); anything else is a checkpoint directory.
  std::string resume;
};

struct TrainConfig {
  // The batch rule's three keys; unset ones are derived by resolve_batch.
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  double gradient_clipping = 0;
  int64_t steps_per_print = 10;       // steps between log lines when stdout is not a terminal
  bool wall_clock_breakdown = false;  // time forward, backward, update and waiting on communication
  ZeroOptimization zero_optimization;
  bool bf16 = false;  // bf16.enabled
  Fp16 fp16;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;

  ModelConfig model;
  DataConfig data;
  std::string backend = "local";  // local (threads), mpi (mpirun -np N), nccl (one GPU per rank)
  std::string device = "cpu";     // cpu; cuda: local ranks share cuda:0, nccl ranks use their node's GPUs; sim
  bool tf32 = false;              // cuda: the models' fp32 GEMMs on tensor cores in TF32 (ZeroConfig::tf32)
  int ranks = 4;                  // local, or nccl without mpirun; under mpirun the world size is -np
  int64_t memory_budget_mib = 0;  // per rank, over all categories; 0 = none
  int64_t steps = 300;
  int64_t eval_interval = 50;                             // steps between evaluations; 0 = only at the end
  int64_t eval_batches = 4;                               // micro-batches per rank per evaluation
  uint64_t seed = 1234;                                   // parameter init and data order
  std::string metrics_path = "zero-train-metrics.jsonl";  // JSON lines; "" = none
  std::string plot_path;    // at the end, metrics_path's losses and learning rate drawn into this PNG; "" = none
  std::string init_from;    // Hugging Face GPT-2 safetensors to start from; "" = random init
  std::string export_path;  // where to save the trained GPT-2 as safetensors; "" = not saved
  CheckpointConfig checkpoint;
};

// The batch as DeepSpeed settles it: train_batch_size = micro_batch * accumulation_steps * world_size.
struct BatchPlan {
  int64_t train_batch_size = 0;
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 0;
};

// The embedded default: a small GPT-2 learning 3-digit addition on 4 local ranks at stage 3.
const char* default_config_json();

// Parses `json` (a config file's text), applies `overrides` ("key.path=value", later ones win) and checks
// every key and value that does not need the world size or the model.
absl::StatusOr<TrainConfig> parse_train_config(const std::string& json, const std::vector<std::string>& overrides);

// The embedded default with `overrides`, as parse_train_config reads it, except that its warmup shrinks to
// a tenth of a run too short for it, unless an override sets scheduler.params.warmup_num_steps.
absl::StatusOr<TrainConfig> parse_default_config(const std::vector<std::string>& overrides);

// DeepSpeed's batch rule for world size N: any two of train_batch_size, train_micro_batch_size_per_gpu and
// gradient_accumulation_steps determine the third (one alone: accumulation 1); all three must agree.
absl::StatusOr<BatchPlan> resolve_batch(const TrainConfig& config, int world_size);

// fp32 floats of optimizer state per parameter: 2 for Adam, AdamW and Lamb, 1 for SGD with momentum.
int optimizer_state_floats(const OptimizerConfig& optimizer);

struct UnitSize {
  std::string name;
  int64_t numel = 0;
};

// Local ranks are threads of one process; more ranks than this are processes (mpirun).
inline constexpr int kMaxLocalRanks = 1024;

// OK when the model states a GPT-2 of shape `g` keeps in host memory (shard/plan.h's formulas for the config's
// stage, precision, optimizer and offload: all of them, or on a GPU what ZeRO-Offload moves to the host), times the
// `ranks_here` ranks this machine runs, fit in its `memory_bytes`; else InvalidArgument naming the shape. Checked
// before the model is built: a model of a billion layers would take minutes to declare and then fail to allocate.
absl::Status check_machine_holds(const TrainConfig& c, const Gpt2Config& g, int world_size, int ranks_here,
                                 int64_t memory_bytes);

// The engine's knobs for a model of these units on `device`, after checking that the memory budget holds
// the model states (shard/plan.h), the largest gradient bucket and, at stage 3, the largest unit gathered.
absl::StatusOr<ZeroConfig> engine_config(const TrainConfig& config, const BatchPlan& batch, int world_size,
                                         const std::vector<UnitSize>& units, Device device = Device::cpu());

}  // namespace zero::train
