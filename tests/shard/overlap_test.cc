// Communication overlaps compute: a collective held open until the compute thread has started the next
// unit completes, so the engine went on computing instead of waiting for it (waiting would deadlock
// until the communicator's deadline, failing the step).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "runtime/comm/communicator.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "tests/shard/held_backend.h"
#include "tests/shard/hooked_model.h"
#include "tests/shard/toy_model.h"
#include "tests/shard/toy_training.h"

namespace zero {
namespace {

using ::testing::ElementsAre;
using testing::EventLog;
using testing::HeldBackend;

// Trains `steps` steps of the toy model (input, hidden_0, hidden_1, head; accumulation_steps micro-batches of the
// same rows each) on one rank whose backend holds
// the first collective `hold` picks from step `hold_from_step` on, until the event `release_on` starts;
// returns the held collective's events and `release_on`'s from then on, in order.
absl::StatusOr<std::vector<std::string>> run_holding(ZeroConfig zero, int steps, int hold_from_step,
                                                     const std::function<bool(const Collective&)>& hold,
                                                     const std::string& release_on) {
  EventLog log;
  Allocator allocator;  // outlives the model, whose units hold activations between forward and backward
  auto backend = std::make_unique<HeldBackend>(hold, log);
  HeldBackend& held = *backend;
  // Generous: a correct engine releases the held collective as soon as its compute thread gets there, so
  // the timeout only bounds how long a broken one takes to fail.
  Communicator comm(std::move(backend), CommOptions{.timeout = absl::Seconds(60)});
  const testing::ToyConfig config{.hidden_layers = 2};
  testing::ToyModel toy(config);
  testing::HookedModel model(toy, {.on_start = [&](const std::string& event) {
                               if (event != release_on || !held.awaits_release()) return;
                               log.add(event);
                               held.release();
                             }});
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::create(model, comm, allocator, testing::adamw_factory(), zero));
  testing::ToyData data = testing::toy_rows(config, 0, 8);
  const Batch batch = data.batch(config.features);
  for (int step = 0; step < steps; ++step) {
    if (step == hold_from_step) held.arm();
    ZERO_RETURN_IF_ERROR(engine->train_step(std::vector<Batch>(zero.accumulation_steps, batch), 0.01f).status());
  }
  return log.events();
}

TEST(Overlap, Stage0BucketAllreduceRunsWhileTheNextUnitComputesItsBackward) {
  // One unit per bucket: the head's gradient is allreduced as soon as its backward wrote it, and the
  // engine goes on to hidden_1's backward; it waits for that reduction only after launching the next.
  // Two micro-batches a step, each reduced: one rank with one micro-batch would have nothing to reduce.
  const ZeroConfig zero{.stage = 0, .bucket_cap_bytes = 1, .first_bucket_cap_bytes = 1, .accumulation_steps = 2};
  const auto first_allreduce = [](const Collective& c) { return c.op == CollectiveOp::kAllreduce; };
  absl::StatusOr<std::vector<std::string>> events = run_holding(zero, 1, 0, first_allreduce, "backward hidden_1");
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_THAT(*events, ElementsAre("posted held collective", "backward hidden_1", "completed held collective"));
}

TEST(Overlap, Stage3PrefetchedGatherRunsWhileTheUnitBeforeComputes) {
  // From the second step on, the recorded order prefetches hidden_0's gather before the input layer's
  // forward runs, and the engine waits for it only when hidden_0 needs its parameters.
  const ZeroConfig zero{.stage = 3, .max_live_units = 2, .persistence_threshold = 0};
  const testing::ToyConfig config{.hidden_layers = 2};
  const int64_t hidden_numel = config.hidden * config.hidden + config.hidden;
  const auto hidden_gather = [&](const Collective& c) {
    return c.op == CollectiveOp::kAllgather && c.count == hidden_numel;
  };
  absl::StatusOr<std::vector<std::string>> events = run_holding(zero, 2, 1, hidden_gather, "forward input");
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_THAT(*events, ElementsAre("posted held collective", "forward input", "completed held collective"));
}

}  // namespace
}  // namespace zero
