// Streams as worker threads, operations as nodes that wait for what CUDA orders before them, each access checked
// against the accesses it conflicts with when it is queued.
#include "runtime/sim/sim_device.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "runtime/cpu_threads.h"
#include "runtime/splitmix64.h"
#include "runtime/status.h"

namespace zero::sim {

struct SimDevice::Op {
  std::shared_ptr<const OpStamp> stamp;
  VectorClock clock;
  std::vector<std::shared_ptr<Op>> after;  // must have run before this starts
  std::function<absl::Status()> run;       // empty for markers (event records and waits)
  bool done = false;                       // guarded by the device's mu_
};

struct SimDevice::StreamState {
  Stream handle;
  StreamFlags flags = StreamFlags::kBlocking;
  Agent agent = 0;
  std::string name;          // "sim:0 stream 3"
  std::shared_ptr<Op> tail;  // the last operation queued
  std::deque<std::shared_ptr<Op>> queue;
  bool stopping = false;
  bool ended = false;  // its worker returned, or is about to with nothing left to do: join it
  uint64_t draws = 0;  // delays drawn so far
  std::thread worker;
  bool is_legacy() const { return handle.id == 0; }
};

namespace {

class SimLaunchContext final : public LaunchContext {
 public:
  SimLaunchContext(uintptr_t alias_shift, const std::vector<Access>& accesses)
      : alias_shift_(alias_shift), accesses_(accesses) {}
  void* native_stream() const override { return nullptr; }
  absl::StatusOr<void*> host_pointer(const void* device_ptr, size_t bytes) const override {
    const auto p = reinterpret_cast<uintptr_t>(device_ptr);
    for (const Access& a : accesses_) {
      const auto begin = reinterpret_cast<uintptr_t>(a.ptr);
      if (begin <= p && p - begin <= a.bytes && bytes <= a.bytes - (p - begin)) {  // p + bytes may wrap
        return reinterpret_cast<void*>(p + alias_shift_);
      }
    }
    return absl::FailedPreconditionError(absl::StrCat("a launch body reached ", bytes, " bytes at 0x", absl::Hex(p),
                                                      ", which its launch did not declare"));
  }

 private:
  const uintptr_t alias_shift_;
  const std::vector<Access>& accesses_;
};

bool is_legacy_ordered(StreamFlags flags) { return flags == StreamFlags::kBlocking; }

// The calling thread, never reused: a std::thread::id is, once its thread ended, and a new thread must start on
// device 0 ordered after nothing, not inherit an ended thread's device and clock.
uint64_t this_thread_serial() {
  static std::atomic<uint64_t> next{0};
  thread_local const uint64_t serial = next++;
  return serial;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SimDevice>> SimDevice::create(SimOptions options) {
  if (options.devices < 1) return absl::InvalidArgumentError("a simulated device needs devices >= 1");
  ZERO_ASSIGN_OR_RETURN(SimMemory memory, SimMemory::create(options.memory_bytes, options.quarantine_bytes));
  return std::unique_ptr<SimDevice>(new SimDevice(options, std::move(memory)));
}

SimDevice::SimDevice(SimOptions options, SimMemory memory)
    : options_(options), alias_shift_(memory.alias_shift()), memory_(std::move(memory)) {}

SimDevice::~SimDevice() {
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : streams_) destroyed_.push_back(std::move(s));
    for (auto& s : destroyed_) {
      s->stopping = true;
      if (s->worker.joinable()) workers.push_back(std::move(s->worker));
    }
  }
  for (std::thread& w : workers) w.join();
  absl::MutexLock lock(&mu_);
  for (void* ptr : unordered_pinned_frees_) std::free(ptr);
  for (const auto& [base, bytes] : pinned_) std::free(reinterpret_cast<void*>(base));  // as a context's teardown
}

// --- Threads, devices, streams and events --------------------------------------------------------------

SimDevice::HostThread& SimDevice::host_thread() {
  auto [it, inserted] = hosts_.try_emplace(this_thread_serial());
  if (inserted) it->second.agent = next_agent_++;
  return it->second;
}

absl::Status SimDevice::check_device(int device) const {
  if (device >= 0 && device < options_.devices) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("sim:", device, " is not there: the simulated device has ", options_.devices, " devices"));
}

absl::Status SimDevice::set_current_device(int device) {
  ZERO_RETURN_IF_ERROR(check_device(device));
  absl::MutexLock lock(&mu_);
  host_thread().device = device;
  return absl::OkStatus();
}

int SimDevice::current_device() const {
  absl::MutexLock lock(&mu_);
  const auto it = hosts_.find(this_thread_serial());
  return it == hosts_.end() ? 0 : it->second.device;
}

absl::StatusOr<Stream> SimDevice::create_stream(int device, StreamFlags flags) {
  ZERO_RETURN_IF_ERROR(check_device(device));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_handle_++;
  auto s = std::make_unique<StreamState>();
  s->handle = {device, id};
  s->flags = flags;
  s->agent = next_agent_++;
  s->name = absl::StrCat("sim:", device, " stream ", id);
  start_worker(*s);
  pthread_setname_np(s->worker.native_handle(), absl::StrCat("sim", device, "s", id).substr(0, 15).c_str());
  streams_[id] = std::move(s);
  return Stream{device, id};
}

SimDevice::StreamState& SimDevice::legacy_stream(int device) {
  const auto it = legacy_ids_.find(device);
  if (it != legacy_ids_.end()) return *streams_[it->second];
  const uint64_t key = next_handle_++;  // an internal id: handles name it as {device, 0}
  auto s = std::make_unique<StreamState>();
  s->handle = Stream::legacy(device);
  s->agent = next_agent_++;
  s->name = absl::StrCat("sim:", device, " legacy stream");
  start_worker(*s);
  StreamState& state = *s;
  streams_[key] = std::move(s);
  legacy_ids_[device] = key;
  return state;
}

absl::StatusOr<SimDevice::StreamState*> SimDevice::stream_state(Stream stream) {
  ZERO_RETURN_IF_ERROR(check_device(stream.device));
  if (stream.id == 0) return &legacy_stream(stream.device);
  const auto it = streams_.find(stream.id);
  if (it == streams_.end() || it->second->is_legacy() || it->second->handle.device != stream.device) {
    return absl::InvalidArgumentError(absl::StrCat("stream ", stream.id, " on sim:", stream.device,
                                                   " is not a live stream (destroyed, or never made)"));
  }
  return it->second.get();
}

absl::Status SimDevice::destroy_stream(Stream stream) {
  // Joined here: streams destroyed before whose workers returned, and this one when it has nothing left to run.
  // A stream with work queued is joined later, so that destroying it does not wait for its work (as on a GPU).
  std::vector<std::unique_ptr<StreamState>> ended;
  {
    absl::MutexLock lock(&mu_);
    ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
    if (s->is_legacy()) return absl::InvalidArgumentError("the legacy default stream cannot be destroyed");
    s->stopping = true;  // its worker runs what is queued, then ends
    const bool idle = s->tail == nullptr || s->tail->done;
    const auto running = std::partition(destroyed_.begin(), destroyed_.end(), [](const auto& d) { return d->ended; });
    ended.assign(std::make_move_iterator(destroyed_.begin()), std::make_move_iterator(running));
    destroyed_.erase(destroyed_.begin(), running);
    (idle ? ended : destroyed_).push_back(std::move(streams_[stream.id]));
    streams_.erase(stream.id);
  }
  for (const auto& d : ended) d->worker.join();
  return absl::OkStatus();
}

absl::StatusOr<Event> SimDevice::create_event(int device) {
  ZERO_RETURN_IF_ERROR(check_device(device));
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_handle_++;
  events_[id] = {.device = device};
  return Event{device, id};
}

absl::StatusOr<SimDevice::EventState*> SimDevice::event_state(Event event) {
  const auto it = events_.find(event.id);
  if (it == events_.end()) return absl::InvalidArgumentError(absl::StrCat("event ", event.id, " is not live"));
  return &it->second;
}

absl::Status SimDevice::destroy_event(Event event) {
  absl::MutexLock lock(&mu_);
  ZERO_RETURN_IF_ERROR(event_state(event).status());
  events_.erase(event.id);
  return absl::OkStatus();
}

// --- Ordering ---------------------------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<SimDevice::Op>> SimDevice::enqueue(StreamState& stream, std::string name,
                                                                  const std::vector<Touch>& touches,
                                                                  std::function<absl::Status()> run) {
  ZERO_RETURN_IF_ERROR(error_);
  auto op = std::make_shared<Op>();
  op->clock = host_thread().clock;  // what the host did before queueing it
  const auto add_after = [&](const std::shared_ptr<Op>& before) {
    if (before == nullptr) return;
    op->after.push_back(before);
    op->clock.join(before->clock);
  };
  add_after(stream.tail);
  if (stream.is_legacy()) {
    for (const auto& [id, s] : streams_) {
      if (s->handle.device == stream.handle.device && !s->is_legacy() && is_legacy_ordered(s->flags))
        add_after(s->tail);
    }
  } else if (is_legacy_ordered(stream.flags)) {
    add_after(legacy_stream(stream.handle.device).tail);
  }
  const uint64_t tick = op->clock.tick(stream.agent);
  op->stamp = std::make_shared<const OpStamp>(
      OpStamp{.agent = stream.agent, .tick = tick, .name = absl::StrCat(name, " on ", stream.name, " (#", tick, ")")});
  if (options_.check_order) {
    for (const Touch& t : touches) {
      ZERO_RETURN_IF_ERROR(violation(history_.access(t.block, t.begin, t.end, t.write, op->stamp, op->clock)));
    }
  }
  op->run = std::move(run);
  stream.tail = op;
  stream.queue.push_back(op);
  return op;
}

absl::Status SimDevice::violation(absl::Status status) {
  if (status.ok()) return status;
  status = absl::Status(status.code(), absl::StrCat("simulated device, happens-before: ", status.message()));
  error_.Update(status);  // sticky, as a fault on the device would be: a free's caller may not see it
  return status;
}

absl::Status SimDevice::record(Event event, Stream stream) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(EventState * e, event_state(event));
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  if (e->device != s->handle.device) {
    return absl::InvalidArgumentError(absl::StrCat("event ", event.id, " of sim:", e->device, " recorded on ", s->name,
                                                   ": events belong to one device"));
  }
  ZERO_ASSIGN_OR_RETURN(e->latest, enqueue(*s, absl::StrCat("record of event ", event.id), {}, nullptr));
  return absl::OkStatus();
}

absl::Status SimDevice::wait(Stream stream, Event event) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(EventState * e, event_state(event));
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  const std::shared_ptr<Op> recorded = e->latest;  // the latest record as of now, never a later one
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Op> marker,
                        enqueue(*s, absl::StrCat("wait for event ", event.id), {}, nullptr));
  if (recorded != nullptr) {
    marker->after.push_back(recorded);
    marker->clock.join(recorded->clock);
  }
  return absl::OkStatus();
}

absl::Status SimDevice::wait_for(std::shared_ptr<Op> op, bool order_host) {
  if (op == nullptr) return error_;
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return op->done; };
  mu_.Await(absl::Condition(&done));
  if (order_host) host_thread().clock.join(op->clock);
  return error_;
}

uint64_t SimDevice::host_synchronizations() {
  absl::MutexLock lock(&mu_);
  return host_thread().synchronizations;
}

absl::StatusOr<bool> SimDevice::query(Event event) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(EventState * e, event_state(event));
  const std::shared_ptr<Op>& recorded = e->latest;
  if (recorded != nullptr && !recorded->done) return false;
  if (recorded != nullptr) host_thread().clock.join(recorded->clock);  // seen done: ordered after it
  ZERO_RETURN_IF_ERROR(error_);
  return true;
}

absl::Status SimDevice::synchronize(Event event) {
  absl::MutexLock lock(&mu_);
  ++host_thread().synchronizations;
  ZERO_ASSIGN_OR_RETURN(EventState * e, event_state(event));
  return wait_for(e->latest);
}

absl::Status SimDevice::synchronize(Stream stream) {
  absl::MutexLock lock(&mu_);
  ++host_thread().synchronizations;
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  return wait_for(s->tail);
}

absl::Status SimDevice::synchronize_device(int device) {
  ZERO_RETURN_IF_ERROR(check_device(device));
  absl::MutexLock lock(&mu_);
  ++host_thread().synchronizations;
  std::vector<std::shared_ptr<Op>> tails;
  for (const auto& [id, s] : streams_) {
    if (s->handle.device == device) tails.push_back(s->tail);
  }
  for (const auto& s : destroyed_) {
    if (s->handle.device == device) tails.push_back(s->tail);
  }
  for (const std::shared_ptr<Op>& tail : tails) ZERO_RETURN_IF_ERROR(wait_for(tail));
  return error_;
}

// --- Memory -------------------------------------------------------------------------------------------------

absl::StatusOr<void*> SimDevice::allocate(size_t bytes, Stream stream) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  ZERO_ASSIGN_OR_RETURN(const Block block, memory_.allocate(bytes, stream.device));
  // The allocation is a write on `stream`: another stream's use must be ordered after it, in all of the block
  // (its bytes rounded up), which launches and copies may reach.
  const Touch whole{block.base, block.base, block.base + block.bytes, true};
  absl::StatusOr<std::shared_ptr<Op>> op = enqueue(*s, absl::StrCat("allocate of ", bytes, " bytes"), {whole}, nullptr);
  if (!op.ok()) {
    memory_.retire(block.base);
    memory_.quarantine(block);
    return op.status();
  }
  return reinterpret_cast<void*>(block.base);
}

absl::Status SimDevice::free(void* ptr, Stream stream) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  const Block* found = memory_.find(ptr, 0);
  if (found == nullptr || found->base != reinterpret_cast<uintptr_t>(ptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("free of 0x", absl::Hex(ptr), ": not a live allocation of the simulated device"));
  }
  const Block block = *found;
  // Set below, under mu_, before the body can take it: a free found unordered leaves the block's bytes alone, as
  // another stream may still be using them (and the failure is sticky anyway), as free_pinned does.
  auto unordered = std::make_shared<bool>(false);
  ZERO_ASSIGN_OR_RETURN(std::shared_ptr<Op> op,
                        enqueue(*s, absl::StrCat("free of ", block.bytes, " bytes"), {}, [this, block, unordered] {
                          absl::MutexLock lock(&mu_);
                          if (!*unordered) memory_.quarantine(block);
                          return absl::OkStatus();
                        }));
  memory_.retire(block.base);  // no later operation may name it
  if (!options_.check_order) return absl::OkStatus();
  absl::Status ordered = violation(history_.release(block.base, *op->stamp, op->clock));
  *unordered = !ordered.ok();
  return ordered;
}

absl::StatusOr<void*> SimDevice::allocate_pinned(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* ptr = rounded < bytes ? nullptr : std::aligned_alloc(256, rounded);  // rounding up wrapped: too large
  if (ptr == nullptr) return absl::ResourceExhaustedError(absl::StrCat("pinned host memory: ", bytes, " bytes"));
  absl::MutexLock lock(&mu_);
  pinned_[reinterpret_cast<uintptr_t>(ptr)] = bytes;
  return ptr;
}

absl::Status SimDevice::free_pinned(void* ptr) {
  absl::MutexLock lock(&mu_);
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  if (pinned_.erase(base) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("free_pinned of 0x", absl::Hex(base), ": not pinned memory"));
  }
  // cudaFreeHost returns at once: every copy from or to it must be ordered before, on this host thread.
  HostThread& host = host_thread();
  const uint64_t tick = host.clock.tick(host.agent);
  const OpStamp stamp{.agent = host.agent, .tick = tick, .name = "free_pinned on a host thread"};
  absl::Status ordered = options_.check_order ? violation(history_.release(base, stamp, host.clock)) : absl::OkStatus();
  if (ordered.ok()) {
    std::free(ptr);
  } else {
    unordered_pinned_frees_.push_back(ptr);  // a stream may still touch it: freed once the streams stopped
  }
  return ordered;
}

absl::StatusOr<SimDevice::Side> SimDevice::side_of(const void* ptr, size_t bytes) const {
  if (memory_.contains(ptr)) {
    const Block* block = memory_.find(ptr, bytes);
    if (block == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(bytes, " bytes at 0x", absl::Hex(ptr),
                                                     " are not inside one live allocation of the simulated device"));
    }
    return Side{.on_device = true, .block = block->base, .device = block->device};
  }
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [base, size] : pinned_) {
    if (base <= p && p + bytes <= base + size) return Side{.on_device = false, .block = base};
  }
  return Side{};  // pageable host memory: untracked
}

absl::StatusOr<std::shared_ptr<SimDevice::Op>> SimDevice::enqueue_copy(StreamState& stream, void* dst, const void* src,
                                                                       size_t bytes, bool host_side_pageable) {
  ZERO_ASSIGN_OR_RETURN(const Side to, side_of(dst, bytes));
  ZERO_ASSIGN_OR_RETURN(const Side from, side_of(src, bytes));
  for (const Side& side : {to, from}) {
    if (side.on_device && side.device != stream.handle.device) {
      return absl::InvalidArgumentError(absl::StrCat("a copy on ", stream.name, " names memory of sim:", side.device,
                                                     ": copy on a stream of the device that holds it"));
    }
    if (!side.on_device && side.block == 0 && !host_side_pageable) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy_async on ", stream.name, " with pageable host memory: use allocate_pinned for it"));
    }
  }
  std::vector<Touch> touches;
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if (from.block != 0) touches.push_back({from.block, s, s + bytes, false});
  if (to.block != 0) touches.push_back({to.block, d, d + bytes, true});
  void* const out = to.on_device ? memory_.alias(dst) : dst;
  const void* const in = from.on_device ? memory_.alias(src) : src;
  return enqueue(stream, absl::StrCat(host_side_pageable ? "copy" : "copy_async", " of ", bytes, " bytes"), touches,
                 [out, in, bytes] {
                   if (bytes > 0) std::memmove(out, in, bytes);  // an empty tensor's pointer may be null
                   return absl::OkStatus();
                 });
}

absl::Status SimDevice::copy_async(void* dst, const void* src, size_t bytes, Stream stream) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  return enqueue_copy(*s, dst, src, bytes, /*host_side_pageable=*/false).status();
}

absl::Status SimDevice::copy(void* dst, const void* src, size_t bytes) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(const Side to, side_of(dst, bytes));
  ZERO_ASSIGN_OR_RETURN(const Side from, side_of(src, bytes));
  if (!to.on_device && !from.on_device) {
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  StreamState& legacy = legacy_stream(to.on_device ? to.device : from.device);
  ++host_thread().synchronizations;
  ZERO_ASSIGN_OR_RETURN(const std::shared_ptr<Op> op, enqueue_copy(legacy, dst, src, bytes, true));
  // cudaMemcpy returns once the copy is done only when it lands in host memory or comes from pinned memory; from
  // pageable memory it returns once the bytes are staged, from device memory at once. It runs here before the
  // call returns all the same (the caller's buffer is free again), but orders the host after it only as CUDA does.
  const bool from_pinned = !from.on_device && from.block != 0;
  return wait_for(op, /*order_host=*/!to.on_device || from_pinned);
}

absl::Status SimDevice::launch(Stream stream, KernelLaunch launch) {
  absl::MutexLock lock(&mu_);
  ZERO_ASSIGN_OR_RETURN(StreamState * s, stream_state(stream));
  if (host_thread().device != stream.device) {
    return absl::InvalidArgumentError(absl::StrCat("launch of '", launch.name, "' on ", s->name,
                                                   " while this thread's current device is sim:", host_thread().device,
                                                   ": set_current_device(", stream.device, ") first"));
  }
  std::vector<Touch> touches;
  for (const Access& a : launch.accesses) {
    if (a.bytes == 0) continue;
    const Block* block = memory_.contains(a.ptr) ? memory_.find(a.ptr, a.bytes) : nullptr;
    if (block == nullptr || block->device != stream.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "launch of '", launch.name, "' on ", s->name, " names ", a.bytes, " bytes at 0x", absl::Hex(a.ptr), ", ",
          block != nullptr ? absl::StrCat("memory of sim:", block->device)
                           : "which is not inside a live allocation of the device",
          ": kernels reach only their own device's memory"));
    }
    const auto begin = reinterpret_cast<uintptr_t>(a.ptr);
    touches.push_back({block->base, begin, begin + a.bytes, a.write});
  }
  auto body = std::make_shared<KernelLaunch>(std::move(launch));
  const std::string name = absl::StrCat("launch '", body->name, "'");
  // The kernel runs with the launching rank thread's share of the cores, as that thread would: ranks sharing a
  // stream (the legacy one) each keep their own.
  return enqueue(*s, name, touches,
                 [this, body, threads = cpu_threads()] {
                   set_cpu_threads(threads);
                   const SimLaunchContext ctx(alias_shift_, body->accesses);
                   return body->body(ctx);
                 })
      .status();
}

// --- The streams' threads ---------------------------------------------------------------------------------

void SimDevice::start_worker(StreamState& stream) {
  stream.worker = std::thread([this, raw = &stream] { run_stream(raw); });
}

void SimDevice::run_stream(StreamState* stream) {
  for (;;) {
    std::shared_ptr<Op> op;
    uint64_t draw = 0;
    {
      absl::MutexLock lock(&mu_);
      const auto has_work = [stream] { return stream->stopping || !stream->queue.empty(); };
      mu_.Await(absl::Condition(&has_work));
      if (stream->queue.empty()) {  // stopping, and everything ran
        stream->ended = true;
        return;
      }
      op = std::move(stream->queue.front());
      stream->queue.pop_front();
      const auto ready = [&op]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (const auto& before : op->after) {
          if (!before->done) return false;
        }
        return true;
      };
      mu_.Await(absl::Condition(&ready));
      draw = splitmix64(options_.seed ^ splitmix64(stream->agent) ^ stream->draws++);
    }
    if (options_.max_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(draw % (options_.max_delay_us + 1)));
    }
    absl::Status status = op->run ? op->run() : absl::OkStatus();
    absl::MutexLock lock(&mu_);
    op->done = true;
    op->after.clear();  // what it waited for may go
    if (!status.ok() && error_.ok()) {
      error_ = absl::Status(status.code(), absl::StrCat(op->stamp->name, " failed: ", status.message()));
    }
  }
}

}  // namespace zero::sim
