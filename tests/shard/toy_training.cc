#include "tests/shard/toy_training.h"

#include <cstring>
#include <mutex>

#include "runtime/comm/local.h"
#include "runtime/status.h"

namespace zero::testing {

OptimizerFactory adamw_factory() {
  return [](ShardLayout layout, Allocator& alloc, Device device) {
    return make_adam(AdamOptions{}, std::move(layout), alloc, device);
  };
}

OptimizerFactory sgd_factory() {
  return [](ShardLayout layout, Allocator& alloc, Device device) {
    return make_sgd(SgdOptions{}, std::move(layout), alloc, device);
  };
}

absl::StatusOr<std::vector<float>> full_params(Engine& engine) {
  std::vector<float> params;
  ZERO_RETURN_IF_ERROR(engine.visit_full_params([&](absl::string_view, absl::string_view, const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) params.push_back(load_as_float(t.data(), t.dtype(), i));
    return absl::OkStatus();
  }));
  return params;
}

absl::StatusOr<RankResult> train_rank(Communicator& comm, const TrainRun& run) {
  RankResult result;
  Allocator alloc(comm.rank(), run.budget);
  ToyModel toy(run.model, comm.rank());
  UnitHooks hooks = run.hooks;
  if (run.on_unit_start) {
    hooks.on_start = [&](const std::string& event) {
      if (run.hooks.on_start) run.hooks.on_start(event);
      run.on_unit_start(event, alloc);
    };
  }
  HookedModel model(toy, hooks);
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(model, comm, alloc, run.optimizer, run.zero));
  const int micro = run.zero.accumulation_steps;
  const int64_t rows = kGlobalBatch / (comm.world_size() * micro);
  if (!run.load_checkpoint.empty()) ZERO_RETURN_IF_ERROR(engine->load_checkpoint(run.load_checkpoint).status());
  for (int step = run.first_step; step < run.first_step + run.steps; ++step) {
    std::vector<ToyData> data;
    for (int m = 0; m < micro; ++m) {
      const int64_t begin = step * kGlobalBatch + (m * comm.world_size() + comm.rank()) * rows;
      data.push_back(toy_rows(run.model, begin, begin + rows));
    }
    std::vector<Batch> batches;
    for (ToyData& d : data) batches.push_back(d.batch(run.model.features));
    for (const Batch& batch : run.evaluate_first ? batches : std::vector<Batch>{}) {
      ZERO_ASSIGN_OR_RETURN(result.evaluations.emplace_back(), engine->evaluate(batch));
    }
    engine->reset_comm_volume();
    ZERO_ASSIGN_OR_RETURN(StepResult step_result, engine->train_step(batches, run.lr));
    result.steps.push_back(step_result);
    if (run.after_step) ZERO_RETURN_IF_ERROR(run.after_step(*engine, step));
  }
  result.last_step = engine->comm_volume();  // before the visit's own gathers
  if (!run.save_checkpoint.empty()) ZERO_RETURN_IF_ERROR(engine->save_checkpoint(run.save_checkpoint));
  ZERO_ASSIGN_OR_RETURN(result.params, full_params(*engine));
  result.padded_params = engine->num_padded_params();
  result.held_at_end = alloc.stats();
  result.file_bytes_in_ram_at_end = alloc.file_bytes_in_ram();
  engine.reset();
  result.memory = alloc.stats();
  return result;
}

LocalOutcome train_local(const TrainRun& run) {
  LocalOutcome out;
  out.ranks.resize(run.world_size);
  const std::vector<absl::Status> statuses = run_local_ranks(run.world_size, [&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(out.ranks[comm.rank()], train_rank(comm, run));
    return absl::OkStatus();
  });
  out.status = root_cause(statuses);
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace zero::testing
