// The tiny GPT-2 fixtures tests/fixtures/make_model_fixtures.py wrote: weights, gradients and the batch.
#pragma once

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "runtime/safetensors.h"
#include "shard/module.h"

namespace zero::testing {

inline const std::string kGpt2TinyWeights = ZERO_FIXTURES_DIR "/gpt2_tiny.safetensors";
inline const std::string kGpt2TinyGrads = ZERO_FIXTURES_DIR "/gpt2_tiny_grads.safetensors";
inline const std::string kGpt2TinyIo = ZERO_FIXTURES_DIR "/gpt2_tiny_io.safetensors";

// The fixture's batch: tokens and targets (B, T) = (2, 8), two targets ignored; the batch views `io`.
struct Gpt2FixtureBatch {
  SafetensorsFile io;
  Batch batch;
};

inline Gpt2FixtureBatch load_gpt2_fixture_batch() {
  absl::StatusOr<SafetensorsFile> io = SafetensorsFile::read(kGpt2TinyIo);
  EXPECT_TRUE(io.ok()) << io.status();
  Gpt2FixtureBatch f{.io = *std::move(io)};
  f.batch = {.inputs = *f.io.get("tokens"), .targets = *f.io.get("targets")};
  return f;
}

}  // namespace zero::testing
