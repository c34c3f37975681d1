#include "examples/train/evaluate.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::train {

Evaluator::Evaluator(std::unique_ptr<Model> replica, std::shared_ptr<const data::AdditionDataset> task, int rank)
    : allocator_(rank), replica_(std::move(replica)), task_(std::move(task)) {}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::create(std::unique_ptr<Model> replica,
                                                             std::shared_ptr<const data::Dataset> val,
                                                             std::shared_ptr<const data::AdditionDataset> task,
                                                             int64_t micro_batch, const Communicator& comm) {
  std::unique_ptr<Evaluator> evaluator(new Evaluator(std::move(replica), std::move(task), comm.rank()));
  const data::SamplerOptions sampler{.world_size = comm.world_size(), .rank = comm.rank(), .shuffle = false};
  absl::StatusOr<data::DataLoader> loader = data::DataLoader::create(std::move(val), micro_batch, sampler,
                                                                     evaluator->allocator_);
  if (!loader.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the validation data: ", loader.status().message()));
  }
  evaluator->loader_ = std::make_unique<data::DataLoader>(std::move(*loader));
  return evaluator;
}

absl::StatusOr<Tensor> Evaluator::forward(Engine& engine, UnitContext& ctx) {
  struct TiedCopy {
    Buffer buffer;
    Tensor view;  // the parameter's dtype and shape over buffer
  };
  const std::vector<Unit*> units = replica_->units();
  std::map<std::string, TiedCopy> tied;  // "unit/param" -> a copy, for the later units that tie to it
  for (Unit* u : units) {
    for (const TiedParam& t : u->tied_params()) tied[absl::StrCat(t.owner_unit, "/", t.param)];
  }
  size_t next = 0;     // the unit whose parameters are being visited
  size_t visited = 0;  // of its parameters so far
  ParamViews views;
  Tensor x;
  ZERO_RETURN_IF_ERROR(engine.visit_full_params(
      [&](absl::string_view unit, absl::string_view param, const Tensor& value) -> absl::Status {
        Unit* u = units[next];
        ZERO_CHECK(u->name() == unit, "the engine visits units in the model's order");
        views.set(std::string(param), value);
        if (auto it = tied.find(absl::StrCat(unit, "/", param)); it != tied.end()) {
          TiedCopy& copy = it->second;
          ZERO_ASSIGN_OR_RETURN(copy.buffer, allocator_.allocate(static_cast<int64_t>(value.nbytes()),
                                                                 MemoryCategory::kParams));
          std::memcpy(copy.buffer.data(), value.data(), value.nbytes());
          copy.view = copy.buffer.tensor(value.dtype(), value.shape());
        }
        if (++visited < u->param_specs().size()) return absl::OkStatus();
        for (const TiedParam& t : u->tied_params()) views.set(t.param, tied.at(absl::StrCat(t.owner_unit, "/", t.param)).view);
        ZERO_ASSIGN_OR_RETURN(x, u->forward(ctx, views, x));
        views = ParamViews();
        visited = 0;
        ++next;
        return absl::OkStatus();
      }));
  return x;
}

void Evaluator::score(const Tensor& logits, const Batch& batch, EvalResult& sums) {
  const data::AdditionScore s = task_->score(logits, batch.targets);
  sums.answers_correct += s.answers_correct;
  sums.answers += s.answers;
}

absl::StatusOr<EvalResult> Evaluator::evaluate(Engine& engine, Communicator& comm, int64_t batches) {
  loader_->set_epoch(0, 0);
  float sums[5] = {};  // loss, correct, predictions, answers right, answers: counts exact in fp32 below 2^24
  for (int64_t b = 0; b < batches; ++b) {
    const Batch& batch = loader_->next();
    UnitContext ctx{.allocator = allocator_, .batch = batch};
    ZERO_ASSIGN_OR_RETURN(Tensor logits, forward(engine, ctx));
    EvalResult batch_result;
    if (task_ != nullptr) score(logits, batch, batch_result);
    sums[0] += ctx.loss;
    sums[1] += static_cast<float>(ctx.correct);
    sums[2] += static_cast<float>(ctx.predictions);
    sums[3] += static_cast<float>(batch_result.answers_correct);
    sums[4] += static_cast<float>(batch_result.answers);
  }
  ZERO_RETURN_IF_ERROR(comm.allreduce(Tensor(sums, DType::kF32, {5}), ReduceOp::kSum).wait());
  return EvalResult{.loss = sums[0] / static_cast<float>(batches * comm.world_size()),
                    .correct = static_cast<int64_t>(sums[1]),
                    .predictions = static_cast<int64_t>(sums[2]),
                    .answers_correct = static_cast<int64_t>(sums[3]),
                    .answers = static_cast<int64_t>(sums[4])};
}

}  // namespace zero::train
