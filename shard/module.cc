#include "shard/module.h"

#include "runtime/status.h"

namespace zero {

const Tensor& ParamViews::at(absl::string_view name) const {
  auto it = views_.find(name);
  ZERO_CHECK(it != views_.end(), "no parameter view named '", name, "'; declare it in param_specs() or tied_params()");
  return it->second;
}

}  // namespace zero
