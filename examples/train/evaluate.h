// Forward-only evaluation: the engine's full parameters streamed unit by unit into a second copy of the model's units.
#pragma once

// The engine has no forward-only pass, and a training forward would leave gradients behind. So each
// evaluation micro-batch runs Engine::visit_full_params (a collective: stage 3 gathers one unit at a
// time, as its forward does) and feeds each unit's parameters, as soon as all of them have been
// visited, to that unit of a replica model: a second instance of the trained model (GPT-2 or the MLP)
// whose units hold no parameters of their own.
// Its activations come from the evaluator's own allocator, so evaluation neither counts towards nor
// disturbs the training peaks; parameters a later unit ties to (GPT-2's wte) are copied there too.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "models/data/addition.h"
#include "models/data/data_loader.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/engine.h"

namespace zero::train {

struct EvalResult {
  float loss = 0;             // mean over micro-batches and ranks
  int64_t correct = 0;        // answer digits (addition), next tokens or class labels predicted right, over all ranks
  int64_t predictions = 0;
  int64_t answers_correct = 0;  // addition only: whole answers right
  int64_t answers = 0;
};

class Evaluator {
 public:
  // `replica`: a fresh model of the trained one's shape. `task` scores whole answers when the data is the
  // addition task (else null). Each rank reads its DistributedSampler share of `val`, unshuffled, from
  // the start at every evaluation.
  static absl::StatusOr<std::unique_ptr<Evaluator>> create(std::unique_ptr<Model> replica,
                                                           std::shared_ptr<const data::Dataset> val,
                                                           std::shared_ptr<const data::AdditionDataset> task,
                                                           int64_t micro_batch, const Communicator& comm);

  // `batches` micro-batches per rank; every rank must call it (stage 3 gathers, the totals are summed).
  absl::StatusOr<EvalResult> evaluate(Engine& engine, Communicator& comm, int64_t batches);

 private:
  Evaluator(std::unique_ptr<Model> replica, std::shared_ptr<const data::AdditionDataset> task, int rank);
  // The replica's forward over ctx.batch; returns its logits ((B, T, Vp) or (B, K)) and sets ctx's loss and counts.
  absl::StatusOr<Tensor> forward(Engine& engine, UnitContext& ctx);
  void score(const Tensor& logits, const Batch& batch, EvalResult& sums);

  Allocator allocator_;  // replica activations, tied copies, the val loader's tokens
  std::unique_ptr<Model> replica_;
  std::shared_ptr<const data::AdditionDataset> task_;
  std::unique_ptr<data::DataLoader> loader_;
};

}  // namespace zero::train
