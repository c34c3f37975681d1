// Engine checkpoints: each rank saves the fp32 parameters and optimizer state it updates; any layout loads them.
#include "shard/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <system_error>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#define XXH_INLINE_ALL  // header-only: nothing to link
#include "runtime/atomic_file.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "shard/init.h"
#include "shard/offload.h"
#include "xxhash.h"

namespace zero {

namespace fs = std::filesystem;

namespace {

// Format 2 adds each tensor's XXH3-64 checksum and the save's identity to every rank file's metadata;
// format-1 files, which have neither, are still read.
constexpr char kFormat[] = "zero-checkpoint-2";
constexpr char kFormatWithoutChecksums[] = "zero-checkpoint-1";
constexpr char kParamPiece[] = "param";  // the fp32 parameter value; other pieces are optimizer state

// `param` is the model's "<unit>/<param>".
std::string piece_name(absl::string_view param, absl::string_view what, int64_t first) {
  return absl::StrCat(param, "/", what, "@", first);
}

// The metadata key of a parameter's shape is this prefix and its model name: every file lists the shapes
// of the whole model.
constexpr char kShapeKey[] = "zero.shape:";
// A tensor's checksum is under this prefix and its name: XXH3-64 of its bytes, 16 hex digits.
constexpr char kChecksumKey[] = "zero.xxh3:";

std::string checksum(const Tensor& t) { return absl::StrFormat("%016x", XXH3_64bits(t.data(), t.nbytes())); }

struct PieceName {
  std::string param;  // "<unit>/<param>"
  std::string what;
  int64_t first = 0;  // the piece's first element within the parameter
};

std::optional<PieceName> parse_piece_name(absl::string_view name) {
  const size_t at = name.rfind('@');
  const size_t slash = name.rfind('/', at);
  int64_t first = 0;
  if (at == absl::string_view::npos || slash == absl::string_view::npos ||
      !absl::SimpleAtoi(name.substr(at + 1), &first) || first < 0) {
    return std::nullopt;
  }
  return PieceName{.param = std::string(name.substr(0, slash)),
                   .what = std::string(name.substr(slash + 1, at - slash - 1)),
                   .first = first};
}

// "ckpt/step-1/" and "ckpt/step-1" are the same directory.
fs::path directory_path(const std::string& dir) {
  fs::path path(dir);
  return path.has_filename() ? path : path.parent_path();
}

absl::Status filesystem_error(absl::string_view what, const fs::path& path, const std::error_code& ec) {
  return absl::Status(absl::ErrnoToStatusCode(ec.value()), absl::StrCat(what, " ", path.string(), ": ", ec.message()));
}

absl::Status make_empty_directory(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);  // what an interrupted save left
  if (ec) return filesystem_error("cannot remove", dir, ec);
  if (fs::create_directories(dir, ec); ec) return filesystem_error("cannot create", dir, ec);
  return absl::OkStatus();
}

// Moves `from` to `to`; an existing `to` is set aside first and removed only after the move.
absl::Status replace_directory(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  const fs::path old = to.string() + ".old";
  fs::remove_all(old, ec);
  if (fs::exists(to)) {
    if (fs::rename(to, old, ec); ec) return filesystem_error("cannot move aside", to, ec);
  }
  if (fs::rename(from, to, ec); ec) return filesystem_error("cannot rename", from, ec);
  fs::remove_all(old, ec);
  return sync_directory(to.parent_path().empty() ? "." : to.parent_path().string());
}

// The world size the checkpoint in `dir` was saved with, once every rank's file is there.
absl::StatusOr<int> saved_world_size(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    const bool unfinished = fs::exists(dir.string() + ".partial", ec);
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir.string(), ": no such directory",
                                            unfinished ? " (only the .partial of a save that did not finish)" : ""));
  }
  int world_size = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    int rank = 0, n = 0;
    if (std::sscanf(entry.path().filename().c_str(), "rank-%d-of-%d.safetensors", &rank, &n) == 2) {
      world_size = std::max(world_size, n);
    }
  }
  if (ec) return filesystem_error("cannot list", dir, ec);
  if (world_size == 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir.string(), ": no rank-*-of-*.safetensors files in it"));
  }
  for (int r = 0; r < world_size; ++r) {
    const fs::path file = dir / checkpoint_file_name(r, world_size);
    if (!fs::exists(file, ec)) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", dir.string(), ": ", file.filename().string(),
                                              " is missing; it was saved by ", world_size,
                                              " ranks and needs all their files"));
    }
  }
  return world_size;
}

template <typename T>
absl::StatusOr<T> metadata_number(const std::map<std::string, std::string>& metadata, const std::string& key,
                                  absl::string_view file) {
  const auto it = metadata.find(key);
  T value{};
  bool parsed = it != metadata.end();
  if constexpr (std::is_floating_point_v<T>) {
    parsed = parsed && absl::SimpleAtod(it->second, &value);
  } else {
    parsed = parsed && absl::SimpleAtoi(it->second, &value);
  }
  if (!parsed) return absl::DataLossError(absl::StrCat(file, ": metadata ", key, " is missing or not a number"));
  return value;
}

}  // namespace

std::string checkpoint_file_name(int rank, int world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world_size);
}

absl::Status write_latest_checkpoint_tag(const std::string& root, const std::string& tag) {
  return write_file_atomically((directory_path(root) / "latest").string(), {tag, "\n"});
}

absl::StatusOr<std::string> latest_checkpoint(const std::string& root) {
  const fs::path latest = directory_path(root) / "latest";
  std::ifstream in(latest);
  std::string tag;
  if (!(in >> tag)) {
    return absl::NotFoundError(
        absl::StrCat(latest.string(), " does not exist or is empty: no checkpoint was saved in ", root, " yet"));
  }
  return (directory_path(root) / tag).string();
}

absl::Status check_checkpoint_complete(const std::string& dir) {
  return saved_world_size(directory_path(dir)).status();
}

// What this rank needs of one flat unit from a checkpoint, and what it has read of it.
struct UnitCheckpoint {
  struct Param {
    std::string name;    // the model's "<unit>/<param>"
    int64_t offset = 0;  // in the flat unit
    int64_t numel = 0;
    std::string shape;
  };
  int64_t begin = 0;  // the flat range [begin, begin + count) this rank updates
  int64_t count = 0;
  std::vector<Param> params;
  std::string optimizer;  // its name, and the state it keeps in its order
  std::vector<std::string> state_names;
  Buffer values;                 // fp32 (count): the parameters
  std::vector<Buffer> state;     // fp32 (count) per state name
  std::vector<int64_t> covered;  // elements read, per (param, piece): param * pieces() + piece

  int pieces() const { return 1 + static_cast<int>(state_names.size()); }  // the values, then each state
  std::string piece_label(int piece) const { return piece == 0 ? "values" : state_names[piece - 1]; }
  float* piece_data(int piece) const {
    return static_cast<float*>(piece == 0 ? values.data() : state[piece - 1].data());
  }
  // Elements of param p inside this rank's range.
  int64_t needed(int p) const {
    return std::max<int64_t>(
        0, std::min(params[p].offset + params[p].numel, begin + count) - std::max(params[p].offset, begin));
  }
};

namespace {

using Metadata = std::map<std::string, std::string>;
using ParamIndex = absl::flat_hash_map<std::string, std::pair<int, int>>;  // model name -> (unit, param)

// A flat unit's parameters under the model's names, which pieces and shapes are keyed by.
std::vector<UnitCheckpoint::Param> params_of(const std::string& unit, const FlatLayout& layout) {
  std::vector<UnitCheckpoint::Param> params;
  for (size_t p = 0; p < layout.params.size(); ++p) {
    const auto [model_unit, param] = model_param_name(unit, layout.params[p].name);
    params.push_back({.name = absl::StrCat(model_unit, "/", param),
                      .offset = layout.params[p].offset,
                      .numel = layout.params[p].numel,
                      .shape = shape_string(layout.shapes[p])});
  }
  return params;
}

// The step count and fp16 loss scaler a checkpoint carries.
struct EngineCounters {
  int64_t steps = 0;
  std::optional<LossScaler::State> scaler;  // when both the checkpoint and the engine train in fp16
};

absl::StatusOr<EngineCounters> counters_from(const Metadata& metadata, DType precision, absl::string_view dir) {
  EngineCounters c;
  ZERO_ASSIGN_OR_RETURN(c.steps, metadata_number<int64_t>(metadata, "zero.steps", dir));
  const auto saved_precision = metadata.find("zero.precision");
  const bool fp16 = precision == DType::kF16 && saved_precision != metadata.end() &&
                    saved_precision->second == dtype_name(DType::kF16);
  if (!fp16) return c;
  LossScaler::State& scaler = c.scaler.emplace();
  ZERO_ASSIGN_OR_RETURN(scaler.scale, metadata_number<double>(metadata, "zero.loss_scale", dir));
  ZERO_ASSIGN_OR_RETURN(scaler.good_steps, metadata_number<int>(metadata, "zero.good_steps", dir));
  ZERO_ASSIGN_OR_RETURN(scaler.hysteresis_left, metadata_number<int>(metadata, "zero.hysteresis_left", dir));
  return c;
}

// InvalidArgument unless the saved shapes are the model's, parameter for parameter.
absl::Status check_same_model(const Metadata& metadata, const std::vector<UnitCheckpoint>& units, size_t params,
                              const std::string& path) {
  for (const UnitCheckpoint& u : units) {
    for (const UnitCheckpoint::Param& p : u.params) {
      const auto saved = metadata.find(absl::StrCat(kShapeKey, p.name));
      if (saved != metadata.end() && saved->second == p.shape) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": parameter ", p.name, " is ", p.shape, " in this model but ",
          saved == metadata.end() ? "absent" : saved->second, " in the checkpoint; was it saved from another model?"));
    }
  }
  const size_t saved = std::count_if(metadata.begin(), metadata.end(),
                                     [](const auto& kv) { return absl::StartsWith(kv.first, kShapeKey); });
  if (saved == params) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path, ": the checkpoint has ", saved, " parameters, this model ",
                                                 params, "; was it saved from another model?"));
}

// Copies the part of one saved piece that falls in this rank's range.
absl::Status read_piece(const SafetensorsFile& file, const SafetensorsEntry& entry, const ParamIndex& where,
                        const Metadata& metadata, std::vector<UnitCheckpoint>& units, const std::string& path) {
  const std::string& saved_optimizer = metadata.at("zero.optimizer");
  const std::optional<PieceName> piece = parse_piece_name(entry.name);
  if (!piece) return absl::DataLossError(absl::StrCat(path, ": tensor '", entry.name, "' is not a checkpoint piece"));
  const auto found = where.find(piece->param);
  if (found == where.end()) {
    return absl::DataLossError(absl::StrCat(path, ": piece '", entry.name, "' is of no parameter its metadata lists"));
  }
  const auto [i, p] = found->second;
  UnitCheckpoint& u = units[i];
  const auto name = std::find(u.state_names.begin(), u.state_names.end(), piece->what);
  if (piece->what != kParamPiece && name == u.state_names.end()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds optimizer state '", piece->what, "', which ",
                                                   u.optimizer, " does not keep; it was saved with ", saved_optimizer,
                                                   ": load it with that optimizer"));
  }
  const int what = piece->what == kParamPiece ? 0 : static_cast<int>(name - u.state_names.begin()) + 1;
  const UnitCheckpoint::Param& param = u.params[p];
  ZERO_ASSIGN_OR_RETURN(const Tensor values, file.get(entry.name));
  if (metadata.at("zero.format") == kFormat) {
    const auto saved = metadata.find(absl::StrCat(kChecksumKey, entry.name));
    const std::string read = checksum(values);
    if (saved == metadata.end() || saved->second != read) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", entry.name, "' does not match its checksum (saved ",
                                              saved == metadata.end() ? "none" : saved->second, ", read ", read,
                                              "): the file is corrupt; resume from another checkpoint"));
    }
  }
  if (values.dtype() != DType::kF32 || values.dim() != 1 || piece->first + values.numel() > param.numel) {
    return absl::DataLossError(absl::StrCat(path, ": piece '", entry.name, "' is ", values.to_string(),
                                            ", which does not fit in the ", param.numel, " elements of ", param.name));
  }
  // The overlap of the piece and this rank's range, both in flat elements of the unit.
  const int64_t piece_begin = param.offset + piece->first;
  const int64_t first = std::max(piece_begin, u.begin);
  const int64_t last = std::min(piece_begin + values.numel(), u.begin + u.count);
  if (first >= last) return absl::OkStatus();
  std::memcpy(u.piece_data(what) + (first - u.begin), values.data_as<float>() + (first - piece_begin),
              (last - first) * 4);
  u.covered[p * u.pieces() + what] += last - first;
  return absl::OkStatus();
}

// DataLoss naming the first parameter and piece of which this rank did not read every element it needs.
absl::Status check_coverage(const std::vector<UnitCheckpoint>& units, const Metadata& metadata, int saved_ranks,
                            int rank, const std::string& dir) {
  for (const UnitCheckpoint& u : units) {
    for (int p = 0; p < static_cast<int>(u.params.size()); ++p) {
      for (int what = 0; what < u.pieces(); ++what) {
        const int64_t got = u.covered[p * u.pieces() + what];
        if (got == u.needed(p)) continue;
        return absl::DataLossError(absl::StrCat(
            "checkpoint ", dir, " holds ", got, " of the ", u.needed(p), " elements of ", u.params[p].name, " ",
            u.piece_label(what), " that rank ", rank, " needs (saved with ", metadata.at("zero.optimizer"), " by ",
            saved_ranks, " ranks); load it with the optimizer it was saved with"));
      }
    }
  }
  return absl::OkStatus();
}

// Which save wrote a rank file: its step and the save's identity (none in format 1).
std::pair<std::string, std::string> save_identity(const Metadata& metadata) {
  const auto steps = metadata.find("zero.steps");
  const auto save = metadata.find("zero.save");
  return {steps == metadata.end() ? "unknown" : steps->second, save == metadata.end() ? "" : save->second};
}

absl::Status mixed_saves(absl::string_view path, const Metadata& other, absl::string_view own_path,
                         const Metadata& own) {
  return absl::DataLossError(absl::StrCat(path, ": saved by another save than ", own_path, " (step ",
                                          save_identity(other).first, " against ", save_identity(own).first,
                                          "); the directory mixes two checkpoints"));
}

// Reads into `units` every saved piece that overlaps what they need, and returns the metadata. The rank's
// own file comes first; when it was cut by the same `layout` (Engine::checkpoint_layout), it holds all
// the rank needs and the others are not read. Coverage is checked either way.
absl::StatusOr<Metadata> read_checkpoint(const std::string& dir, std::vector<UnitCheckpoint>& units, int rank,
                                         const std::string& layout) {
  const fs::path root = directory_path(dir);
  ZERO_ASSIGN_OR_RETURN(const int saved_ranks, saved_world_size(root));
  ParamIndex where;
  for (size_t i = 0; i < units.size(); ++i) {
    for (size_t p = 0; p < units[i].params.size(); ++p) where[units[i].params[p].name] = {i, p};
  }
  const int own = rank < saved_ranks ? rank : 0;
  Metadata metadata;  // the rank's own file's
  for (int k = 0; k < saved_ranks; ++k) {
    const int r = (own + k) % saved_ranks;
    const std::string path = (root / checkpoint_file_name(r, saved_ranks)).string();
    ZERO_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::read(path));
    if (k == 0) {
      metadata = file.metadata();
      if (metadata["zero.format"] != kFormat && metadata["zero.format"] != kFormatWithoutChecksums) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": not a zero checkpoint (zero.format is '",
                                                       metadata["zero.format"], "', expected ", kFormat, ")"));
      }
      ZERO_RETURN_IF_ERROR(check_same_model(metadata, units, where.size(), path));
    } else if (const Metadata& other = file.metadata();
               save_identity(other) != save_identity(metadata)) {  // files this rank reads; load_checkpoint
      return mixed_saves(path, other, checkpoint_file_name(own, saved_ranks), metadata);  // compares the own ones
    }
    for (const SafetensorsEntry& entry : file.entries()) {
      ZERO_RETURN_IF_ERROR(read_piece(file, entry, where, file.metadata(), units, path));
    }
    if (!layout.empty() && metadata["zero.layout"] == layout) break;  // the own file held all of it
  }
  ZERO_RETURN_IF_ERROR(check_coverage(units, metadata, saved_ranks, rank, root.string()));
  return metadata;
}

}  // namespace

absl::Status Engine::save_checkpoint(const std::string& dir, const std::map<std::string, std::string>& extra) {
  ZERO_RETURN_IF_ERROR(require_between_steps("save_checkpoint"));
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  ZERO_RETURN_IF_ERROR(apply_delayed_update());  // the state saved is the one the next step continues from
  for (const auto& [key, value] : extra) {
    if (absl::StartsWith(key, "zero.")) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint metadata key '", key, "': zero.* keys are the engine's"));
    }
  }
  const fs::path target = directory_path(dir);
  const fs::path partial = target.string() + ".partial";
  const bool lead = comm_.rank() == 0;
  const std::string task = absl::StrCat("saving checkpoint ", target.string());
  ZERO_RETURN_IF_ERROR(agree_across_ranks(comm_, lead ? make_empty_directory(partial) : absl::OkStatus(), task));
  // The save's identity, rank 0's random number on every rank, so a loader can tell two saves' files apart.
  uint64_t save_id = lead ? std::random_device()() * (uint64_t{1} << 32) + std::random_device()() : 0;
  ZERO_RETURN_IF_ERROR(comm_.broadcast(Tensor(&save_id, DType::kI32, {2}), 0).wait());
  const fs::path file = partial / checkpoint_file_name(comm_.rank(), comm_.world_size());
  absl::Status saved =
      agree_across_ranks(comm_, write_checkpoint_file(file.string(), absl::StrFormat("%016x", save_id), extra), task);
  if (saved.ok()) saved = agree_across_ranks(comm_, lead ? replace_directory(partial, target) : absl::OkStatus(), task);
  if (!saved.ok() && lead) {
    std::error_code ignored;
    fs::remove_all(partial, ignored);
  }
  return saved;
}

absl::Status Engine::write_checkpoint_file(const std::string& path, const std::string& save_id,
                                           const std::map<std::string, std::string>& extra) {
  std::vector<std::pair<std::string, Tensor>> pieces;
  std::vector<Buffer> host_copies;  // what the pieces view, for an engine on a GPU
  const auto host_view = [&](const Tensor& t) -> absl::StatusOr<Tensor> {
    return on_host(t, allocator_, host_copies.emplace_back());
  };
  // Where every rank updates everything, every rank holds the same values: rank 0 saves them.
  const bool holds_pieces = !policy_.updates_everything() || comm_.rank() == 0;
  ZERO_RETURN_IF_ERROR(settle_offload());
  for (const UnitState& u : holds_pieces ? std::span<const UnitState>(units_) : std::span<const UnitState>()) {
    ZERO_RETURN_IF_ERROR(move_offloaded(u, allocator_, &Allocator::page_in));
    const int64_t begin = u.own_begin;
    const int64_t count = u.own_count;
    // The master weights where there are any (bf16/fp16, or the host's under ZeRO-Offload), else the params.
    ZERO_ASSIGN_OR_RETURN(
        const Tensor values,
        host_view(u.master.data() != nullptr ? u.master.tensor(DType::kF32, {count}) : u.own_params(dtype_)));
    std::vector<std::pair<std::string, Tensor>> state = u.optimizer->state();
    for (auto& [name, t] : state) {
      ZERO_ASSIGN_OR_RETURN(t, host_view(t));
    }
    for (const UnitCheckpoint::Param& p : params_of(u.name, u.layout)) {
      const int64_t first = std::max(p.offset, begin);
      const int64_t last = std::min(p.offset + p.numel, begin + count);
      if (first >= last) continue;
      pieces.emplace_back(piece_name(p.name, kParamPiece, first - p.offset), values.slice(first - begin, last - begin));
      for (const auto& [what, t] : state) {
        pieces.emplace_back(piece_name(p.name, what, first - p.offset), t.slice(first - begin, last - begin));
      }
    }
  }
  std::map<std::string, std::string> metadata = extra;
  for (const UnitState& u : units_) {
    for (const UnitCheckpoint::Param& p : params_of(u.name, u.layout)) metadata[kShapeKey + p.name] = p.shape;
  }
  for (const auto& [name, t] : pieces) metadata[kChecksumKey + name] = checksum(t);
  metadata["zero.format"] = kFormat;
  metadata["zero.save"] = save_id;
  metadata["zero.world_size"] = absl::StrCat(comm_.world_size());
  metadata["zero.rank"] = absl::StrCat(comm_.rank());
  metadata["zero.stage"] = absl::StrCat(config_.stage);
  metadata["zero.layout"] = checkpoint_layout();
  metadata["zero.precision"] = std::string(dtype_name(dtype_));
  metadata["zero.optimizer"] = units_.empty() ? "" : std::string(units_[0].optimizer->name());
  metadata["zero.steps"] = absl::StrCat(step_count_);
  metadata["zero.loss_scale"] = absl::StrFormat("%.17g", scaler_.state().scale);
  metadata["zero.good_steps"] = absl::StrCat(scaler_.state().good_steps);
  metadata["zero.hysteresis_left"] = absl::StrCat(scaler_.state().hysteresis_left);
  ZERO_RETURN_IF_ERROR(write_safetensors(path, pieces, metadata));
  // Only read: dropped, not written back (drop_unchanged writes what failed to reach its file before).
  for (const UnitState& u : units_) ZERO_RETURN_IF_ERROR(move_offloaded(u, allocator_, &Allocator::drop_unchanged));
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> Engine::load_checkpoint(const std::string& dir) {
  ZERO_RETURN_IF_ERROR(require_between_steps("load_checkpoint"));
  const JoinedStreamScope on_compute = compute_scope();
  ZERO_RETURN_IF_ERROR(on_compute.status());
  // Read and check everything first: nothing of the engine changes unless every rank read all it needs.
  absl::StatusOr<std::vector<UnitCheckpoint>> units = checkpoint_targets();
  absl::StatusOr<Metadata> metadata =
      units.ok() ? read_checkpoint(dir, *units, comm_.rank(), checkpoint_layout()) : units.status();
  const absl::StatusOr<EngineCounters> counters =
      metadata.ok() ? counters_from(*metadata, dtype_, dir) : absl::StatusOr<EngineCounters>(metadata.status());
  ZERO_RETURN_IF_ERROR(agree_across_ranks(comm_, counters.status(), absl::StrCat("loading checkpoint ", dir)));
  ZERO_RETURN_IF_ERROR(check_same_save_on_every_rank(*metadata, dir));
  ZERO_RETURN_IF_ERROR(apply_delayed_update());  // done writing before the checkpoint's state replaces it
  ZERO_RETURN_IF_ERROR(install_checkpoint(*units));
  step_count_ = counters->steps;
  if (counters->scaler) scaler_.restore(*counters->scaler);  // an fp16 run from an fp16 checkpoint carries it on
  allocator_.reset_peaks();                                  // what reading needed is not part of any step's peak
  std::map<std::string, std::string> extra;
  for (const auto& [key, value] : *metadata) {
    if (!absl::StartsWith(key, "zero.")) extra[key] = value;
  }
  return extra;
}

absl::Status Engine::check_same_save_on_every_rank(const Metadata& own, const std::string& dir) {
  // Each rank's own file: its step and a fingerprint of the save's identity, allgathered. A file every
  // rank reads is compared by read_checkpoint; one only its rank reads (the same layout) only here.
  const auto [steps, save] = save_identity(own);
  ZERO_ASSIGN_OR_RETURN(const std::vector<int> differ, ranks_unlike_rank_0(comm_, param_key(steps, save)));
  if (differ.empty()) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(const int saved_ranks, metadata_number<int>(own, "zero.world_size", dir));
  const auto own_file = [&](int r) {
    return (directory_path(dir) / checkpoint_file_name(r < saved_ranks ? r : 0, saved_ranks)).string();
  };
  // Every rank found the same mismatch; each names it from the files themselves.
  ZERO_ASSIGN_OR_RETURN(const SafetensorsFile first, SafetensorsFile::read(own_file(0)));
  ZERO_ASSIGN_OR_RETURN(const SafetensorsFile other, SafetensorsFile::read(own_file(differ[0])));
  return mixed_saves(own_file(differ[0]), other.metadata(), checkpoint_file_name(0, saved_ranks), first.metadata());
}

std::string Engine::checkpoint_layout() const {
  if (policy_.updates_everything()) return "";  // pieces are all in rank 0's file
  std::string layout = absl::StrCat(comm_.world_size(), " ranks:");
  for (const UnitState& u : units_) absl::StrAppend(&layout, " ", u.name, "/", u.layout.padded_numel);
  return layout;
}

absl::StatusOr<std::vector<UnitCheckpoint>> Engine::checkpoint_targets() {
  std::vector<UnitCheckpoint> units;
  for (const UnitState& u : units_) {
    UnitCheckpoint& c = units.emplace_back();
    c.begin = u.own_begin;
    c.count = u.own_count;
    c.params = params_of(u.name, u.layout);
    c.optimizer = std::string(u.optimizer->name());
    for (const auto& [name, t] : u.optimizer->state()) c.state_names.push_back(name);
    ZERO_ASSIGN_OR_RETURN(c.values, allocator_.allocate(c.count * 4, MemoryCategory::kWorkspace));
    for (size_t k = 0; k < c.state_names.size(); ++k) {
      ZERO_ASSIGN_OR_RETURN(c.state.emplace_back(), allocator_.allocate(c.count * 4, MemoryCategory::kWorkspace));
    }
    for (int piece = 0; piece < c.pieces(); ++piece) std::memset(c.piece_data(piece), 0, c.count * 4);
    c.covered.assign(c.params.size() * c.pieces(), 0);
  }
  return units;
}

absl::Status Engine::install_checkpoint(const std::vector<UnitCheckpoint>& units) {
  ZERO_RETURN_IF_ERROR(settle_offload());
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    const UnitCheckpoint& c = units[i];
    ZERO_RETURN_IF_ERROR(move_offloaded(u, allocator_, &Allocator::page_in));
    const Tensor values = c.values.tensor(DType::kF32, {c.count});
    ZERO_RETURN_IF_ERROR(cast_from_host(u.own_params(dtype_), values, allocator_));
    if (u.master.data() != nullptr)
      ZERO_RETURN_IF_ERROR(cast_from_host(u.master.tensor(DType::kF32, {c.count}), values, allocator_));
    const std::vector<std::pair<std::string, Tensor>> state = u.optimizer->state();
    for (size_t k = 0; k < state.size(); ++k) {
      ZERO_RETURN_IF_ERROR(cast_from_host(state[k].second, c.state[k].tensor(DType::kF32, {c.count}), allocator_));
    }
    ZERO_RETURN_IF_ERROR(move_offloaded(u, allocator_, &Allocator::page_out));
    // A unit kept whole where each rank updates a slice: the others' slices come from them.
    if (!policy_.updates_everything() && !u.sharded) {
      Work gather = gatherer_->allgather_updated(static_cast<int>(i));
      ZERO_RETURN_IF_ERROR(meter_.wait(gather));
    }
  }
  gatherer_->forget_recorded_order();  // prefetch records the order again
  return absl::OkStatus();
}

}  // namespace zero
