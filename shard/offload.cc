// NVMe offload: placing the optimizer and the parameter shards in files, moving a unit's, and the optimizer's swapper.
#include "shard/offload.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/device_api.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"

namespace zero {

absl::Status place_optimizer_in_files(Allocator& allocator, const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  for (MemoryCategory category : {MemoryCategory::kOptimizerState, MemoryCategory::kMasterWeights}) {
    const absl::Status placed = allocator.place_in_files(category, dir);
    if (!placed.ok()) {
      return absl::Status(placed.code(), absl::StrCat("offloading the optimizer to ", dir, ": ", placed.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Buffer> allocate_held_params(const UnitState& u, Allocator& allocator, DType dtype, Device device,
                                            const std::string& offload_param_dir, bool to_host) {
  const int64_t nbytes = u.held_numel * static_cast<int64_t>(dtype_size(dtype));
  if (!u.sharded || nbytes == 0) return allocator.allocate(nbytes, MemoryCategory::kParams, device);
  if (to_host) {  // page-locked, so the copy to the device for each gather runs beside the host
    DeviceApi* api = device_api(device);
    if (api == nullptr) return absl::InvalidArgumentError("parameter shards in host memory need an engine on a device");
    return allocator.allocate_pinned(*api, nbytes, MemoryCategory::kParams);
  }
  if (offload_param_dir.empty()) return allocator.allocate(nbytes, MemoryCategory::kParams, device);
  absl::StatusOr<Buffer> in_file = allocator.allocate_in_file(nbytes, MemoryCategory::kParams, offload_param_dir);
  if (in_file.ok()) return in_file;
  return absl::Status(in_file.status().code(), absl::StrCat("offloading the parameters to ", offload_param_dir, ": ",
                                                            in_file.status().message()));
}

namespace {

// The unit's optimizer tensors that are in files: the master weights, where there are any, and each state.
std::vector<const void*> optimizer_tensors_in_files(const UnitState& u) {
  std::vector<const void*> tensors;
  if (u.master.data() != nullptr) tensors.push_back(u.master.data());
  for (const auto& [name, state] : u.optimizer->state()) {
    if (state.data() != nullptr) tensors.push_back(state.data());
  }
  return tensors;
}

}  // namespace

absl::Status move_offloaded(const UnitState& u, Allocator& allocator, FileMove move) {
  ZERO_RETURN_IF_ERROR((allocator.*move)(u.params.data()));
  for (const void* tensor : optimizer_tensors_in_files(u)) ZERO_RETURN_IF_ERROR((allocator.*move)(tensor));
  return absl::OkStatus();
}

// --- OptimizerSwapper ------------------------------------------------------------------------------------

namespace {

// "master weights, exp_avg, exp_avg_sq": what optimizer_tensors_in_files holds, by name.
std::string tensor_names(const UnitState& u) {
  std::string names = u.master.data() != nullptr ? "master weights" : "";
  for (const auto& [name, state] : u.optimizer->state()) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
  return names;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OptimizerSwapper>> OptimizerSwapper::create(std::span<const UnitState> units,
                                                                           Allocator& allocator,
                                                                           const ZeroConfig::OptimizerSwap& options) {
  const UnitState* largest = nullptr;  // the unit with the most tensors in files
  size_t per_unit = 0;
  for (const UnitState& u : units) {
    const size_t tensors = optimizer_tensors_in_files(u).size();
    if (tensors <= per_unit) continue;
    per_unit = tensors;
    largest = &u;
  }
  const int units_count = static_cast<int>(units.size());
  const int units_in_ram = per_unit == 0 ? units_count : options.buffer_count / static_cast<int>(per_unit);
  const bool pipelined = options.pipeline_read || options.pipeline_write;
  const int needed = pipelined ? 2 : 1;
  if (units_in_ram < std::min(needed, units_count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer_swap.buffer_count (DeepSpeed's offload_optimizer.buffer_count) = ", options.buffer_count,
        ": one unit's update holds ", per_unit, " optimizer tensors in RAM (", tensor_names(*largest), ")",
        pipelined ? ", and a pipelined read or write one more unit's" : "", "; set buffer_count to at least ",
        needed * per_unit));
  }
  return std::unique_ptr<OptimizerSwapper>(new OptimizerSwapper(units, allocator, options, units_in_ram));
}

OptimizerSwapper::OptimizerSwapper(std::span<const UnitState> units, Allocator& allocator,
                                   const ZeroConfig::OptimizerSwap& options, int units_in_ram)
    : names_([&] {
        std::vector<std::string> names;
        for (const UnitState& u : units) names.push_back(u.name);
        return names;
      }()),
      tensors_([&] {
        std::vector<std::vector<const void*>> tensors;
        for (const UnitState& u : units) tensors.push_back(optimizer_tensors_in_files(u));
        return tensors;
      }()),
      allocator_(allocator), options_(options), units_in_ram_(units_in_ram), held_(units.size(), Held::kNo),
      queued_(units.size(), 0), failure_(units.size()) {}

OptimizerSwapper::~OptimizerSwapper() {
  io_.synchronize();
  const absl::Status unreported = take_failures();
  if (!unreported.ok()) {  // a destructor cannot return it, and dropping it would hide a lost transfer
    std::fprintf(stderr, "zero: rank %d: %s\n", allocator_.rank(), unreported.ToString().c_str());
  }
}

void OptimizerSwapper::set_held(int i, Held held) {
  held_count_ += (held != Held::kNo) - (held_[i] != Held::kNo);
  held_[i] = held;
}

void OptimizerSwapper::queue(int i, FileMove move, Held then) {
  set_held(i, then);
  {
    absl::MutexLock lock(&mu_);
    ++queued_[i];
  }
  const bool reads = move == &Allocator::page_in;
  io_.submit([this, i, move, reads] {
    absl::Status status;
    for (const void* tensor : tensors_[i]) {
      if (status.ok()) status = (allocator_.*move)(tensor);
    }
    absl::MutexLock lock(&mu_);
    --queued_[i];
    if (status.ok()) return;
    failure_[i].Update(absl::Status(
        status.code(), absl::StrCat(reads ? "reading" : "writing", " the optimizer state of unit '", names_[i],
                                    reads ? "' from" : "' to", " its files: ", status.message())));
  });
}

absl::Status OptimizerSwapper::take_failure(int i) {
  absl::Status failure = std::exchange(failure_[i], absl::OkStatus());
  if (!failure.ok() && held_[i] != Held::kNo) set_held(i, Held::kNo);
  return failure;
}

absl::Status OptimizerSwapper::wait_for(int i) {
  absl::MutexLock lock(&mu_);
  const auto done = [this, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queued_[i] == 0; };
  mu_.Await(absl::Condition(&done));
  return take_failure(i);
}

absl::Status OptimizerSwapper::take_failures() {
  absl::MutexLock lock(&mu_);
  absl::Status failures;
  for (int i = 0; i < static_cast<int>(held_.size()); ++i) {
    if (queued_[i] == 0) failures.Update(take_failure(i));  // a unit still moving reports once it is done
  }
  return failures;
}

void OptimizerSwapper::read_ahead_from(int first) {
  if (!options_.pipeline_read) return;
  for (int j = first; j < static_cast<int>(held_.size()) && held_count_ < units_in_ram_; ++j) {
    if (held_[j] == Held::kNo) queue(j, &Allocator::page_in, Held::kReadAhead);
  }
}

absl::Status OptimizerSwapper::acquire(int i) {
  if (held_[i] == Held::kNo) {
    if (held_count_ == units_in_ram_) ZERO_RETURN_IF_ERROR(settle());  // out of the update's order: start over
    queue(i, &Allocator::page_in, Held::kAcquired);
  }
  set_held(i, Held::kAcquired);
  read_ahead_from(i + 1);
  return wait_for(i);
}

absl::Status OptimizerSwapper::release(int i) {
  queue(i, &Allocator::page_out, Held::kNo);
  return options_.pipeline_write ? absl::OkStatus() : wait_for(i);
}

absl::Status OptimizerSwapper::end_step() {
  read_ahead_from(0);
  return take_failures();
}

absl::Status OptimizerSwapper::settle() {
  io_.synchronize();
  absl::Status status = take_failures();
  for (int i = 0; i < static_cast<int>(held_.size()); ++i) {
    if (held_[i] == Held::kNo) continue;
    // What was read ahead is unchanged (drop_unchanged writes it after all where its file is stale).
    const FileMove move = held_[i] == Held::kAcquired ? &Allocator::page_out : &Allocator::drop_unchanged;
    for (const void* tensor : tensors_[i]) status.Update((allocator_.*move)(tensor));
    set_held(i, Held::kNo);
  }
  return status;
}

}  // namespace zero
