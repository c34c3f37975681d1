// One failing mpi job per scenario, launched under mpirun by comm_mpi_failure_test; see the cases below.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/comm/mpi.h"
#include "runtime/status.h"

namespace zero {
namespace {

absl::Status allreduce_floats(Communicator& comm, int64_t count) {
  std::vector<float> buf(count, 1.0f);
  return comm.allreduce(Tensor(buf.data(), DType::kF32, {count}), ReduceOp::kSum).wait();
}

// Rank 2 kills itself instead of joining the allreduce the others are in, or entering: they wait on it
// either way, until mpirun ends the job.
absl::Status kill(Communicator& comm) {
  if (comm.rank() == 2) std::raise(SIGKILL);
  return allreduce_floats(comm, 100);
}

// After one allreduce, the last rank stops answering: it waits for a signal, which only the end of the job
// (the peers' timeout, then mpirun) sends.
absl::Status stall(Communicator& comm) {
  ZERO_RETURN_IF_ERROR(allreduce_floats(comm, 10));
  if (comm.rank() == comm.world_size() - 1) {
    for (;;) pause();
  }
  return allreduce_floats(comm, 10);
}

// Rank 1 fails on its own while the others wait in a barrier.
absl::Status error(Communicator& comm) {
  if (comm.rank() == 1) return absl::DataLossError("checkpoint is truncated");
  return comm.barrier().wait();
}

// Rank 0 throws while the others wait in a barrier.
absl::Status exception(Communicator& comm) {
  if (comm.rank() == 0) throw std::runtime_error("simulated crash");
  return comm.barrier().wait();
}

// Rank 1 issues an allgather where the others issue an allreduce.
absl::Status diverge(Communicator& comm) {
  std::vector<float> buf(12), out(12 * comm.world_size());
  Tensor t(buf.data(), DType::kF32, {12});
  if (comm.rank() == 1) return comm.allgather(t, Tensor(out.data(), DType::kF32, {12 * comm.world_size()})).wait();
  return comm.allreduce(t, ReduceOp::kSum).wait();
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  absl::Status (*fn)(zero::Communicator&) = scenario == "kill"        ? zero::kill
                                            : scenario == "stall"     ? zero::stall
                                            : scenario == "error"     ? zero::error
                                            : scenario == "exception" ? zero::exception
                                            : scenario == "diverge"   ? zero::diverge
                                                                      : nullptr;
  if (fn == nullptr) {
    std::fprintf(stderr, "usage: %s kill|stall|error|exception|diverge (under mpirun)\n", argv[0]);
    return 2;
  }
  return zero::run_mpi_rank(fn);
}
