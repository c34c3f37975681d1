// What each ZeRO stage partitions across ranks: the one place where a stage number has a meaning.
#pragma once

#include <cstdint>

namespace zero {

// A stage answers three independent questions, and everything the engine does per stage follows from
// them (docs/architecture.md, "Stages"):
//
//   stage  optimizer state  gradients  parameters   so a step
//   0      whole            whole      whole        allreduces gradients; every rank updates everything
//   1      slice            whole      whole        reduce-scatters; updates its slice; allgathers it
//   2      slice            slice      whole        as 1, holding only its slice of the gradients
//   3      slice            slice      slice        as 2, gathering each unit before forward and backward
//
// Stage 3 partitions a unit's parameters only when it has at least the persistence threshold of them
// (DeepSpeed's stage3_param_persistence_threshold); smaller units are held whole, as at stage 2.
class StagePolicy {
 public:
  static constexpr int kStages = 4;
  static constexpr bool valid(int stage) { return stage >= 0 && stage < kStages; }

  // `stage` must be valid(); ZeroConfig::validate and the tools refuse any other with its key.
  explicit constexpr StagePolicy(int stage) : stage_(stage) {}

  constexpr int stage() const { return stage_; }
  constexpr bool partitions_optimizer_state() const { return stage_ >= 1; }
  constexpr bool partitions_gradients() const { return stage_ >= 2; }
  constexpr bool partitions_params() const { return stage_ >= 3; }

  // Whether a unit of `numel` parameters is held as this rank's slice only.
  constexpr bool shards_params(int64_t numel, int64_t persistence_threshold) const {
    return partitions_params() && numel >= persistence_threshold;
  }
  // Every rank updates every element (DDP), so gradients are allreduced, buckets may span units, and
  // ranks hold identical optimizer state. Otherwise each rank updates its slice of every unit.
  constexpr bool updates_everything() const { return !partitions_optimizer_state(); }

 private:
  int stage_;
};

}  // namespace zero
