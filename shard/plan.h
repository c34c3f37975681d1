// Per-rank memory and communication of ZeRO stages 0-3 by the ZeRO formulas: the one place they are computed.
#pragma once

// For Ψ parameters padded to Ψp (a multiple of N) over N ranks, shard S = Ψp/N, with p = 4 (fp32) or 2
// (bf16/fp16) bytes per parameter and gradient, m = 0 (fp32) or 4 (fp32 master weights) and k optimizer
// state bytes per parameter (AdamW 8, SGD with momentum 4, plain SGD 0), per rank:
//   stage  params  grads  master + optimizer state
//   0      pΨp     pΨp    (m+k)Ψ    (the update covers the parameters, not the padding)
//   1      pΨp     pΨp    (m+k)S
//   2      pΨp     pS     (m+k)S
//   3      pS      pS     (m+k)S
// which for Ψp = Ψ is the familiar 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N under bf16 + AdamW. The engine pads each
// flat unit to a multiple of N (Engine::num_padded_params); knowing only Ψ, ceil(Ψ/N)·N is the padding of
// one flat buffer, at most N - 1 per unit below the engine's.
//
// Bytes sent per rank per optimizer step over A micro-batches (ring collectives: an allreduce of E
// elements sends 2E(N-1)/N, a reduce-scatter or allgather E(N-1)/N), every stage reducing every micro-batch:
//   stage 0    grads: A allreduces                                    2A·pS(N-1)
//   stage 1-2  grads: A reduce-scatters; params: 1 allgather          A·pS(N-1) + pS(N-1)
//   stage 3    grads: A reduce-scatters; params: 2A allgathers        3A·pS(N-1)
// (the ZeRO paper's 2Ψ(N-1)/N and 3Ψ(N-1)/N elements at A = 1). Stage 3 assumes every unit is gathered for each
// forward and backward; the engine sends less where it keeps a unit the next gathers need again, and
// more where a unit that reads tied parameters gathers their owner again. Units kept whole
// (ZeroConfig::persistence_threshold) are not gathered at all.
// Offloading the optimizer (ZeroConfig::offload_optimizer_path) moves the (m+k) column into files, and
// at stage 3 offloading the parameters (offload_param_path) the params column. ZeRO-Offload
// (offload_optimizer_to_host) keeps the (m+k) column in host memory with m = 4 under fp32 too: the host holds
// fp32 master weights whatever the training precision; offload_param_to_host adds stage 3's params column. Beside
// them the host pins p bytes per updated parameter for the gradient's transfer and p more for the parameters'
// (none when the shards are in host memory themselves).

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "runtime/dtype.h"

namespace zero {

struct PlanInput {
  int64_t params = 0;                      // Ψ
  int64_t padded_params = 0;               // Ψp, a multiple of N and >= Ψ; 0 means ceil(Ψ/N)·N
  int world_size = 1;                      // N
  int stage = 0;                           // 0-3
  DType precision = DType::kF32;           // of parameters and gradients: fp32, bf16 or fp16
  int optimizer_state_bytes = 8;           // k, per parameter
  int accumulation_steps = 1;              // A, micro-batches per optimizer step
  bool offload_optimizer = false;          // master weights and optimizer state in files on NVMe, not in RAM
  bool offload_param = false;              // stage 3 only: the parameter shards in files on NVMe, not in RAM
  bool offload_optimizer_to_host = false;  // ZeRO-Offload: fp32 master weights and optimizer state in host memory
  bool offload_param_to_host = false;      // stage 3, with the above: the parameter shards in host memory too

  // InvalidArgument naming the field and the accepted values when one is out of range.
  absl::Status validate() const;
  // Ψp: padded_params, or ceil(Ψ/N)·N when it is 0.
  int64_t padded() const;
};

// Model-state bytes one rank holds in RAM, by the allocator's categories, and what offload puts in files.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t master_weights = 0;
  int64_t optimizer_state = 0;
  int64_t in_files = 0;  // what offload moves out of RAM: master weights and optimizer state, parameters
  int64_t on_host = 0;   // of total(), what ZeRO-Offload keeps in host memory: master weights, optimizer state, and
                         // at stage 3 the parameter shards
  int64_t transfer_buffers = 0;  // ZeRO-Offload's page-locked gradient and parameter buffers, outside total()
  int64_t total() const { return params + grads + master_weights + optimizer_state; }
  int64_t on_device() const { return total() - on_host; }             // all of total() for an engine on the CPU
  int64_t host_memory() const { return on_host + transfer_buffers; }  // what ZeRO-Offload needs of the host
};

// Bytes one rank sends per optimizer step, split as the engine's CommVolume.
struct CommBytes {
  int64_t param_gather = 0;
  int64_t grad_reduce = 0;
  int64_t total() const { return param_gather + grad_reduce; }
};

// The input must validate().
ModelStateBytes model_state_bytes(const PlanInput& input);
CommBytes comm_bytes_per_step(const PlanInput& input);

// The largest Ψ (padded as ceil(Ψ/N)·N) whose model states on the device (on_device()) plus `other_bytes` fit in
// `budget_bytes` on one rank under `input`'s stage, precision and optimizer (input.params is ignored), and, where
// `host_bytes` is given, whose host memory (host_memory()) fits in it; 0 when none does.
int64_t largest_params_that_fit(const PlanInput& input, int64_t budget_bytes, int64_t other_bytes = 0,
                                std::optional<int64_t> host_bytes = std::nullopt);

}  // namespace zero
