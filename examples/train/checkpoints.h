// zero-train's checkpoints: a save every checkpoint.interval steps under <dir>/step-NNNNNNNN, resume, pruning.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/train/train_config.h"
#include "models/data/data_loader.h"
#include "runtime/comm/communicator.h"
#include "shard/engine.h"

namespace zero::train {

// Whether step `step` of a run of `steps` ends with a save.
bool checkpoint_due(const CheckpointConfig& config, int64_t step, int64_t steps);

// Saves the engine, the step and the loader's position to <dir>/step-NNNNNNNN, points <dir>/latest at
// it, and removes the oldest written step-* beyond keep_last (never the one just saved) and what saves
// that never finished left (*.partial). A collective: every rank calls it.
absl::Status save_run(const CheckpointConfig& config, Engine& engine, Communicator& comm,
                      const data::DataLoader& loader, int64_t step);

// Loads what config.resume names (nothing for "", or for "auto" without a checkpoint; "auto" without
// `latest` takes the newest step-* that holds every rank's file) and moves the loader to where the saved
// run would have read next, also under another world size or micro-batch when the sequences already read
// end on a micro-batch boundary of this run. Returns the steps done. Refuses, before any step, a run that
// would save into a checkpoint.dir holding checkpoints of later steps than it starts from. A collective.
absl::StatusOr<int64_t> resume_run(const CheckpointConfig& config, Engine& engine, Communicator& comm,
                                   data::DataLoader& loader);

}  // namespace zero::train
