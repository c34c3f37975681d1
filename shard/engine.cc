// The ZeRO engine: builds a rank's flat units, then orders gathers, reductions and the update into a step.
#include "shard/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "optim/square_sum.h"
#include "runtime/cpu_threads.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "shard/offload.h"

namespace zero {

Engine::Engine(Model& model, Communicator& comm, Allocator& allocator, ZeroConfig config)
    : model_(model), comm_(comm), allocator_(allocator), config_(std::move(config)), policy_(config_.stage),
      dtype_(config_.precision), device_(config_.device),
      optimizer_device_(config_.offload_optimizer_to_host ? Device::cpu() : device_),
      meter_(comm, device_, config_.time_phases), scaler_(dtype_, config_.loss_scaling) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(Model& model, Communicator& comm, Allocator& allocator,
                                                       OptimizerFactory make_optimizer, ZeroConfig config) {
  ZERO_RETURN_IF_ERROR(config.validate());
  // Refused here, saying why, rather than at the first allocation with the bare CUDA error.
  if (config.device.is_cuda()) ZERO_RETURN_IF_ERROR(check_cuda_device(config.device.index));
  if (allocator.budget() && allocator.budgeted() != config.device.type) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the allocator's budget bounds ", Device{allocator.budgeted(), 0}.is_cpu() ? "host" : "another device's",
        " memory, and the engine is on ", config.device.to_string(),
        ": give the allocator the engine's device type (Allocator(rank, budget, DeviceType)) so the budget bounds it"));
  }
  std::unique_ptr<Engine> engine(new Engine(model, comm, allocator, std::move(config)));
  ZERO_RETURN_IF_ERROR(engine->build(std::move(make_optimizer)));
  return engine;
}

// --- Building -------------------------------------------------------------------------------------------

Engine::~Engine() {
  // The members' device buffers are freed after this, on the destroying thread's current stream, which nothing else
  // orders after the compute stream's last kernels (a failed call's, too): the host waits for them once.
  if (compute_) (void)device_api(device_)->synchronize(compute_->stream.get());
  if (delayed_ == nullptr) return;
  update_worker_->synchronize();
  absl::MutexLock lock(&delayed_->mu);
  if (!delayed_->status.ok()) {  // a destructor cannot return it, and dropping it would hide a failed update
    std::fprintf(stderr, "zero: rank %d: the delayed update of step %lld failed, and no call reported it: %s\n",
                 comm_.rank(), static_cast<long long>(delayed_->step), delayed_->status.ToString().c_str());
  }
}

JoinedStreamScope Engine::compute_scope() const {
  if (!compute_) return JoinedStreamScope(nullptr, device_, std::nullopt, Event{});
  return JoinedStreamScope(device_api(device_), device_, compute_->stream.get(), compute_->marker.get());
}

absl::Status Engine::build(OptimizerFactory make_optimizer) {
  if (!device_.is_cpu()) {
    DeviceApi& api = *device_api(device_);
    ZERO_ASSIGN_OR_RETURN(OwnedStream stream, OwnedStream::create(api, device_.index, StreamFlags::kNonBlocking));
    ZERO_ASSIGN_OR_RETURN(OwnedEvent marker, OwnedEvent::create(api, device_.index));
    compute_.emplace(ComputeStream{std::move(stream), std::move(marker)});
  }
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  ZERO_ASSIGN_OR_RETURN(wrapped_, WrappedModel::wrap(model_, config_.wrap_min_params));
  const std::vector<Unit*> units = wrapped_->units();
  ZERO_RETURN_IF_ERROR(check_same_units_on_every_rank(units, comm_));
  ZERO_ASSIGN_OR_RETURN(
      units_, flat_unit_states(units, policy_, config_.persistence_threshold, comm_.rank(), comm_.world_size()));
  ZERO_RETURN_IF_ERROR(place_optimizer_in_files(allocator_, config_.offload_optimizer_path));
  for (UnitState& u : units_) ZERO_RETURN_IF_ERROR(allocate_unit(u, make_optimizer));
  if (!config_.offload_optimizer_path.empty()) {
    ZERO_ASSIGN_OR_RETURN(swapper_, OptimizerSwapper::create(units_, allocator_, config_.optimizer_swap));
  }
  const auto communicates = [](const UnitState& u) { return u.optimizer->communicates(); };
  const auto talker = std::find_if(units_.begin(), units_.end(), communicates);
  if (config_.delayed_update_after >= 0 && !policy_.updates_everything() && talker != units_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ZeroConfig.delayed_update_after = ", config_.delayed_update_after, ": ", talker->optimizer->name(), " (unit '",
        talker->name, "')",
        " reduces its norms across ranks within the update, which a delayed update would run beside the next "
        "step's collectives; use stage 0 (every rank updates whole parameters), another optimizer, or no delay"));
  }
  ZERO_RETURN_IF_ERROR(initialize_params());
  const RankContext rank{
      .units = units_, .comm = comm_, .allocator = allocator_, .meter = meter_, .dtype = dtype_, .device = device_};
  gatherer_ = std::make_unique<ParamGatherer>(rank, config_.max_live_units);
  GradientReducer::GradientsFinal on_final;
  if (config_.offload_optimizer_to_host) {
    ZERO_ASSIGN_OR_RETURN(host_offload_, HostOffload::create(units_, dtype_, device_, allocator_));
    on_final = [this](int i) {
      wait_until_updated(i);
      return host_offload_->gradients_final(i);
    };
  }
  reducer_ = std::make_unique<GradientReducer>(rank, config_, std::move(on_final));
  ZERO_ASSIGN_OR_RETURN(metrics_, StepMetrics::create(allocator_, device_, config_.accumulation_steps));
  ZERO_RETURN_IF_ERROR(reserve_transient());
  allocator_.reset_peaks();  // from here on, peaks are the steps' (initialization's workspace is gone)
  return absl::OkStatus();
}

absl::Status Engine::allocate_unit(UnitState& u, const OptimizerFactory& make_optimizer) {
  ZERO_ASSIGN_OR_RETURN(u.params, allocate_held_params(u, allocator_, dtype_, device_, config_.offload_param_path,
                                                       config_.offload_param_to_host));
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(dtype_));
  ZERO_ASSIGN_OR_RETURN(u.grads, allocator_.allocate(u.grads_numel * element_bytes, MemoryCategory::kGrads, device_));
  ZERO_RETURN_IF_ERROR(kernels::fill_zero(u.held_grads(dtype_)));
  if (dtype_ != DType::kF32 || optimizer_device_ != device_) {
    ZERO_ASSIGN_OR_RETURN(u.master,
                          allocator_.allocate(u.own_count * 4, MemoryCategory::kMasterWeights, optimizer_device_));
  }
  std::vector<FlatParam> params = u.layout.params;
  std::vector<ParamGroup> groups = assign_decay_groups(params, config_.weight_decay, config_.no_decay_patterns);
  const bool whole = policy_.updates_everything();
  ZERO_ASSIGN_OR_RETURN(ShardLayout layout,
                        ShardLayout::for_rank(std::move(params), std::move(groups), u.layout.numel,
                                              whole ? 0 : comm_.rank(), whole ? 1 : comm_.world_size()));
  ZERO_ASSIGN_OR_RETURN(u.optimizer, make_optimizer(std::move(layout), allocator_, optimizer_device_));
  if (u.optimizer->device() != optimizer_device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the optimizer factory built ", u.optimizer->name(), " on ", u.optimizer->device().to_string(),
                     " for an optimizer on ", optimizer_device_.to_string(), "; build it on the device it is given"));
  }
  return move_offloaded(u, allocator_, &Allocator::page_out);
}

absl::Status Engine::initialize_params() {
  for (UnitState& u : units_) {
    ZERO_ASSIGN_OR_RETURN(Buffer values, allocator_.allocate(u.held_numel * 4, MemoryCategory::kWorkspace));
    float* held = static_cast<float*>(values.data());
    initial_held_values(u, config_.seed, held);
    ZERO_RETURN_IF_ERROR(assign_params(u, held, u.held_begin));
  }
  return absl::OkStatus();
}

absl::Status Engine::reserve_transient() {
  if (!allocator_.budget()) return absl::OkStatus();
  const int64_t numel = reducer_->most_live_numel() + gatherer_->most_live_numel();
  absl::StatusOr<Buffer> probe =
      allocator_.allocate(numel * static_cast<int64_t>(dtype_size(dtype_)), MemoryCategory::kCommBuffers, device_);
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat(probe.status().message(), " (reserving the engine's largest gradient bucket and ",
                                     "gathered units before the first step)"));
  }
  return absl::OkStatus();
}

absl::Status Engine::settle_offload() { return swapper_ ? swapper_->settle() : absl::OkStatus(); }

absl::Status Engine::assign_params(UnitState& u, const float* values, int64_t first) {
  ZERO_RETURN_IF_ERROR(move_offloaded(u, allocator_, &Allocator::page_in));
  const Tensor held(const_cast<float*>(values) + (u.held_begin - first), DType::kF32, {u.held_numel});
  ZERO_RETURN_IF_ERROR(cast_from_host(u.held_params(dtype_), held, allocator_));
  if (u.master.data() != nullptr) {
    const Tensor own(const_cast<float*>(values) + (u.own_begin - first), DType::kF32, {u.own_count});
    ZERO_RETURN_IF_ERROR(cast_from_host(u.master.tensor(DType::kF32, {u.own_count}), own, allocator_));
  }
  return move_offloaded(u, allocator_, &Allocator::page_out);
}

// --- The step --------------------------------------------------------------------------------------------

absl::StatusOr<std::vector<bool>> Engine::units_that_run(const UnitContext& ctx) const {
  std::vector<bool> runs(units_.size());
  for (size_t i = 0; i < units_.size(); ++i) {
    runs[i] = units_[i].unit->runs(ctx);
    if (!runs[i] && (i == 0 || i + 1 == units_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unit '", units_[i].name, "' sat out a micro-batch (Unit::runs), but the ", i == 0 ? "first" : "last",
          " unit always runs: the first reads the batch and the last computes the loss"));
    }
  }
  return runs;
}

absl::StatusOr<ParamViews> Engine::param_views(int i) const {
  return unit_views(units_, i, [&](int owner) -> absl::StatusOr<Tensor> { return gatherer_->full_params(owner); });
}

absl::Status Engine::forward_backward(const Batch& batch) {
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  if (micro_batches_done_ == config_.accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("forward_backward after ", micro_batches_done_,
                                                      " micro-batches; accumulation_steps is ",
                                                      config_.accumulation_steps, ": call step() first"));
  }
  UnitContext ctx{.allocator = allocator_,
                  .batch = batch,
                  .device = device_,
                  .step = step_count_,
                  .loss_scale = static_cast<float>(scaler_.scale()),
                  .loss_sums = metrics_->slot(micro_batches_done_),
                  .output_read = false,
                  .tf32 = config_.tf32};
  ZERO_ASSIGN_OR_RETURN(const std::vector<bool> runs, units_that_run(ctx));
  if (micro_batches_done_ == 0) gatherer_->begin_recorded_pass();
  absl::Cleanup abandon_phase = [this] { meter_.abandon_phase(); };  // a failed phase adds no time
  ZERO_RETURN_IF_ERROR(meter_.open_phase());
  ZERO_RETURN_IF_ERROR(forward(ctx, runs, /*evaluation=*/false).status());
  ZERO_RETURN_IF_ERROR(meter_.close_phase(&PhaseTimes::forward));
  ZERO_RETURN_IF_ERROR(meter_.open_phase());
  ZERO_RETURN_IF_ERROR(backward(ctx, runs));
  ZERO_RETURN_IF_ERROR(meter_.close_phase(&PhaseTimes::backward));
  metrics_->record(ctx);
  ++micro_batches_done_;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Engine::forward(UnitContext& ctx, const std::vector<bool>& runs, bool evaluation) {
  Tensor x;
  Unit* previous = nullptr;  // the last unit that ran
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    if (!runs[i]) continue;  // x passes through
    ZERO_RETURN_IF_ERROR(gatherer_->acquire(units_[i].needs));
    ZERO_ASSIGN_OR_RETURN(const ParamViews params, param_views(i));
    ZERO_ASSIGN_OR_RETURN(x, units_[i].unit->forward(ctx, params, x));
    gatherer_->release(units_[i].needs);
    if (evaluation && previous != nullptr) previous->release_saved();  // no backward will read it
    previous = units_[i].unit;
  }
  return x;
}

absl::Status Engine::backward(UnitContext& ctx, const std::vector<bool>& runs) {
  reducer_->begin_micro_batch(micro_batches_done_ + 1 == config_.accumulation_steps);
  Tensor dy;
  for (int i = static_cast<int>(units_.size()) - 1; i >= 0; --i) {
    if (runs[i]) {
      ZERO_RETURN_IF_ERROR(gatherer_->acquire(units_[i].needs));
      ZERO_ASSIGN_OR_RETURN(const ParamViews params, param_views(i));
      ZERO_ASSIGN_OR_RETURN(const ParamViews grads, reducer_->grad_views(i));
      ZERO_ASSIGN_OR_RETURN(dy, units_[i].unit->backward(ctx, params, grads, dy));
      gatherer_->release(units_[i].needs);
    }
    ZERO_RETURN_IF_ERROR(reducer_->backward_done(i));
  }
  return reducer_->finish();
}

absl::StatusOr<Evaluation> Engine::evaluate(const Batch& batch,
                                            const std::function<absl::Status(const Tensor&)>& on_output) {
  ZERO_RETURN_IF_ERROR(require_between_steps("evaluate"));
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  UnitContext ctx{.allocator = allocator_,
                  .batch = batch,
                  .device = device_,
                  .step = step_count_,
                  .backward_follows = false,
                  .tf32 = config_.tf32};
  ZERO_ASSIGN_OR_RETURN(const std::vector<bool> runs, units_that_run(ctx));
  std::vector<int> plan;  // the gathers of this pass, known in advance, so prefetched along
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!runs[i]) continue;
    for (const int owner : units_[i].needs) {
      if (units_[owner].sharded) plan.push_back(owner);
    }
  }
  gatherer_->begin_planned_pass(std::move(plan));
  ZERO_ASSIGN_OR_RETURN(const Tensor output, forward(ctx, runs, /*evaluation=*/true));
  if (on_output) ZERO_RETURN_IF_ERROR(on_output(output));
  units_.back().unit->release_saved();  // the last unit always runs
  ZERO_RETURN_IF_ERROR(gatherer_->end_pass());
  return Evaluation{.loss = ctx.loss, .correct = ctx.correct, .predictions = ctx.predictions};
}

absl::StatusOr<double> Engine::global_grad_norm() {
  // The exact global sum of squares (optim/square_sum.h) of the unscaled gradients, each rank summing its
  // slice (stage 0 too, so no element counts twice), combined with one int32 allreduce: the same bits for
  // every stage and world size. A NaN or infinity anywhere makes it non-finite on every rank, which is how
  // fp16 overflow is agreed.
  // One sum over every unit's slice: on a device, the host waits for it once.
  std::vector<Tensor> slices;
  for (const UnitState& u : units_) slices.push_back(u.grad_slice(dtype_));
  ZERO_ASSIGN_OR_RETURN(const SquareSum sum, exact_square_sum(slices, static_cast<float>(scaler_.scale())));
  std::vector<int32_t> wire(SquareSum::kWireInts);
  sum.to_wire(wire.data());
  const Tensor wire_tensor(wire.data(), DType::kI32, {SquareSum::kWireInts});
  Work allreduce = meter_.counted(&CommVolume::small, [&] { return comm_.allreduce(wire_tensor, ReduceOp::kSum); });
  ZERO_RETURN_IF_ERROR(meter_.wait(allreduce));
  return std::sqrt(SquareSum::from_wire(wire.data()).value());
}

absl::Status Engine::non_finite_gradients() {
  // Every rank names its first unit with a NaN or infinity in its slice; the ranks agree on the first.
  const int n = static_cast<int>(units_.size());
  int32_t first_from_end = 0;  // n - i for this rank's first non-finite unit i: the max is the first
  for (int i = 0; i < n && first_from_end == 0; ++i) {
    ZERO_ASSIGN_OR_RETURN(const SquareSum sum, exact_square_sum(units_[i].grad_slice(dtype_), 1.0f));
    if (!std::isfinite(sum.value())) first_from_end = n - i;
  }
  Work agree = meter_.counted(
      &CommVolume::small, [&] { return comm_.allreduce(Tensor(&first_from_end, DType::kI32, {1}), ReduceOp::kMax); });
  ZERO_RETURN_IF_ERROR(meter_.wait(agree));
  const std::string where = first_from_end > 0
                                ? absl::StrCat("the gradients of unit '", units_[n - first_from_end].name,
                                               "' are not finite (NaN or infinity)")
                                : "the gradients' norm overflowed";
  return absl::AbortedError(absl::StrCat(
      "step ", step_count_ + 1, ": ", where, " in ", dtype_name(dtype_),
      ", so no rank updated; lower the learning rate or tighten gradient_clipping, or train in fp16, whose loss "
      "scaling skips such steps"));
}

absl::Status Engine::update(const UpdateArgs& args) {
  if (host_offload_) {
    ZERO_RETURN_IF_ERROR(host_offload_->stream_remaining_gradients());
    ZERO_RETURN_IF_ERROR(host_offload_->wait_for_shard_copies());
  }
  ZERO_ASSIGN_OR_RETURN(const std::vector<WholeParamNorms> norms, measure_norms(args));
  ZERO_RETURN_IF_ERROR(update_each_unit(
      [&](int i) { return update_unit(i, args, norms.empty() || norms[i].empty() ? nullptr : &norms[i]); }));
  return swapper_ ? swapper_->end_step() : absl::OkStatus();
}

absl::StatusOr<std::vector<WholeParamNorms>> Engine::measure_norms(const UpdateArgs& args) {
  // Where every rank updates whole parameters, each optimizer measures its own within its step, alone.
  if (policy_.updates_everything()) return std::vector<WholeParamNorms>();
  std::vector<NormParts> parts(units_.size());
  bool measured = false;
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    if (!units_[i].optimizer->communicates()) continue;
    measured = true;
    ZERO_RETURN_IF_ERROR(with_unit_in_ram(i, [&]() -> absl::Status {
      ZERO_ASSIGN_OR_RETURN(const UnitStep s, unit_step(i, args));
      ZERO_ASSIGN_OR_RETURN(parts[i], units_[i].optimizer->measure(s.target, s.grads, args.step, args.lr));
      return absl::OkStatus();
    }));
  }
  if (!measured) return std::vector<WholeParamNorms>();
  ZERO_RETURN_IF_ERROR(synchronize(optimizer_device_));  // once for every unit's first pass (nothing on the CPU)
  return reduce_norm_parts(parts, &comm_);
}

absl::Status Engine::update_each_unit(const std::function<absl::Status(int i)>& update_one) {
  // The allgather runs on the communication thread while the next unit updates; all are waited for at the end
  // (also after an error, so no collective is left writing into the parameters).
  std::vector<Work> gathers;
  absl::Status status;
  for (int i = 0; i < static_cast<int>(units_.size()) && status.ok(); ++i) {
    status = update_one(i);
    if (status.ok() && !policy_.updates_everything() && !units_[i].sharded) {
      gathers.push_back(gatherer_->allgather_updated(i));
    }
  }
  for (Work& gather : gathers) status.Update(meter_.wait(gather));
  return status;
}

absl::Status Engine::update_unit(int i, const UpdateArgs& args, const WholeParamNorms* norms) {
  if (host_offload_) {  // ZeRO-Offload: the gradient streamed to the host, the step there, the parameters back
    ZERO_RETURN_IF_ERROR(step_optimizer(i, args, norms));
    return host_offload_->send_parameters(i);
  }
  return with_unit_in_ram(i, [&] { return step_optimizer(i, args, norms); });
}

absl::Status Engine::with_unit_in_ram(int i, const std::function<absl::Status()>& use) {
  UnitState& u = units_[i];
  ZERO_RETURN_IF_ERROR(allocator_.page_in(u.params.data()));  // offload_param: the shard is updated in place
  if (swapper_) ZERO_RETURN_IF_ERROR(swapper_->acquire(i));
  ZERO_RETURN_IF_ERROR(use());
  if (swapper_) ZERO_RETURN_IF_ERROR(swapper_->release(i));
  return allocator_.page_out(u.params.data());
}

absl::StatusOr<Engine::UnitStep> Engine::unit_step(int i, const UpdateArgs& args) {
  UnitState& u = units_[i];
  Tensor grads = u.own_grads(dtype_), params = u.own_params(dtype_);
  if (host_offload_) {  // the gradient streamed to the host; the parameters' pinned buffer (or the host shard)
    ZERO_ASSIGN_OR_RETURN(grads, host_offload_->streamed_gradients(i));
    ZERO_ASSIGN_OR_RETURN(params, host_offload_->parameters(i));
  }
  // A coefficient of 1 or more clips nothing (and may not even fit a float: an infinite gradient_clipping).
  const float clip = static_cast<float>(std::min(args.clip_coefficient, 1.0));
  UnitStep s{.grads = Gradients(grads, static_cast<float>(args.loss_scale), clip)};
  if (u.master.data() == nullptr) {  // fp32 on the engine's device: the params are the master weights
    s.target = params;
    return s;
  }
  s.target = u.master.tensor(DType::kF32, {u.own_count});
  if (dtype_ == DType::kF32) {
    s.cast_after = params;  // fp32 master weights apart from the device's params (ZeRO-Offload)
  } else {
    s.half = HalfCopy{.out = params};
  }
  return s;
}

absl::Status Engine::step_optimizer(int i, const UpdateArgs& args, const WholeParamNorms* norms) {
  UnitState& u = units_[i];
  Communicator* comm = policy_.updates_everything() ? nullptr : &comm_;  // slice optimizers reduce norms
  ZERO_ASSIGN_OR_RETURN(const UnitStep s, unit_step(i, args));
  ZERO_RETURN_IF_ERROR(u.optimizer->step(s.target, s.grads, args.step, args.lr, comm, s.half, norms));
  return s.cast_after.data() != nullptr ? kernels::cast(s.cast_after, s.target) : absl::OkStatus();
}

bool Engine::delays_this_update() const {
  return config_.delayed_update_after >= 0 && step_count_ > config_.delayed_update_after;
}

absl::Status Engine::start_delayed_update(const UpdateArgs& args) {
  ZERO_RETURN_IF_ERROR(host_offload_->stream_remaining_gradients());
  delayed_ = std::make_unique<DelayedUpdate>();
  {
    absl::MutexLock lock(&delayed_->mu);  // no other thread has it yet; the lock is what its annotation asks
    delayed_->updated.assign(units_.size(), false);
  }
  delayed_->step = args.step;
  if (!update_worker_) update_worker_ = std::make_unique<CpuStream>("zero-update");
  update_worker_->submit([this, args, d = delayed_.get(), threads = cpu_threads()] {
    set_cpu_threads(threads);  // the rank's share of the cores, as on its compute thread
    absl::Status status;
    for (int i = static_cast<int>(units_.size()) - 1; i >= 0; --i) {
      if (status.ok()) status = step_optimizer(i, args, nullptr);
      absl::MutexLock lock(&d->mu);
      d->updated[i] = true;  // after a failure too: nothing reads the buffer anymore
      d->status.Update(status);
    }
  });
  return absl::OkStatus();
}

absl::Status Engine::apply_delayed_update() {
  if (delayed_ == nullptr) return absl::OkStatus();
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  update_worker_->synchronize();
  const absl::Status status = [&] {
    absl::MutexLock lock(&delayed_->mu);
    return delayed_->status;
  }();
  const int64_t step = delayed_->step;
  delayed_.reset();
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("the delayed update of step ", step, " failed: ", status.message()));
  }
  return update_each_unit([&](int i) { return host_offload_->send_parameters(i); });
}

void Engine::wait_until_updated(int i) {
  if (delayed_ == nullptr) return;
  DelayedUpdate& d = *delayed_;
  absl::MutexLock lock(&d.mu);
  const auto updated = [&d, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) { return bool{d.updated[i]}; };
  d.mu.Await(absl::Condition(&updated));
}

absl::StatusOr<StepResult> Engine::step(float lr) {
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  if (micro_batches_done_ != config_.accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step() after ", micro_batches_done_, " micro-batches; accumulation_steps is ", config_.accumulation_steps));
  }
  ZERO_RETURN_IF_ERROR(metrics_->copy_back());                       // arrives with the norm's read
  absl::Cleanup abandon_phase = [this] { meter_.abandon_phase(); };  // a failed phase adds no time
  // However the step ends, later kernels wait for the gradients' copies to the host (ZeRO-Offload).
  absl::Cleanup release_gradients = [this] {
    if (host_offload_) (void)host_offload_->release_gradients();
  };
  ZERO_RETURN_IF_ERROR(meter_.open_phase());
  ZERO_RETURN_IF_ERROR(gatherer_->end_pass());   // prefetches the step did not use, after an order change
  ZERO_RETURN_IF_ERROR(apply_delayed_update());  // the last step's (its time is this update phase's): after those
                                                 // gathers, which read the parameters it writes
  StepResult result{.loss_scale = scaler_.scale()};
  double clip_coefficient = 1.0;
  if (config_.gradient_clipping > 0 || scaler_.checks_overflow()) {
    ZERO_ASSIGN_OR_RETURN(result.grad_norm, global_grad_norm());
    result.skipped = !std::isfinite(result.grad_norm);
    if (result.skipped && !scaler_.checks_overflow()) return non_finite_gradients();
    if (config_.gradient_clipping > 0) {
      clip_coefficient = config_.gradient_clipping / (result.grad_norm + 1e-6);  // torch clip_grad_norm_
    }
  }
  scaler_.update(result.skipped);  // for the next step's gradients: this step's carry result.loss_scale
  if (!result.skipped) {
    ++step_count_;
    const UpdateArgs args{
        .lr = lr, .loss_scale = result.loss_scale, .clip_coefficient = clip_coefficient, .step = step_count_};
    ZERO_RETURN_IF_ERROR(delays_this_update() ? start_delayed_update(args) : update(args));
  }
  std::move(release_gradients).Invoke();  // before the gradients are zeroed
  ZERO_RETURN_IF_ERROR(reducer_->zero_grads());
  ZERO_ASSIGN_OR_RETURN(const StepMetrics::Reduced metrics, metrics_->reduce(meter_, comm_));
  result.loss = metrics.loss;
  result.correct = metrics.correct;
  result.predictions = metrics.predictions;
  ZERO_RETURN_IF_ERROR(meter_.close_phase(&PhaseTimes::update));
  micro_batches_done_ = 0;
  return result;
}

absl::StatusOr<StepResult> Engine::train_step(std::span<const Batch> micro_batches, float lr) {
  if (static_cast<int>(micro_batches.size()) != config_.accumulation_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_step got ", micro_batches.size(), " micro-batches; accumulation_steps is ", config_.accumulation_steps));
  }
  for (const Batch& batch : micro_batches) ZERO_RETURN_IF_ERROR(forward_backward(batch));
  return step(lr);
}

absl::Status Engine::require_between_steps(absl::string_view call) const {
  if (micro_batches_done_ == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(call, " between forward_backward and step; call it before or after a step"));
}

// --- Full parameters ------------------------------------------------------------------------------------

absl::Status Engine::visit_full_params(
    const std::function<absl::Status(absl::string_view, absl::string_view, const Tensor&)>& visit) {
  ZERO_RETURN_IF_ERROR(require_between_steps("visit_full_params"));
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  ZERO_RETURN_IF_ERROR(apply_delayed_update());
  std::vector<int> plan;
  for (size_t i = 0; i < units_.size(); ++i) {
    if (units_[i].sharded) plan.push_back(static_cast<int>(i));
  }
  gatherer_->begin_planned_pass(std::move(plan));
  for (int i = 0; i < static_cast<int>(units_.size()); ++i) {
    const UnitState& u = units_[i];
    const int unit[] = {i};
    ZERO_RETURN_IF_ERROR(gatherer_->acquire(unit));
    Buffer host_copy;
    ZERO_ASSIGN_OR_RETURN(const Tensor full, on_host(gatherer_->full_params(i), allocator_, host_copy));
    ZERO_RETURN_IF_ERROR(comm_.flush());  // the gather settled: no aborted collective's bytes are handed out
    for (size_t p = 0; p < u.layout.params.size(); ++p) {
      const auto [unit_name, param] = model_param_name(u.name, u.layout.params[p].name);
      ZERO_RETURN_IF_ERROR(visit(unit_name, param, full.view(u.layout.params[p].offset, u.layout.shapes[p])));
    }
    gatherer_->release(unit);
  }
  return gatherer_->end_pass();
}

absl::Status Engine::load_params(
    const std::function<absl::Status(absl::string_view, absl::string_view, Tensor)>& fill) {
  ZERO_RETURN_IF_ERROR(require_between_steps("load_params"));
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  ZERO_RETURN_IF_ERROR(apply_delayed_update());
  ZERO_RETURN_IF_ERROR(settle_offload());
  for (UnitState& u : units_) {
    ZERO_ASSIGN_OR_RETURN(Buffer full, allocator_.allocate(u.layout.padded_numel * 4, MemoryCategory::kWorkspace));
    std::memset(full.data(), 0, full.nbytes());
    const Tensor all = full.tensor(DType::kF32, {u.layout.padded_numel});
    for (size_t p = 0; p < u.layout.params.size(); ++p) {
      const auto [unit, param] = model_param_name(u.name, u.layout.params[p].name);
      ZERO_RETURN_IF_ERROR(fill(unit, param, all.view(u.layout.params[p].offset, u.layout.shapes[p])));
    }
    ZERO_RETURN_IF_ERROR(assign_params(u, static_cast<const float*>(full.data()), 0));
  }
  return absl::OkStatus();
}

int64_t Engine::num_params() const {
  int64_t n = 0;
  for (const UnitState& u : units_) n += u.layout.numel;
  return n;
}

int64_t Engine::num_padded_params() const {
  int64_t n = 0;
  for (const UnitState& u : units_) n += u.layout.padded_numel;
  return n;
}

}  // namespace zero
