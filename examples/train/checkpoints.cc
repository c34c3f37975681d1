// zero-train's checkpoints: saving, resuming with the data loader in place, pruning the oldest.
#include "examples/train/checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/status.h"
#include "shard/checkpoint.h"

namespace zero::train {
namespace {

namespace fs = std::filesystem;
using Metadata = std::map<std::string, std::string>;

constexpr char kTagPrefix[] = "step-";

std::string step_tag(int64_t step) { return absl::StrFormat("%s%08d", kTagPrefix, step); }

// Removes the oldest <dir>/step-* beyond the newest keep_last.
absl::Status prune(const CheckpointConfig& config) {
  if (config.keep_last == 0) return absl::OkStatus();
  std::vector<fs::path> tags;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(config.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() == 13 && name.starts_with(kTagPrefix)) tags.push_back(entry.path());
  }
  std::sort(tags.begin(), tags.end());
  for (size_t i = 0; i + config.keep_last < tags.size() && !ec; ++i) fs::remove_all(tags[i], ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("checkpoint.keep_last: cannot remove an old checkpoint in ", config.dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> number(const Metadata& metadata, const std::string& key, absl::string_view dir) {
  int64_t value = 0;
  const auto it = metadata.find(key);
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", dir, " has no ", key, "; it was not saved by zero-train"));
  }
  return value;
}

// The directory config.resume names; "" when starting fresh.
absl::StatusOr<std::string> resume_dir(const CheckpointConfig& config) {
  if (config.resume.empty()) return std::string();
  if (config.resume != "latest" && config.resume != "auto") return config.resume;
  absl::StatusOr<std::string> latest = latest_checkpoint(config.dir);
  if (config.resume == "auto" && absl::IsNotFound(latest.status())) return std::string();
  if (!latest.ok()) {
    return absl::Status(latest.status().code(),
                        absl::StrCat("checkpoint.resume = latest: ", latest.status().message(),
                                     "; use checkpoint.resume=auto to start fresh when there is none"));
  }
  return latest;
}

// The saved loader position as this run's: the sequences read so far in the epoch, counted over all
// ranks, must fill whole micro-batches of this run's world size and micro-batch.
absl::Status move_loader(const Metadata& saved, const std::string& dir, int world_size, data::DataLoader& loader) {
  ZERO_ASSIGN_OR_RETURN(const int64_t epoch, number(saved, "train.epoch", dir));
  ZERO_ASSIGN_OR_RETURN(const int64_t batch, number(saved, "train.batch_in_epoch", dir));
  ZERO_ASSIGN_OR_RETURN(const int64_t saved_world_size, number(saved, "train.world_size", dir));
  ZERO_ASSIGN_OR_RETURN(const int64_t saved_micro_batch, number(saved, "train.micro_batch", dir));
  const int64_t read = batch * saved_micro_batch * saved_world_size;
  const int64_t per_batch = loader.batch_size() * world_size;
  if (read % per_batch != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", dir, " stopped after ", read, " sequences of epoch ", epoch, " (", saved_world_size,
        " ranks x micro-batch ", saved_micro_batch, "), which is not a whole number of this run's micro-batches (",
        world_size, " ranks x ", loader.batch_size(), "); resume with a world size and micro-batch that divide it"));
  }
  const int64_t next = read / per_batch;
  if (next < loader.batches_per_epoch()) {
    loader.set_epoch(epoch, next);
  } else {
    loader.set_epoch(epoch + 1, 0);
  }
  return absl::OkStatus();
}

}  // namespace

bool checkpoint_due(const CheckpointConfig& config, int64_t step, int64_t steps) {
  if (config.dir.empty()) return false;
  return step == steps || (config.interval > 0 && step % config.interval == 0);
}

absl::Status save_run(const CheckpointConfig& config, Engine& engine, Communicator& comm,
                      const data::DataLoader& loader, int64_t step) {
  const Metadata position = {{"train.step", absl::StrCat(step)},
                             {"train.epoch", absl::StrCat(loader.epoch())},
                             {"train.batch_in_epoch", absl::StrCat(loader.batch_in_epoch())},
                             {"train.world_size", absl::StrCat(comm.world_size())},
                             {"train.micro_batch", absl::StrCat(loader.batch_size())}};
  const std::string tag = step_tag(step);
  ZERO_RETURN_IF_ERROR(engine.save_checkpoint((fs::path(config.dir) / tag).string(), position));
  const bool lead = comm.rank() == 0;
  absl::Status listed = lead ? write_latest_checkpoint_tag(config.dir, tag) : absl::OkStatus();
  if (listed.ok() && lead) listed = prune(config);
  return agree_across_ranks(comm, listed, absl::StrCat("updating ", config.dir, "/latest"));
}

absl::StatusOr<int64_t> resume_run(const CheckpointConfig& config, Engine& engine, Communicator& comm,
                                   data::DataLoader& loader) {
  ZERO_ASSIGN_OR_RETURN(const std::string dir, resume_dir(config));
  if (dir.empty()) return 0;
  absl::StatusOr<Metadata> saved = engine.load_checkpoint(dir);
  if (!saved.ok()) {
    return absl::Status(saved.status().code(), absl::StrCat("checkpoint.resume: ", saved.status().message()));
  }
  ZERO_RETURN_IF_ERROR(move_loader(*saved, dir, comm.world_size(), loader));
  return number(*saved, "train.step", dir);
}

}  // namespace zero::train
