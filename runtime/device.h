// Where memory lives: the host CPU or CUDA device k.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"

namespace zero {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int index) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device&) const = default;
  std::string to_string() const { return is_cpu() ? "cpu" : absl::StrCat("cuda:", index); }
};

// Visible CUDA devices; 0 when there is no driver or no device, or zero was built without CUDA (never an error).
int cuda_device_count();
// Why cuda_device_count() is 0 (the CUDA error, e.g. a driver older than the toolkit), for messages.
std::string why_no_cuda_device();

}  // namespace zero
