// Base of LAMB and LARS: optimizers that communicate whole-parameter norms, own the CUDA square bins of their norm
// pass, and share its CPU loop.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optim/cpu_loops.h"
#include "optim/optimizer.h"
#include "optim/square_sum.h"
#include "runtime/status.h"

namespace zero {

static_assert(kMaxChunkElements <= SquareBins::kMaxBinnedValues, "a chunk's squares must fit one set of bins");

class TrustRatioOptimizer : public Optimizer {
 public:
  bool communicates() const override { return true; }

  absl::Status allocate_bins(Allocator& allocator) {
    ZERO_ASSIGN_OR_RETURN(bins_, optim::allocate_square_bins(layout(), allocator, device()));
    return absl::OkStatus();
  }

 protected:
  using Optimizer::Optimizer;

  // The norm pass on the CPU and the simulated device (run_cpu_pass `name`, reading params and using the state as
  // `state` says): per chunk, squares(layout, args, state buffers, chunk) gives element(i, g, first, second), which
  // adds shard element i's two squared quantities (g its fp32 gradient) to the chunk's bins. squares runs later on a
  // simulated device and on several OpenMP threads at once: it captures by value, never `this`.
  template <typename Squares>
  absl::StatusOr<ChunkSumsReader> cpu_norm_pass(std::string name, const StepArgs& a, Use state, Squares squares,
                                                bool wait) const {
    auto sums = std::make_shared<ChunkSquareSums>(layout().chunks().size());
    ZERO_RETURN_IF_ERROR(run_cpu_pass(
        std::move(name), a, {.params = Use::kRead, .state = state},
        [sums, squares = std::move(squares)](const ShardLayout& layout, const StepArgs& s,
                                             const std::vector<float*>& buffers) {
          optim::for_each_chunk(layout, [&](int64_t k, const ShardChunk& ch) {
            const auto element = squares(layout, s, buffers, ch);
            SquareBins first, second;
            optim::for_each_gradient_piece(s.grads, ch, [&](const float* __restrict g, int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) element(i, g[i - b], first, second);
            });
            (*sums)[k][0].add(first);
            (*sums)[k][1].add(second);
          });
          return absl::OkStatus();
        },
        wait));
    return [sums]() -> absl::StatusOr<ChunkSquareSums> { return *sums; };
  }

  optim::SquareBinsScratch bins_;
};

}  // namespace zero
