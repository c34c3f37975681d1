// Where checkpoints live: Engine::save_checkpoint's file names and a training run's <root>/<tag> + latest.
#pragma once

// A checkpoint is a directory with one safetensors file per rank that saved it:
//
//   step-00000300/rank-00000-of-00004.safetensors ... rank-00003-of-00004.safetensors
//
// Each file holds, for every model parameter overlapping the flat range its rank updated, the pieces
// "<unit>/<param>/<what>@<first element>" (fp32): what = "param" (the fp32 master value) or an optimizer
// state name ("exp_avg", ...). Pieces are keyed by the model's own names, not by flat units, so any
// world size, stage or wrap policy can read them. Stage 0 ranks all hold the same values; rank 0 saves
// them and the other ranks save files without pieces. Metadata keys starting "zero." are the engine's
// (format, world size, stage, precision, optimizer, steps, loss scaler); the caller's come unprefixed.
//
// A training run keeps its checkpoints as <root>/<tag>/ with a file <root>/latest naming the newest
// tag, as DeepSpeed does, so "resume from the latest" needs only the root.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zero {

// "rank-00001-of-00004.safetensors"
std::string checkpoint_file_name(int rank, int world_size);

// Points <root>/latest at <root>/<tag> (written to a temporary file and renamed, so a reader sees the
// old tag or the new one, never a torn file).
absl::Status write_latest_checkpoint_tag(const std::string& root, const std::string& tag);
// The directory <root>/latest names; NotFound, saying so, when there is none.
absl::StatusOr<std::string> latest_checkpoint(const std::string& root);
// OK when `dir` holds a checkpoint with every rank's file; NotFound naming what is missing otherwise.
absl::Status check_checkpoint_complete(const std::string& dir);

}  // namespace zero
