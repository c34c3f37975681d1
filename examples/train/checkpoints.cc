// zero-train's checkpoints: saving, resuming with the data loader in place, pruning the oldest.
#include "examples/train/checkpoints.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/comm/communicator.h"
#include "runtime/status.h"
#include "shard/checkpoint.h"

namespace zero::train {
namespace {

namespace fs = std::filesystem;
using Metadata = std::map<std::string, std::string>;

constexpr char kTagPrefix[] = "step-";

std::string step_tag(int64_t step) { return absl::StrFormat("%s%08d", kTagPrefix, step); }

// A <dir>/step-NNNNNNNN directory: its step, and when its last file was written.
struct Saved {
  fs::path path;
  int64_t step = 0;
  fs::file_time_type written;
};

// The step-* directories in `dir`, oldest written first (ties by step).
absl::StatusOr<std::vector<Saved>> saved_checkpoints(const std::string& dir) {
  std::vector<Saved> saved;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!entry.is_directory() || name.size() != 13 || !name.starts_with(kTagPrefix) ||
        !absl::SimpleAtoi(name.substr(5), &step)) {
      continue;
    }
    saved.push_back({.path = entry.path(), .step = step, .written = fs::last_write_time(entry.path(), ec)});
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("checkpoint.dir = ", dir, ": cannot list it"));
  }
  std::sort(saved.begin(), saved.end(), [](const Saved& a, const Saved& b) {
    return a.written != b.written ? a.written < b.written : a.step < b.step;
  });
  return saved;
}

// Removes the oldest written <dir>/step-* beyond keep_last, never the one `latest` names (`kept`).
absl::Status prune(const CheckpointConfig& config, const std::string& kept) {
  if (config.keep_last == 0) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(const std::vector<Saved> saved, saved_checkpoints(config.dir));
  std::error_code ec;
  for (size_t i = 0; i + config.keep_last < saved.size() && !ec; ++i) {
    if (saved[i].path.filename() != kept) fs::remove_all(saved[i].path, ec);
  }
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("checkpoint.keep_last: cannot remove an old checkpoint in ", config.dir));
  }
  return absl::OkStatus();
}

// Removes what saves that never finished left in `dir` (<tag>.partial directories).
absl::Status remove_unfinished_saves(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".partial") fs::remove_all(entry.path(), ec);
    if (ec) break;
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("checkpoint.dir = ", dir, ": cannot remove an unfinished save"));
  }
  return absl::OkStatus();
}

// The newest step-* in `dir` that holds every rank's file, if any.
absl::StatusOr<std::optional<Saved>> newest_complete(const std::string& dir) {
  ZERO_ASSIGN_OR_RETURN(std::vector<Saved> saved, saved_checkpoints(dir));
  std::sort(saved.begin(), saved.end(), [](const Saved& a, const Saved& b) { return a.step > b.step; });
  for (const Saved& s : saved) {
    if (check_checkpoint_complete(s.path.string()).ok()) return s;
  }
  return std::nullopt;
}

// A run that starts after `start_step` must not save beside checkpoints of later steps: its saves would
// interleave with another run's history, and pruning by age would remove that run's newest. Refused,
// naming the newest such checkpoint. An incomplete step-* is no checkpoint: a save of its step replaces it.
absl::Status check_nothing_newer(const CheckpointConfig& config, int64_t start_step) {
  if (config.dir.empty()) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(const std::optional<Saved> newest, newest_complete(config.dir));
  if (!newest || newest->step <= start_step) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "checkpoint.dir = ", config.dir, " holds ", newest->path.filename().string(), ", later than step ", start_step,
      " where this run starts: its saves would mix with that run's and keep_last could prune them. Resume it with "
      "checkpoint.resume=auto, set checkpoint.dir to another directory, or move the later step-* directories away"));
}

// The integer `key` of a checkpoint's metadata, at least `least`.
absl::StatusOr<int64_t> number(const Metadata& metadata, const std::string& key, absl::string_view dir,
                               int64_t least = 0) {
  int64_t value = 0;
  const auto it = metadata.find(key);
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", dir, " has no ", key, "; it was not saved by zero-train"));
  }
  if (value < least) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", dir, ": ", key, " = ", value, " is below ", least, "; its metadata is corrupt"));
  }
  return value;
}

// The directory config.resume names; "" when starting fresh.
absl::StatusOr<std::string> resume_dir(const CheckpointConfig& config) {
  if (config.resume.empty()) return std::string();
  if (config.resume != "latest" && config.resume != "auto") return config.resume;
  absl::StatusOr<std::string> latest = latest_checkpoint(config.dir);
  // latest is written after the checkpoint it names: without it, the newest complete save is the run's.
  if (config.resume == "auto" && absl::IsNotFound(latest.status())) {
    ZERO_ASSIGN_OR_RETURN(const std::optional<Saved> newest, newest_complete(config.dir));
    return newest ? newest->path.string() : std::string();
  }
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
  ZERO_ASSIGN_OR_RETURN(const int64_t saved_world_size, number(saved, "train.world_size", dir, 1));
  ZERO_ASSIGN_OR_RETURN(const int64_t saved_micro_batch, number(saved, "train.micro_batch", dir, 1));
  const __int128 sequences = static_cast<__int128>(batch) * saved_micro_batch * saved_world_size;
  if (sequences > std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, ": train.batch_in_epoch, train.micro_batch ",
                                                   "and train.world_size count more sequences than int64 holds"));
  }
  const int64_t read = static_cast<int64_t>(sequences);
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
  const bool lead = comm.rank() == 0;
  ZERO_RETURN_IF_ERROR(agree_across_ranks(comm, lead ? remove_unfinished_saves(config.dir) : absl::OkStatus(),
                                          absl::StrCat("saving into ", config.dir)));
  ZERO_RETURN_IF_ERROR(engine.save_checkpoint((fs::path(config.dir) / tag).string(), position));
  absl::Status listed = lead ? write_latest_checkpoint_tag(config.dir, tag) : absl::OkStatus();
  if (listed.ok() && lead) listed = prune(config, tag);
  return agree_across_ranks(comm, listed, absl::StrCat("updating ", config.dir, "/latest"));
}

absl::StatusOr<int64_t> resume_run(const CheckpointConfig& config, Engine& engine, Communicator& comm,
                                   data::DataLoader& loader) {
  absl::StatusOr<std::string> dir = resume_dir(config);  // every rank reads the same directory
  ZERO_RETURN_IF_ERROR(agree_across_ranks(comm, dir.status(), "finding the checkpoint to resume"));
  int64_t start_step = 0;
  if (!dir->empty()) {
    absl::StatusOr<Metadata> saved = engine.load_checkpoint(*dir);
    if (!saved.ok()) {
      return absl::Status(saved.status().code(), absl::StrCat("checkpoint.resume: ", saved.status().message()));
    }
    ZERO_RETURN_IF_ERROR(move_loader(*saved, *dir, comm.world_size(), loader));
    ZERO_ASSIGN_OR_RETURN(start_step, number(*saved, "train.step", *dir));
  }
  const bool lead = comm.rank() == 0;
  ZERO_RETURN_IF_ERROR(agree_across_ranks(comm, lead ? check_nothing_newer(config, start_step) : absl::OkStatus(),
                                          "checking checkpoint.dir"));
  return start_step;
}

}  // namespace zero::train
