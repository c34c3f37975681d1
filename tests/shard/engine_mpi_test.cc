// Under mpirun: the engine over the mpi backend gives the same parameters, bit for bit, as over the local backend.
//
// Every rank trains the toy model for each stage through MPI, as it is and with a unit that sits out every
// other step; rank 0 then repeats the run with the same number of in-process ranks and compares. Prints
// one line per stage and model; exits non-zero on any difference.
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/comm/mpi.h"
#include "runtime/status.h"
#include "tests/shard/toy_training.h"

namespace zero::testing {
namespace {

absl::Status compare_stage(Communicator& comm, int stage, const ToyConfig& model) {
  TrainRun run;
  run.model = model;
  run.steps = 4;
  run.world_size = comm.world_size();
  run.zero.stage = stage;
  run.zero.accumulation_steps = 2;
  run.zero.gradient_clipping = 1.0;
  run.zero.persistence_threshold = 0;
  run.zero.bucket_cap_bytes = 600;
  ZERO_ASSIGN_OR_RETURN(RankResult mpi, train_rank(comm, run));
  absl::Status verdict = absl::OkStatus();
  if (comm.rank() == 0) {
    const LocalOutcome local = train_local(run);
    ZERO_RETURN_IF_ERROR(local.status);
    const std::vector<float>& want = local.ranks[0].params;
    if (mpi.params.size() != want.size() ||
        std::memcmp(mpi.params.data(), want.data(), want.size() * sizeof(float)) != 0) {
      verdict = absl::InternalError(absl::StrCat("stage ", stage, ": mpi and local parameters differ"));
    } else {
      std::printf("stage %d%s: mpi == local bit for bit (%zu parameters, %d ranks)\n", stage,
                  model.hidden_0_sits_out_every > 0 ? ", hidden_0 sitting out" : "", want.size(), comm.world_size());
    }
  }
  // Every rank learns the verdict, so all exit the same way.
  int32_t ok = verdict.ok() ? 1 : 0;
  ZERO_RETURN_IF_ERROR(comm.broadcast(Tensor(&ok, DType::kI32, {1}), 0).wait());
  if (ok == 1) return absl::OkStatus();
  return verdict.ok() ? absl::InternalError(absl::StrCat("stage ", stage, ": rank 0 saw a difference")) : verdict;
}

}  // namespace
}  // namespace zero::testing

int main() {
  return zero::run_mpi_rank([](zero::Communicator& comm) -> absl::Status {
    for (const zero::testing::ToyConfig& model :
         {zero::testing::ToyConfig{}, zero::testing::ToyConfig{.hidden_0_sits_out_every = 2}}) {
      for (int stage = 0; stage <= 3; ++stage) ZERO_RETURN_IF_ERROR(zero::testing::compare_stage(comm, stage, model));
    }
    return absl::OkStatus();
  });
}
