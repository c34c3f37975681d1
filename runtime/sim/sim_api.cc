// The process-wide simulated device, configured from the environment, and CPU kernels launched on it.
#include "runtime/sim/sim_api.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero {
namespace {

template <typename T>
T from_environment(const char* name, T fallback) {
  const char* text = std::getenv(name);
  T value{};
  return text != nullptr && absl::SimpleAtoi(text, &value) ? value : fallback;
}

}  // namespace

sim::SimDevice& sim_device() {
  static sim::SimDevice* const device = [] {
    absl::StatusOr<std::unique_ptr<sim::SimDevice>> made =
        sim::SimDevice::create({.max_delay_us = from_environment<int>("ZERO_SIM_DELAY_US", 0),
                                .seed = from_environment<uint64_t>("ZERO_SIM_SEED", 0)});
    ZERO_CHECK(made.ok(), "the simulated device could not be made: ", made.status().message());
    return made->release();  // never destroyed: rank threads may still hold its memory at exit
  }();
  return *device;
}

Tensor HostTensors::operator()(const Tensor& t) {
  absl::StatusOr<Tensor> host = ctx_.host_tensor(t);
  if (host.ok()) return *host;
  status_.Update(host.status());
  return Tensor();
}

absl::Status launch_on_sim(Device device, std::string name, std::vector<Access> accesses,
                           std::function<absl::Status(HostTensors& host)> cpu_kernel, bool wait) {
  const Stream stream = current_stream(device);
  KernelLaunch launch{.name = std::move(name),
                      .accesses = std::move(accesses),
                      .body = [kernel = std::move(cpu_kernel)](const LaunchContext& ctx) {
                        HostTensors host(ctx);
                        absl::Status status = kernel(host);
                        status.Update(host.status());
                        return status;
                      }};
  sim::SimDevice& sim = sim_device();
  const int previous = sim.current_device();  // set and restored around it, as CUDA kernels' device guard does
  ZERO_RETURN_IF_ERROR(sim.set_current_device(device.index));
  absl::Status launched = sim.launch(stream, std::move(launch));
  launched.Update(sim.set_current_device(previous));
  if (!launched.ok() || !wait) return launched;
  return sim.synchronize(stream);
}

}  // namespace zero
