#include "examples/train/evaluate.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::train {

Evaluator::Evaluator(std::shared_ptr<const data::AdditionDataset> task, data::DataLoader loader, Allocator& allocator,
                     Device device)
    : task_(std::move(task)), loader_(std::move(loader)), device_batch_(allocator, device), allocator_(allocator) {}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::create(std::shared_ptr<const data::Dataset> val,
                                                             std::shared_ptr<const data::AdditionDataset> task,
                                                             int64_t micro_batch, const Communicator& comm,
                                                             Allocator& allocator, Device device) {
  const data::SamplerOptions sampler{.world_size = comm.world_size(), .rank = comm.rank(), .shuffle = false};
  absl::StatusOr<data::DataLoader> loader = data::DataLoader::create(std::move(val), micro_batch, sampler, allocator);
  if (!loader.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the validation data: ", loader.status().message()));
  }
  return std::unique_ptr<Evaluator>(new Evaluator(std::move(task), std::move(*loader), allocator, device));
}

absl::Status Evaluator::score(const Tensor& logits, const Batch& host, EvalResult& sums) {
  Buffer copy;
  ZERO_ASSIGN_OR_RETURN(const Tensor host_logits, on_host(logits, allocator_, copy));
  const data::AdditionScore s = task_->score(host_logits, host.targets);
  sums.answers_correct += s.answers_correct;
  sums.answers += s.answers;
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Evaluator::evaluate(Engine& engine, Communicator& comm, int64_t batches) {
  loader_.set_epoch(0, 0);
  float sums[5] = {};  // loss, correct, predictions, answers right, answers: counts exact in fp32 below 2^24
  for (int64_t b = 0; b < batches; ++b) {
    const Batch& host = loader_.next();
    ZERO_ASSIGN_OR_RETURN(const Batch batch, device_batch_.place(host));
    EvalResult answers;
    ZERO_ASSIGN_OR_RETURN(const Evaluation e, engine.evaluate(batch, [&](const Tensor& logits) {
      return task_ != nullptr ? score(logits, host, answers) : absl::OkStatus();
    }));
    sums[0] += e.loss;
    sums[1] += static_cast<float>(e.correct);
    sums[2] += static_cast<float>(e.predictions);
    sums[3] += static_cast<float>(answers.answers_correct);
    sums[4] += static_cast<float>(answers.answers);
  }
  ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(sums, DType::kF32, {5}), ReduceOp::kSum).wait());
  return EvalResult{.loss = sums[0] / static_cast<float>(batches * comm.world_size()),
                    .correct = static_cast<int64_t>(sums[1]),
                    .predictions = static_cast<int64_t>(sums[2]),
                    .answers_correct = static_cast<int64_t>(sums[3]),
                    .answers = static_cast<int64_t>(sums[4])};
}

}  // namespace zero::train
