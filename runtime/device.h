// Where memory lives: the host CPU, CUDA device k, or simulated device k (runtime/sim/: CUDA's rules, checked).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zero {

enum class DeviceType : uint8_t { kCpu, kCuda, kSim };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int index) { return {DeviceType::kCuda, index}; }
  static constexpr Device sim(int index) { return {DeviceType::kSim, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool is_sim() const { return type == DeviceType::kSim; }
  bool operator==(const Device&) const = default;
  std::string to_string() const {
    if (is_cpu()) return "cpu";
    return absl::StrCat(is_cuda() ? "cuda:" : "sim:", index);
  }
};

// Visible CUDA devices; 0 when there is no driver or no device, or zero was built without CUDA (never an error).
int cuda_device_count();
// Why cuda_device_count() is 0 and what fixes it, for messages: no GPU or driver, a driver older than the CUDA
// zero was built with, or a build without CUDA. The CUDA error alone misleads: with no driver at all, CUDA
// reports cudaErrorInsufficientDriver, as for an old one.
std::string why_no_cuda_device();
// OK when cuda:index is visible, else FailedPrecondition saying why: the check a run that asks for a GPU makes
// before its first CUDA call, which would fail with the bare CUDA error.
absl::Status check_cuda_device(int index);

}  // namespace zero
