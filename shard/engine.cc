#include "shard/engine.h"

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "optim/square_sum.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "kernels/kernels.h"
#include "shard/init.h"

namespace zero {

namespace {

float* floats(const Buffer& b) { return static_cast<float*>(b.data()); }

}  // namespace

absl::Status ZeroConfig::validate() const {
  const auto bad = [](absl::string_view key, auto value, absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat("zero_optimization.", key, " = ", value, ": ", rule));
  };
  if (stage < 0 || stage > 3) return bad("stage", stage, "the stage is 0, 1, 2 or 3");
  if (wrap_min_params < 0) return bad("wrap_min_params", wrap_min_params, "must be >= 0 (0 = one flat unit per unit)");
  if (bucket_cap_bytes <= 0) return bad("bucket_cap_bytes", bucket_cap_bytes, "must be positive");
  if (first_bucket_cap_bytes <= 0) return bad("first_bucket_cap_bytes", first_bucket_cap_bytes, "must be positive");
  if (max_live_units < 1) return bad("max_live_units", max_live_units, "at least one gathered unit must fit");
  if (persistence_threshold < 0) return bad("persistence_threshold", persistence_threshold, "must be >= 0");
  if (accumulation_steps < 1) return bad("accumulation_steps", accumulation_steps, "must be >= 1");
  if (no_sync && stage >= 2) {
    return bad("no_sync", "true", "stages 2 and 3 keep only their gradient slice and reduce every micro-batch; "
                                  "use stage 0 or 1, or turn no_sync off");
  }
  if (gradient_clipping < 0) return bad("gradient_clipping", gradient_clipping, "must be >= 0 (0 = off)");
  for (const auto& [key, path] : {std::pair{"offload_optimizer_path", &offload_optimizer_path},
                                   {"offload_param_path", &offload_param_path}}) {
    if (!path->empty() && !device.is_cpu()) {
      return bad(key, *path, absl::StrCat("offloading from ", device.to_string(), " is not built (ZeRO-Offload's host "
                                          "optimizer); train on the CPU, or keep the states on the device"));
    }
  }
  if (!offload_param_path.empty() && stage != 3) {
    return bad("offload_param_path", offload_param_path,
               absl::StrCat("stage ", stage, " keeps every parameter whole on every rank, and offload_param moves "
                            "the shards of stage 3; use stage 3, or offload the optimizer instead"));
  }
  if (!is_floating(precision)) return bad("precision", dtype_name(precision), "use fp32, bf16 or fp16");
  if (loss_scaling.initial_scale <= 0 || loss_scaling.min_scale <= 0 || loss_scaling.static_scale < 0 ||
      loss_scaling.window < 1 || loss_scaling.hysteresis < 1) {
    return absl::InvalidArgumentError(
        "fp16.loss_scale, initial_scale_power, min_loss_scale, loss_scale_window and hysteresis must be positive "
        "(loss_scale 0 means dynamic)");
  }
  return absl::OkStatus();
}

std::vector<std::vector<int>> ZeroConfig::gradient_buckets(const std::vector<int64_t>& padded_numels) const {
  // Backward order is reverse unit order. Stages 1-3 reduce-scatter one unit per bucket so each rank's
  // slice of the unit is contiguous.
  const int64_t element_bytes = static_cast<int64_t>(dtype_size(precision));  // buckets hold the training dtype
  std::vector<std::vector<int>> buckets;
  std::vector<int> current;
  int64_t current_numel = 0;
  for (int i = static_cast<int>(padded_numels.size()) - 1; i >= 0; --i) {
    const int64_t cap_bytes = buckets.empty() ? first_bucket_cap_bytes : bucket_cap_bytes;
    if (!current.empty() && (stage > 0 || (current_numel + padded_numels[i]) * element_bytes > cap_bytes)) {
      buckets.push_back(std::move(current));
      current = {};
      current_numel = 0;
    }
    current.push_back(i);
    current_numel += padded_numels[i];
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

Engine::Engine(Model& model, Communicator& comm, Allocator& allocator, ZeroConfig config)
    : model_(model), comm_(comm), allocator_(allocator), config_(std::move(config)), dtype_(config_.precision),
      device_(config_.device) {
  if (dtype_ == DType::kF16) {
    const LossScaling& ls = config_.loss_scaling;
    loss_scale_ = ls.static_scale > 0 ? ls.static_scale : ls.initial_scale;
    hysteresis_left_ = ls.hysteresis;
  }
}

Engine::~Engine() {
  // Never leave a collective writing into memory we are about to free.
  for (UnitState& u : units_) {
    if (u.gather) (void)u.gather->wait();
  }
  for (Bucket& b : buckets_) {
    if (b.reduction) (void)b.reduction->wait();
  }
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::create(Model& model, Communicator& comm, Allocator& allocator,
                                                       OptimizerFactory make_optimizer, ZeroConfig config) {
  ZERO_RETURN_IF_ERROR(config.validate());
  std::unique_ptr<Engine> engine(new Engine(model, comm, allocator, std::move(config)));
  ZERO_RETURN_IF_ERROR(engine->build(std::move(make_optimizer)));
  return engine;
}

absl::Status Engine::build(OptimizerFactory make_optimizer) {
  const int n = comm_.world_size();
  const int rank = comm_.rank();
  ZERO_ASSIGN_OR_RETURN(wrapped_, WrappedModel::wrap(model_, config_.wrap_min_params));
  const std::vector<Unit*> units = wrapped_->units();
  units_.resize(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    UnitState& u = units_[i];
    u.unit = units[i];
    u.name = std::string(units[i]->name());
    u.layout = FlatLayout::of(units[i]->param_specs(), n);
    u.sharded = config_.stage == 3 && u.layout.numel >= config_.persistence_threshold;
  }
  ZERO_RETURN_IF_ERROR(check_same_model_on_every_rank());
  for (size_t i = 0; i < units_.size(); ++i) {
    units_[i].needs = {static_cast<int>(i)};
    for (const TiedParam& tied : units_[i].unit->tied_params()) {
      auto owner = std::find_if(units_.begin(), units_.end(), [&](const UnitState& o) { return o.name == tied.owner_unit; });
      if (owner == units_.end() || owner->layout.find(tied.param) < 0) {
        return absl::InvalidArgumentError(absl::StrCat("unit '", units_[i].name, "' ties to '", tied.owner_unit, ".",
                                                       tied.param, "', which no earlier unit declares"));
      }
      units_[i].needs.push_back(static_cast<int>(owner - units_.begin()));
    }
  }
  ZERO_RETURN_IF_ERROR(place_optimizer_in_files());
  const int64_t bytes = static_cast<int64_t>(dtype_size(dtype_));
  for (UnitState& u : units_) {
    ZERO_ASSIGN_OR_RETURN(u.params, allocate_params(u));
    const int64_t grads = config_.stage >= 2 ? u.layout.shard_numel : u.layout.padded_numel;
    ZERO_ASSIGN_OR_RETURN(u.grads, allocator_.allocate(grads * bytes, MemoryCategory::kGrads, device_));
    ZERO_RETURN_IF_ERROR(kernels::fill_zero(u.grads.tensor(dtype_, {grads})));
    if (dtype_ != DType::kF32) {
      ZERO_ASSIGN_OR_RETURN(u.master,
                            allocator_.allocate(own_range(u).second * 4, MemoryCategory::kMasterWeights, device_));
    }
    std::vector<FlatParam> params = u.layout.params;
    std::vector<ParamGroup> groups = assign_decay_groups(params, config_.weight_decay, config_.no_decay_patterns);
    ZERO_ASSIGN_OR_RETURN(ShardLayout layout,
                          config_.stage == 0
                              ? ShardLayout::for_rank(std::move(params), std::move(groups), u.layout.numel, 0, 1)
                              : ShardLayout::for_rank(std::move(params), std::move(groups), u.layout.numel, rank, n));
    ZERO_ASSIGN_OR_RETURN(u.optimizer, make_optimizer(std::move(layout), allocator_, device_));
    if (u.optimizer->device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat("the optimizer factory built ", u.optimizer->name(), " on ",
                                                     u.optimizer->device().to_string(), " for an engine on ",
                                                     device_.to_string(), "; build it on the device it is given"));
    }
    ZERO_RETURN_IF_ERROR(page_out_offloaded(u));
  }
  ZERO_RETURN_IF_ERROR(initialize_params());
  plan_buckets();
  ZERO_RETURN_IF_ERROR(reserve_transient());
  allocator_.reset_peaks();  // from here on, peaks are the steps' (initialization's workspace is gone)
  return absl::OkStatus();
}

absl::Status Engine::place_optimizer_in_files() {
  if (config_.offload_optimizer_path.empty()) return absl::OkStatus();
  for (MemoryCategory category : {MemoryCategory::kOptimizerState, MemoryCategory::kMasterWeights}) {
    const absl::Status placed = allocator_.place_in_files(category, config_.offload_optimizer_path);
    if (!placed.ok()) {
      return absl::Status(placed.code(), absl::StrCat("offloading the optimizer to ", config_.offload_optimizer_path,
                                                      ": ", placed.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Buffer> Engine::allocate_params(const UnitState& u) {
  const int64_t nbytes = u.held_numel() * static_cast<int64_t>(dtype_size(dtype_));
  const std::string& dir = config_.offload_param_path;
  if (!u.sharded || dir.empty() || nbytes == 0) return allocator_.allocate(nbytes, MemoryCategory::kParams, device_);
  absl::StatusOr<Buffer> in_file = allocator_.allocate_in_file(nbytes, MemoryCategory::kParams, dir);
  if (in_file.ok()) return in_file;
  return absl::Status(in_file.status().code(),
                      absl::StrCat("offloading the parameters to ", dir, ": ", in_file.status().message()));
}

absl::Status Engine::check_same_model_on_every_rank() {
  // Every collective of a step is sized by the units, so ranks with different models would exchange
  // mismatched data (or hang); one allgather of a fingerprint of the units refuses that up front.
  std::string layout;  // "unit:param(shape),param(shape);unit:..." in order
  for (const UnitState& u : units_) {
    absl::StrAppend(&layout, u.name, ":");
    for (size_t p = 0; p < u.layout.params.size(); ++p) {
      absl::StrAppend(&layout, u.layout.params[p].name, shape_string(u.layout.shapes[p]), ",");
    }
    absl::StrAppend(&layout, ";");
  }
  const uint64_t fingerprint = param_key(layout, "");  // FNV-1a: the same in every process
  const int n = comm_.world_size();
  int32_t mine[2] = {static_cast<int32_t>(fingerprint), static_cast<int32_t>(fingerprint >> 32)};
  std::vector<int32_t> all(2 * n);
  ZERO_RETURN_IF_ERROR(
      comm_.allgather(Tensor(mine, DType::kI32, {2}), Tensor(all.data(), DType::kI32, {2 * n})).wait());
  std::vector<int> differ;
  for (int r = 1; r < n; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differ.push_back(r);
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the model differs across ranks: rank(s) ", absl::StrJoin(differ, ", "),
      " declare units, parameters or sizes other than rank 0's; build the same model on every rank"));
}

std::pair<int64_t, int64_t> Engine::own_range(const UnitState& u) const {
  if (config_.stage == 0) return {0, u.layout.numel};
  return {u.layout.shard_begin(comm_.rank()), u.layout.shard_numel};
}

absl::Status Engine::assign_params(UnitState& u, const float* values, int64_t first) {
  // values[k] is flat element first + k (on the host), covering at least what this rank holds.
  const int64_t held_begin = u.held_begin(comm_.rank());
  const Tensor source(const_cast<float*>(values) + (held_begin - first), DType::kF32, {u.held_numel()});
  ZERO_RETURN_IF_ERROR(upload(u.params.tensor(dtype_, {u.held_numel()}), source));
  if (u.master.data() != nullptr) {
    const auto [begin, count] = own_range(u);
    const Tensor own_values(const_cast<float*>(values) + (begin - first), DType::kF32, {count});
    ZERO_RETURN_IF_ERROR(upload(u.master.tensor(DType::kF32, {count}), own_values));
  }
  return page_out_offloaded(u);
}

absl::Status Engine::upload(const Tensor& dst, const Tensor& host) {
  if (dst.device().is_cpu()) return kernels::cast(dst, host);
  ZERO_ASSIGN_OR_RETURN(Buffer staged, allocator_.allocate(static_cast<int64_t>(host.nbytes()),
                                                           MemoryCategory::kWorkspace, dst.device()));
  ZERO_RETURN_IF_ERROR(copy_bytes(staged.data(), dst.device(), host.data(), Device::cpu(), host.nbytes()));
  return kernels::cast(dst, staged.tensor(host.dtype(), host.shape()));
}

absl::Status Engine::page_out_offloaded(const UnitState& u) {
  ZERO_RETURN_IF_ERROR(allocator_.page_out(u.params.data()));
  ZERO_RETURN_IF_ERROR(allocator_.page_out(u.master.data()));
  for (const auto& [name, state] : u.optimizer->state()) ZERO_RETURN_IF_ERROR(allocator_.page_out(state.data()));
  return absl::OkStatus();
}

absl::Status Engine::initialize_params() {
  const int rank = comm_.rank();
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    const int64_t held_begin = u.held_begin(rank);
    const int64_t held_numel = u.held_numel();
    ZERO_ASSIGN_OR_RETURN(Buffer values, allocator_.allocate(held_numel * 4, MemoryCategory::kWorkspace));
    float* held = floats(values);
    std::memset(held, 0, held_numel * 4);  // padding stays zero
    const std::vector<ParamSpec> specs = u.unit->param_specs();
    for (size_t p = 0; p < specs.size(); ++p) {
      const FlatParam& fp = u.layout.params[p];
      const int64_t begin = std::max(fp.offset, held_begin);
      const int64_t end = std::min(fp.offset + fp.numel, held_begin + held_numel);
      if (begin >= end) continue;
      const auto [unit, param] = model_param_name(u.name, specs[p].name);
      init_values(specs[p].init, config_.seed, param_key(unit, param), begin - fp.offset, end - fp.offset,
                  held + (begin - held_begin));
    }
    ZERO_RETURN_IF_ERROR(assign_params(u, held, held_begin));
  }
  return absl::OkStatus();
}

void Engine::plan_buckets() {
  std::vector<int64_t> padded_numels;
  for (const UnitState& u : units_) padded_numels.push_back(u.layout.padded_numel);
  for (std::vector<int>& members : config_.gradient_buckets(padded_numels)) {
    Bucket bucket;
    for (const int i : members) {
      units_[i].bucket = static_cast<int>(buckets_.size());
      units_[i].bucket_offset = bucket.numel;
      bucket.numel += units_[i].layout.padded_numel;
    }
    bucket.remaining = static_cast<int>(members.size());
    bucket.units = std::move(members);
    buckets_.push_back(std::move(bucket));
  }
}

absl::Status Engine::reserve_transient() {
  // With a budget: the largest bucket, and at stage 3 the most gathered units alive at once, must fit
  // beside what is held. A tied owner's bucket is alive through the whole backward, beside the bucket
  // being filled.
  if (!allocator_.budget()) return absl::OkStatus();
  std::vector<int64_t> bucket_sizes;
  for (const Bucket& b : buckets_) bucket_sizes.push_back(b.numel);
  std::sort(bucket_sizes.rbegin(), bucket_sizes.rend());
  int64_t largest_bucket = 0;
  for (size_t i = 0; i < bucket_sizes.size() && i < 2; ++i) largest_bucket += bucket_sizes[i];
  std::vector<int64_t> gathered;
  for (const UnitState& u : units_) {
    if (u.sharded) gathered.push_back(u.layout.padded_numel);
  }
  std::sort(gathered.rbegin(), gathered.rend());
  int64_t live = 0;
  for (size_t i = 0; i < gathered.size() && static_cast<int>(i) < config_.max_live_units; ++i) live += gathered[i];
  absl::StatusOr<Buffer> probe = allocator_.allocate((largest_bucket + live) * static_cast<int64_t>(dtype_size(dtype_)),
                                                     MemoryCategory::kCommBuffers, device_);
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat(probe.status().message(), " (reserving the engine's largest gradient bucket and ",
                                     "gathered units before the first step)"));
  }
  return absl::OkStatus();
}

Tensor Engine::full_params(int i) const {
  const UnitState& u = units_[i];
  const Buffer& b = u.sharded ? u.gathered : u.params;
  return b.tensor(dtype_, {u.layout.padded_numel});
}

ParamViews Engine::param_views(int i) const {
  ParamViews views;
  const auto add = [&](int owner, const std::string& name) {
    const UnitState& o = units_[owner];
    const int p = o.layout.find(name);
    views.set(name, full_params(owner).view(o.layout.params[p].offset, o.layout.shapes[p]));
  };
  for (const FlatParam& p : units_[i].layout.params) add(i, p.name);
  const std::vector<TiedParam> tied = units_[i].unit->tied_params();
  for (size_t t = 0; t < tied.size(); ++t) add(units_[i].needs[t + 1], tied[t].param);
  return views;
}

absl::StatusOr<Tensor> Engine::staging_of(int i) {
  UnitState& u = units_[i];
  Bucket& b = buckets_[u.bucket];
  if (b.staging.data() == nullptr && b.numel > 0) {
    const int64_t bytes = b.numel * static_cast<int64_t>(dtype_size(dtype_));
    ZERO_ASSIGN_OR_RETURN(b.staging, allocator_.allocate(bytes, MemoryCategory::kCommBuffers, device_));
    const Tensor staging = b.staging.tensor(dtype_, {b.numel});
    ZERO_RETURN_IF_ERROR(kernels::fill_zero(staging));
    // no_sync: the micro-batches so far accumulated in the local gradients; they join the reduction.
    if (config_.no_sync) {
      for (int k : b.units) {
        UnitState& unit = units_[k];
        const Tensor grads = unit.grads.tensor(dtype_, {unit.layout.padded_numel});
        ZERO_RETURN_IF_ERROR(
            kernels::cast(staging.slice(unit.bucket_offset, unit.bucket_offset + unit.layout.padded_numel), grads));
        ZERO_RETURN_IF_ERROR(kernels::fill_zero(grads));
      }
    }
  }
  return b.staging.tensor(dtype_, {b.numel}).slice(u.bucket_offset, u.bucket_offset + u.layout.padded_numel);
}

bool Engine::reduces_this_micro_batch() const {
  return !config_.no_sync || micro_batches_done_ + 1 == config_.accumulation_steps;
}

absl::StatusOr<ParamViews> Engine::grad_views(int i) {
  ParamViews views;
  const auto add = [&](int owner, const std::string& name) -> absl::Status {
    const UnitState& o = units_[owner];
    Tensor flat;  // (padded_numel): the bucket's staging, or under no_sync the local gradient (stages 0-1)
    if (reduces_this_micro_batch()) {
      ZERO_ASSIGN_OR_RETURN(flat, staging_of(owner));
    } else {
      flat = o.grads.tensor(dtype_, {o.layout.padded_numel});
    }
    const int p = o.layout.find(name);
    views.set(name, flat.view(o.layout.params[p].offset, o.layout.shapes[p]));
    return absl::OkStatus();
  };
  for (const FlatParam& p : units_[i].layout.params) ZERO_RETURN_IF_ERROR(add(i, p.name));
  const std::vector<TiedParam> tied = units_[i].unit->tied_params();
  for (size_t t = 0; t < tied.size(); ++t) ZERO_RETURN_IF_ERROR(add(units_[i].needs[t + 1], tied[t].param));
  return views;
}

template <typename F>
Work Engine::counted(int64_t CommVolume::*purpose, F&& issue) {
  const int64_t before = comm_.stats().total_sent_bytes();
  Work work = issue();
  volume_.*purpose += comm_.stats().total_sent_bytes() - before;
  return work;
}

absl::Status Engine::wait_for(Work& work) {
  if (!phase_open_) return work.wait();  // not timing, or outside a step (evaluate, export)
  const absl::Time start = absl::Now();
  absl::Status status = work.wait();
  phase_times_.waiting += absl::Now() - start;
  return status;
}

absl::Status Engine::start_phase() {
  if (!config_.time_phases) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(synchronize(device_));
  phase_start_ = absl::Now();
  phase_open_ = true;
  return absl::OkStatus();
}

absl::Status Engine::end_phase(absl::Duration PhaseTimes::*phase) {
  if (!phase_open_) return absl::OkStatus();
  phase_open_ = false;
  ZERO_RETURN_IF_ERROR(synchronize(device_));
  phase_times_.*phase += absl::Now() - phase_start_;
  return absl::OkStatus();
}

// --- Stage 3: gathers in the recorded order, with prefetch -------------------------------------------

int Engine::live_gathers() const {
  int live = 0;
  for (const UnitState& u : units_) live += u.gathered.data() != nullptr ? 1 : 0;
  return live;
}

absl::Status Engine::start_gather(int i) {
  UnitState& u = units_[i];
  ZERO_ASSIGN_OR_RETURN(u.gathered, allocator_.allocate(u.layout.padded_numel * static_cast<int64_t>(dtype_size(dtype_)),
                                                        MemoryCategory::kCommBuffers, device_));
  const Tensor shard = u.params.tensor(dtype_, {u.layout.shard_numel});
  const Tensor full = u.gathered.tensor(dtype_, {u.layout.padded_numel});
  u.gather = counted(&CommVolume::param_gather, [&] { return comm_.allgather(shard, full); });
  return absl::OkStatus();
}

absl::Status Engine::finish_gather(UnitState& u) {
  if (!u.gather) return absl::OkStatus();
  absl::Status s = wait_for(*u.gather);
  u.gather.reset();
  s.Update(allocator_.page_out(u.params.data()));  // offload_param: the shard has been read
  return s;
}

absl::Status Engine::gather_now(int i) {
  if (units_[i].gathered.data() == nullptr) ZERO_RETURN_IF_ERROR(start_gather(i));
  return finish_gather(units_[i]);
}

absl::Status Engine::ensure_gathered(int i) {
  if (!units_[i].sharded) return absl::OkStatus();
  const size_t position = this_step_order_.size();
  this_step_order_.push_back(i);
  order_matches_ = order_matches_ && position < recorded_order_.size() && recorded_order_[position] == i;
  return gather_now(i);
}

std::span<const int> Engine::upcoming_gathers() const {
  if (!order_matches_) return {};
  return std::span<const int>(recorded_order_).subspan(this_step_order_.size());
}

absl::Status Engine::prefetch(std::span<const int> upcoming) {
  // Gathers the upcoming units ahead, keeping at most max_live_units gathered copies alive. Every rank
  // follows the same order, so every rank issues the same collectives.
  for (int next : upcoming) {
    if (live_gathers() >= config_.max_live_units) break;
    if (units_[next].gathered.data() == nullptr) ZERO_RETURN_IF_ERROR(start_gather(next));
  }
  return absl::OkStatus();
}

absl::Status Engine::release_all_gathers() {
  for (UnitState& u : units_) {
    if (!u.sharded) continue;
    ZERO_RETURN_IF_ERROR(finish_gather(u));
    u.gathered.reset();
  }
  return absl::OkStatus();
}

absl::Status Engine::acquire(int i) {
  for (int owner : units_[i].needs) ZERO_RETURN_IF_ERROR(ensure_gathered(owner));
  return prefetch(upcoming_gathers());
}

void Engine::release(int i, std::span<const int> upcoming) {
  // A unit among the next max_live_units gathers stays: prefetch would gather it again at once, so
  // keeping it saves that allgather and holds no more copies (the last unit from its forward into its
  // backward, the first unit across micro-batches, a tied owner its user reads next).
  upcoming = upcoming.first(std::min(upcoming.size(), static_cast<size_t>(config_.max_live_units)));
  for (int owner : units_[i].needs) {
    UnitState& u = units_[owner];
    const bool needed_next = std::find(upcoming.begin(), upcoming.end(), owner) != upcoming.end();
    if (u.sharded && !u.gather && !needed_next) u.gathered.reset();
  }
}

// --- Gradients -------------------------------------------------------------------------------------------

absl::Status Engine::grads_ready(int i) {
  Bucket& b = buckets_[units_[i].bucket];
  if (--b.remaining > 0) return absl::OkStatus();
  b.remaining = static_cast<int>(b.units.size());
  ZERO_RETURN_IF_ERROR(launch_reduction(b));
  // Keep one reduction in flight behind the backward compute; finish (and free) the older ones.
  for (Bucket& older : buckets_) {
    if (&older == &b) break;
    ZERO_RETURN_IF_ERROR(finish_reduction(older));
  }
  return absl::OkStatus();
}

absl::Status Engine::launch_reduction(Bucket& b) {
  if (b.numel == 0) return absl::OkStatus();
  const int n = comm_.world_size();
  const Tensor all = b.staging.tensor(dtype_, {b.numel});
  ZERO_RETURN_IF_ERROR(kernels::divide_by(all, static_cast<float>(n * config_.accumulation_steps)));
  if (config_.stage == 0) {
    b.reduction = counted(&CommVolume::grad_reduce, [&] { return comm_.allreduce(all, ReduceOp::kSum); });
    return absl::OkStatus();
  }
  // One unit per bucket: reduce-scatter in place, each rank's slice landing where it was.
  const UnitState& u = units_[b.units[0]];
  const int64_t begin = u.layout.shard_begin(comm_.rank());
  b.reduction = counted(&CommVolume::grad_reduce, [&] {
    return comm_.reduce_scatter(all, all.slice(begin, begin + u.layout.shard_numel), ReduceOp::kSum);
  });
  return absl::OkStatus();
}

absl::Status Engine::finish_reduction(Bucket& b) {
  if (!b.reduction) return absl::OkStatus();
  absl::Status s = wait_for(*b.reduction);
  b.reduction.reset();
  ZERO_RETURN_IF_ERROR(s);
  const int rank = comm_.rank();
  const Tensor staging = b.staging.tensor(dtype_, {b.numel});
  for (int i : b.units) {
    UnitState& u = units_[i];
    const Tensor reduced = staging.slice(u.bucket_offset, u.bucket_offset + u.layout.padded_numel);
    const int64_t begin = u.layout.shard_begin(rank);
    const int64_t s = u.layout.shard_numel;
    const Tensor grads = u.grads.tensor(dtype_, {config_.stage >= 2 ? s : u.layout.padded_numel});
    switch (config_.stage) {
      case 0: ZERO_RETURN_IF_ERROR(kernels::add_into(grads, reduced)); break;
      case 1: ZERO_RETURN_IF_ERROR(kernels::add_into(grads.slice(begin, begin + s), reduced.slice(begin, begin + s))); break;
      default: ZERO_RETURN_IF_ERROR(kernels::add_into(grads, reduced.slice(begin, begin + s))); break;
    }
  }
  b.staging.reset();
  return absl::OkStatus();
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

absl::Status Engine::forward_backward(const Batch& batch) {
  if (micro_batches_done_ == 0) {
    this_step_order_.clear();
    order_matches_ = !recorded_order_.empty();
  }
  UnitContext ctx{.allocator = allocator_, .batch = batch, .device = device_, .step = step_count_,
                  .loss_scale = static_cast<float>(loss_scale_)};
  ZERO_ASSIGN_OR_RETURN(const std::vector<bool> runs, units_that_run(ctx));
  ZERO_RETURN_IF_ERROR(start_phase());
  absl::Cleanup close_phase = [this] { phase_open_ = false; };  // a failed phase adds no time
  Tensor x;
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!runs[i]) continue;  // x passes through
    ZERO_RETURN_IF_ERROR(acquire(static_cast<int>(i)));
    ZERO_ASSIGN_OR_RETURN(x, units_[i].unit->forward(ctx, param_views(static_cast<int>(i)), x));
    release(static_cast<int>(i), upcoming_gathers());
  }
  ZERO_RETURN_IF_ERROR(end_phase(&PhaseTimes::forward));
  ZERO_RETURN_IF_ERROR(start_phase());
  Tensor dy;
  for (int i = static_cast<int>(units_.size()) - 1; i >= 0; --i) {
    if (runs[i]) {
      ZERO_RETURN_IF_ERROR(acquire(i));
      ZERO_ASSIGN_OR_RETURN(ParamViews grads, grad_views(i));
      ZERO_ASSIGN_OR_RETURN(dy, units_[i].unit->backward(ctx, param_views(i), grads, dy));
      release(i, upcoming_gathers());
    } else if (reduces_this_micro_batch()) {
      ZERO_RETURN_IF_ERROR(staging_of(i).status());  // its zero gradient joins the bucket's reduction
    }
    if (reduces_this_micro_batch()) ZERO_RETURN_IF_ERROR(grads_ready(i));
  }
  for (Bucket& b : buckets_) ZERO_RETURN_IF_ERROR(finish_reduction(b));
  ZERO_RETURN_IF_ERROR(end_phase(&PhaseTimes::backward));
  loss_sum_ += ctx.loss;
  correct_ += ctx.correct;
  predictions_ += ctx.predictions;
  ++micro_batches_done_;
  return absl::OkStatus();
}

absl::StatusOr<Evaluation> Engine::evaluate(const Batch& batch,
                                            const std::function<absl::Status(const Tensor&)>& on_output) {
  if (micro_batches_done_ != 0) {
    return absl::FailedPreconditionError("evaluate between forward_backward and step; evaluate after step()");
  }
  UnitContext ctx{.allocator = allocator_, .batch = batch, .device = device_, .step = step_count_};
  ZERO_ASSIGN_OR_RETURN(const std::vector<bool> runs, units_that_run(ctx));
  std::vector<int> order;  // stage 3: the gathers of this pass, known in advance, so prefetched along
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!runs[i]) continue;
    for (int owner : units_[i].needs) {
      if (units_[owner].sharded) order.push_back(owner);
    }
  }
  size_t gathered = 0;
  Tensor x;
  Unit* previous = nullptr;  // the last unit that ran: what it saved is freed once the next has read x
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!runs[i]) continue;
    for (int owner : units_[i].needs) {
      if (!units_[owner].sharded) continue;
      ZERO_RETURN_IF_ERROR(gather_now(owner));
      ++gathered;
    }
    const std::span<const int> upcoming = std::span<const int>(order).subspan(gathered);
    ZERO_RETURN_IF_ERROR(prefetch(upcoming));
    ZERO_ASSIGN_OR_RETURN(x, units_[i].unit->forward(ctx, param_views(static_cast<int>(i)), x));
    release(static_cast<int>(i), upcoming);
    if (previous != nullptr) previous->release_saved();
    previous = units_[i].unit;
  }
  if (on_output) ZERO_RETURN_IF_ERROR(on_output(x));
  if (previous != nullptr) previous->release_saved();
  return Evaluation{.loss = ctx.loss, .correct = ctx.correct, .predictions = ctx.predictions};
}

Tensor Engine::grad_slice(const UnitState& u) const {
  if (config_.stage >= 2) return u.grads.tensor(dtype_, {u.layout.shard_numel});
  const int64_t begin = u.layout.shard_begin(comm_.rank());
  return u.grads.tensor(dtype_, {u.layout.padded_numel}).slice(begin, begin + u.layout.shard_numel);
}

Tensor Engine::own_grads(const UnitState& u) const {
  if (config_.stage == 0) return u.grads.tensor(dtype_, {u.layout.padded_numel}).slice(0, u.layout.numel);
  return grad_slice(u);
}

absl::StatusOr<double> Engine::global_grad_norm() {
  // The exact global sum of squares (optim/square_sum.h) of the unscaled gradients, each rank summing
  // its slice (stage 0 too, so no element counts twice), combined with one int32 allreduce: the same bits for every stage and world size. A NaN or infinity
  // anywhere makes it non-finite on every rank, which is how fp16 overflow is agreed.
  const float unscale = static_cast<float>(loss_scale_);
  SquareSum sum;
  for (const UnitState& u : units_) {
    ZERO_ASSIGN_OR_RETURN(const SquareSum unit_sum, exact_square_sum(grad_slice(u), unscale));
    sum.merge(unit_sum);
  }
  std::vector<int32_t> wire(SquareSum::kWireInts);
  sum.to_wire(wire.data());
  Work allreduce = counted(&CommVolume::small, [&] {
    return comm_.allreduce(Tensor(wire.data(), DType::kI32, {SquareSum::kWireInts}), ReduceOp::kSum);
  });
  ZERO_RETURN_IF_ERROR(wait_for(allreduce));
  return std::sqrt(SquareSum::from_wire(wire.data()).value());
}

absl::Status Engine::update(float lr, double clip_coefficient) {
  // A unit kept whole at stages 1-3 allgathers the slice this rank updated. The allgather runs on the
  // communication thread while the next unit updates; all are waited for at the end (also after an error,
  // so no collective is left writing into the parameters).
  std::vector<Work> gathers;
  absl::Status status;
  for (UnitState& u : units_) {
    status = update_unit(u, lr, clip_coefficient);
    if (!status.ok()) break;
    if (config_.stage == 0 || u.sharded) continue;
    const auto [begin, count] = own_range(u);
    const Tensor held = u.params.tensor(dtype_, {u.layout.padded_numel});
    gathers.push_back(
        counted(&CommVolume::param_gather, [&] { return comm_.allgather(held.slice(begin, begin + count), held); }));
  }
  for (Work& gather : gathers) status.Update(wait_for(gather));
  return status;
}

absl::Status Engine::update_unit(UnitState& u, float lr, double clip_coefficient) {
  // fp32 gradients for the optimizer: in place for fp32, else in workspace, unscaled and clipped in the
  // same order of operations on every stage.
  const float unscale = static_cast<float>(loss_scale_);
  const float clip = static_cast<float>(clip_coefficient);
  const auto [begin, count] = own_range(u);
  const Tensor grads = own_grads(u);
  Buffer grads32_buffer;
  Tensor grads32 = grads;
  if (dtype_ != DType::kF32) {
    ZERO_ASSIGN_OR_RETURN(grads32_buffer, allocator_.allocate(count * 4, MemoryCategory::kWorkspace, device_));
    grads32 = grads32_buffer.tensor(DType::kF32, {count});
    ZERO_RETURN_IF_ERROR(kernels::cast(grads32, grads));
  }
  if (unscale != 1.0f) ZERO_RETURN_IF_ERROR(kernels::divide_by(grads32, unscale));
  if (clip < 1.0f) ZERO_RETURN_IF_ERROR(kernels::multiply_by(grads32, clip));
  const Tensor held = u.params.tensor(dtype_, {u.held_numel()});
  const Tensor own_params = u.sharded ? held : held.slice(begin, begin + count);
  Communicator* comm = config_.stage == 0 ? nullptr : &comm_;
  if (dtype_ == DType::kF32) {
    ZERO_RETURN_IF_ERROR(u.optimizer->step(own_params, grads32, step_count_, lr, comm));
  } else {
    ZERO_RETURN_IF_ERROR(u.optimizer->step(u.master.tensor(DType::kF32, {count}), grads32, step_count_, lr, comm,
                                           HalfCopy{.out = own_params}));
  }
  return page_out_offloaded(u);
}

void Engine::adjust_loss_scale(bool overflow) {
  const LossScaling& ls = config_.loss_scaling;
  if (dtype_ != DType::kF16 || ls.static_scale > 0) return;
  // As DeepSpeed's DynamicLossScaler: hysteresis delays only the first halving after a scale-up.
  if (overflow) {
    good_steps_ = 0;
    if (hysteresis_left_ <= 1) {
      loss_scale_ = std::max(ls.min_scale, loss_scale_ / 2);
    } else {
      --hysteresis_left_;
    }
    return;
  }
  if (++good_steps_ >= ls.window) {
    loss_scale_ *= 2;
    good_steps_ = 0;
    hysteresis_left_ = ls.hysteresis;
  }
}

absl::StatusOr<StepResult> Engine::step(float lr) {
  if (micro_batches_done_ != config_.accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat("step() after ", micro_batches_done_,
                                                      " micro-batches; accumulation_steps is ",
                                                      config_.accumulation_steps));
  }
  ZERO_RETURN_IF_ERROR(start_phase());
  absl::Cleanup close_phase = [this] { phase_open_ = false; };  // a failed phase adds no time
  ZERO_RETURN_IF_ERROR(release_all_gathers());  // prefetches the step did not use, after an order change
  StepResult result{.loss_scale = loss_scale_};
  double clip_coefficient = 1.0;
  if (config_.gradient_clipping > 0 || dtype_ == DType::kF16) {
    ZERO_ASSIGN_OR_RETURN(result.grad_norm, global_grad_norm());
    result.skipped = !std::isfinite(result.grad_norm);
    if (config_.gradient_clipping > 0) {
      clip_coefficient = config_.gradient_clipping / (result.grad_norm + 1e-6);  // torch clip_grad_norm_
    }
  }
  adjust_loss_scale(result.skipped);
  if (!result.skipped) {
    ++step_count_;
    ZERO_RETURN_IF_ERROR(update(lr, clip_coefficient));
  }
  for (UnitState& u : units_) ZERO_RETURN_IF_ERROR(kernels::fill_zero(u.grads.tensor(DType::kU8, {u.grads.nbytes()})));
  float metrics[3] = {static_cast<float>(loss_sum_), static_cast<float>(correct_), static_cast<float>(predictions_)};
  Work allreduce =
      counted(&CommVolume::small, [&] { return comm_.allreduce(Tensor(metrics, DType::kF32, {3}), ReduceOp::kSum); });
  ZERO_RETURN_IF_ERROR(wait_for(allreduce));
  ZERO_RETURN_IF_ERROR(end_phase(&PhaseTimes::update));
  result.loss = metrics[0] / static_cast<float>(comm_.world_size() * config_.accumulation_steps);
  result.correct = static_cast<int64_t>(metrics[1]);
  result.predictions = static_cast<int64_t>(metrics[2]);
  if (!order_matches_) recorded_order_ = this_step_order_;
  micro_batches_done_ = 0;
  loss_sum_ = 0;
  correct_ = 0;
  predictions_ = 0;
  return result;
}

absl::StatusOr<StepResult> Engine::train_step(std::span<const Batch> micro_batches, float lr) {
  if (static_cast<int>(micro_batches.size()) != config_.accumulation_steps) {
    return absl::InvalidArgumentError(absl::StrCat("train_step got ", micro_batches.size(),
                                                   " micro-batches; accumulation_steps is ",
                                                   config_.accumulation_steps));
  }
  for (const Batch& batch : micro_batches) ZERO_RETURN_IF_ERROR(forward_backward(batch));
  return step(lr);
}

// --- Full parameters ------------------------------------------------------------------------------------

absl::Status Engine::visit_full_params(
    const std::function<absl::Status(absl::string_view, absl::string_view, const Tensor&)>& visit) {
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    if (u.sharded) ZERO_RETURN_IF_ERROR(gather_now(static_cast<int>(i)));
    Buffer host_copy;
    ZERO_ASSIGN_OR_RETURN(const Tensor full, on_host(full_params(static_cast<int>(i)), allocator_, host_copy));
    for (size_t p = 0; p < u.layout.params.size(); ++p) {
      const auto [unit, param] = model_param_name(u.name, u.layout.params[p].name);
      ZERO_RETURN_IF_ERROR(visit(unit, param, full.view(u.layout.params[p].offset, u.layout.shapes[p])));
    }
    if (u.sharded) u.gathered.reset();
  }
  return absl::OkStatus();
}

absl::Status Engine::load_params(
    const std::function<absl::Status(absl::string_view, absl::string_view, Tensor)>& fill) {
  for (UnitState& u : units_) {
    ZERO_ASSIGN_OR_RETURN(Buffer full, allocator_.allocate(u.layout.padded_numel * 4, MemoryCategory::kWorkspace));
    std::memset(full.data(), 0, full.nbytes());
    const Tensor all = full.tensor(DType::kF32, {u.layout.padded_numel});
    for (size_t p = 0; p < u.layout.params.size(); ++p) {
      const auto [unit, param] = model_param_name(u.name, u.layout.params[p].name);
      ZERO_RETURN_IF_ERROR(fill(unit, param, all.view(u.layout.params[p].offset, u.layout.shapes[p])));
    }
    ZERO_RETURN_IF_ERROR(assign_params(u, floats(full), 0));
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
