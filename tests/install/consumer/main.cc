// Uses the installed zero: four in-process ranks allreduce their rank numbers, and GPT-2 d12's size.
#include <cstdio>

#include "models/gpt2_config.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"

int main() {
  float sums[4] = {};
  const absl::Status status = zero::root_cause(zero::run_local_ranks(4, [&](zero::Communicator& comm) {
    float value = static_cast<float>(comm.rank());
    ZERO_RETURN_IF_ERROR(comm.allreduce(zero::Tensor(&value, zero::DType::kF32, {1}), zero::ReduceOp::kSum).wait());
    sums[comm.rank()] = value;
    return absl::OkStatus();
  }));
  if (!status.ok()) {
    std::fprintf(stderr, "consumer: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("consumer: allreduce sums %g %g %g %g; GPT-2 d12 has %lld parameters\n", sums[0], sums[1], sums[2],
              sums[3], static_cast<long long>(zero::Gpt2Config::preset("d12")->num_parameters()));
  return 0;
}
