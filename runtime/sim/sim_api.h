// The process-wide simulated device behind Device::sim memory and kernels, and the launch of a CPU kernel on it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/device_api.h"
#include "runtime/sim/sim_device.h"

namespace zero {

// Made on first use, checker on, with the environment's ZERO_SIM_DELAY_US (the most a stream sleeps before each
// operation, default 0) and ZERO_SIM_SEED (its generator's seed, default 0). It lives as long as the process.
sim::SimDevice& sim_device();

// A launch body's view of its tensors (LaunchContext::host_tensor); the first failure is kept for status().
class HostTensors {
 public:
  explicit HostTensors(const LaunchContext& ctx) : ctx_(ctx) {}
  Tensor operator()(const Tensor& t);
  const absl::Status& status() const { return status_; }

 private:
  const LaunchContext& ctx_;
  absl::Status status_;
};

// Queues `cpu_kernel` on the calling thread's current stream of `device`, where CUDA queues zero's kernels, declaring
// `accesses`. It runs on that stream's thread with each tensor it passes through HostTensors re-pointed at
// memory the host may touch, so it computes what the CPU computes, bit for bit. With `wait`, returns once it
// ran: for kernels whose results the host reads, as CUDA's would copy them back.
absl::Status launch_on_sim(Device device, std::string name, std::vector<Access> accesses,
                           std::function<absl::Status(HostTensors& host)> cpu_kernel, bool wait = false);

}  // namespace zero
