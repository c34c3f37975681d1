// Forward-only evaluation through the engine: validation loss and the task's accuracy, summed over ranks.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "models/data/addition.h"
#include "models/data/data_loader.h"
#include "models/data/device_batch.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"
#include "shard/engine.h"

namespace zero::train {

struct EvalResult {
  float loss = 0;       // mean over micro-batches and ranks
  int64_t correct = 0;  // answer digits (addition), next tokens or class labels predicted right, over all ranks
  int64_t predictions = 0;
  int64_t answers_correct = 0;  // addition only: whole answers right
  int64_t answers = 0;
};

class Evaluator {
 public:
  // Each rank reads its DistributedSampler share of `val`, unshuffled, from the start at every evaluation,
  // into host buffers from `allocator` placed on `device` (the engine's). `task` scores whole answers when
  // the data is the addition task (else null).
  static absl::StatusOr<std::unique_ptr<Evaluator>> create(std::shared_ptr<const data::Dataset> val,
                                                           std::shared_ptr<const data::AdditionDataset> task,
                                                           int64_t micro_batch, const Communicator& comm,
                                                           Allocator& allocator, Device device);

  // `batches` micro-batches per rank through Engine::evaluate; every rank must call it (stage 3 gathers,
  // the totals are summed).
  absl::StatusOr<EvalResult> evaluate(Engine& engine, Communicator& comm, int64_t batches);

 private:
  Evaluator(std::shared_ptr<const data::AdditionDataset> task, data::DataLoader loader, Allocator& allocator,
            Device device);
  // Whole answers of the addition task right in `logits` (on any device) against the host batch's targets.
  absl::Status score(const Tensor& logits, const Batch& host, EvalResult& sums);

  std::shared_ptr<const data::AdditionDataset> task_;
  data::DataLoader loader_;
  data::DeviceBatch device_batch_;
  Allocator& allocator_;
};

}  // namespace zero::train
