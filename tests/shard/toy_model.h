// A small model on the module contract for the engine tests: tanh linear layers and a tied softmax head.
//
//   input   (B, D)  --input: tanh(x W0^T + b0)-->  (B, H)  --hidden_k: tanh(h Wk^T + bk)-->  (B, H)
//           --head: h W0 + bh (W0 tied from `input`)-->  logits (B, D)  -> cross-entropy vs targets (B)
//
// Written with plain loops so the engine is tested without the kernels; sizes are chosen by the tests
// to be awkward (not multiples of the world size).
#pragma once

#include <memory>
#include <vector>

#include "shard/module.h"

namespace zero::testing {

struct ToyConfig {
  int64_t features = 7;  // D: inputs and classes
  int64_t hidden = 13;   // H
  int hidden_layers = 2;
  bool tied_head = true;  // the head reuses input.weight; otherwise it has its own (D, H) weight
  // A conditional unit: when > 0, hidden_0 sits out (Unit::runs) the steps s with s % k == k - 1; with
  // sit_out_rank >= 0, only on that rank, so ranks disagree.
  int hidden_0_sits_out_every = 0;
  int sit_out_rank = -1;
};

class ToyModel : public Model {
 public:
  // `rank` matters only to ToyConfig::sit_out_rank.
  explicit ToyModel(const ToyConfig& config, int rank = 0);
  ~ToyModel() override;
  std::vector<Unit*> units() override;

 private:
  std::vector<std::unique_ptr<Unit>> units_;
};

// Rows [begin, end) of a deterministic global data set: inputs (rows, D) fp32 uniform in [-1, 1) and
// targets (rows) int32, the index of each row's largest input.
struct ToyData {
  std::vector<float> inputs;
  std::vector<int32_t> targets;
  Batch batch(int64_t features);
};
ToyData toy_rows(const ToyConfig& config, int64_t begin, int64_t end, uint64_t seed = 7);

}  // namespace zero::testing
