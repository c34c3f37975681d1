// Tiny GPT-2 under the engine: stages 0-3 bit-identical on 2 and 4 local ranks in fp32, bf16, fp16; the loss falls; the same on a GPU.
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "models/gpt2.h"
#include "optim/optimizers.h"
#include "runtime/comm/local.h"
#include "runtime/device_memory.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "tests/skip_without_gpu.h"

namespace zero {
namespace {

constexpr int64_t kGlobalRows = 8;  // sequences per step, split evenly over ranks
constexpr int64_t kSeqLen = 16;     // the tiny preset's max_seq_len
constexpr int kSteps = 8;

// Global row `row`: counting upward from a row-dependent start (mod V), so the next token is the
// current one plus one, which the model can learn in a few steps.
void fill_row(int64_t row, int64_t vocab, int32_t* tokens, int32_t* targets) {
  const int64_t start = (row * 37) % vocab;
  for (int64_t t = 0; t < kSeqLen; ++t) {
    tokens[t] = static_cast<int32_t>((start + t) % vocab);
    targets[t] = static_cast<int32_t>((start + t + 1) % vocab);
  }
}

struct RankRun {
  std::vector<float> params;  // every parameter, flat, in unit and declaration order
  std::vector<float> losses;  // per step
};

// Trains on `device`: the engine's buffers, the model's activations and each batch live there.
absl::StatusOr<RankRun> train_rank(Communicator& comm, int stage, DType precision, Device device) {
  const Gpt2Config config = *Gpt2Config::preset("tiny");
  Allocator alloc(comm.rank());  // outlives the model, whose units may hold activations after an error
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> model, Gpt2::create(config));
  ZeroConfig zero{.stage = stage,
                  .persistence_threshold = 0,
                  .precision = precision,
                  .loss_scaling = {.initial_scale = 1024.0},  // fp16: the loss gradient scaled, as DeepSpeed
                  .gradient_clipping = 1.0,
                  .weight_decay = 0.01f,
                  .device = device};
  const OptimizerFactory adamw = [](ShardLayout layout, Allocator& a, Device d) {
    return make_adam(AdamOptions{}, std::move(layout), a, d);
  };
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(*model, comm, alloc, adamw, zero));
  const int64_t rows = kGlobalRows / comm.world_size();
  std::vector<int32_t> tokens(rows * kSeqLen), targets(rows * kSeqLen);
  ZERO_ASSIGN_OR_RETURN(Buffer on_device, alloc.allocate(2 * rows * kSeqLen * 4, MemoryCategory::kActivations, device));
  const Batch batch{.inputs = on_device.tensor(DType::kI32, {2, rows, kSeqLen}).view(0, {rows, kSeqLen}),
                    .targets = on_device.tensor(DType::kI32, {2, rows, kSeqLen}).view(rows * kSeqLen, {rows, kSeqLen})};
  RankRun run;
  for (int step = 0; step < kSteps; ++step) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t global_row = step * kGlobalRows + comm.rank() * rows + r;
      fill_row(global_row, config.vocab_size, &tokens[r * kSeqLen], &targets[r * kSeqLen]);
    }
    ZERO_RETURN_IF_ERROR(copy_bytes(batch.inputs.data(), device, tokens.data(), Device::cpu(), batch.inputs.nbytes()));
    ZERO_RETURN_IF_ERROR(copy_bytes(batch.targets.data(), device, targets.data(), Device::cpu(), batch.targets.nbytes()));
    ZERO_ASSIGN_OR_RETURN(StepResult result, engine->train_step({&batch, 1}, 1e-2f));
    run.losses.push_back(result.loss);
  }
  ZERO_RETURN_IF_ERROR(engine->visit_full_params([&](absl::string_view, absl::string_view, const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) run.params.push_back(load_as_float(t.data(), t.dtype(), i));
    return absl::OkStatus();
  }));
  return run;
}

absl::StatusOr<RankRun> train(int world_size, int stage, DType precision, Device device = Device::cpu()) {
  std::vector<RankRun> ranks(world_size);
  ZERO_RETURN_IF_ERROR(root_cause(run_local_ranks(world_size, [&](Communicator& comm) -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(ranks[comm.rank()], train_rank(comm, stage, precision, device));
    return absl::OkStatus();
  })));
  return ranks[0];
}

// Stages 1-3 against stage 0 on `device`: the same bits, and a falling loss.
void expect_stages_agree(int world_size, DType precision, Device device) {
  absl::StatusOr<RankRun> reference = train(world_size, 0, precision, device);
  ASSERT_TRUE(reference.ok()) << reference.status();
  // From ln(100) ~ 4.6 (uniform over the vocab): eight AdamW steps of lr 1e-2 on a rule as simple as
  // "next = current + 1" take off about a quarter (4.59 -> 3.49); a model that does not learn takes off nothing.
  EXPECT_LT(reference->losses.back(), 0.9f * reference->losses.front())
      << "first " << reference->losses.front() << " last " << reference->losses.back();
  for (int stage = 1; stage <= 3; ++stage) {
    absl::StatusOr<RankRun> run = train(world_size, stage, precision, device);
    ASSERT_TRUE(run.ok()) << "stage " << stage << ": " << run.status();
    ASSERT_EQ(run->params.size(), reference->params.size());
    EXPECT_EQ(std::memcmp(run->params.data(), reference->params.data(), run->params.size() * sizeof(float)), 0)
        << "stage " << stage << " differs from stage 0";
    EXPECT_EQ(run->losses, reference->losses) << "stage " << stage;
  }
}

class Gpt2Stages : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(Gpt2Stages, AllStagesGiveBitIdenticalParametersAndTheLossFalls) {
  const auto [world_size, precision] = GetParam();
  expect_stages_agree(world_size, precision, Device::cpu());
}

INSTANTIATE_TEST_SUITE_P(WorldSizesAndPrecisions, Gpt2Stages,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16)),
                         [](const auto& info) {
                           return absl::StrCat("N", std::get<0>(info.param), "_", dtype_name(std::get<1>(info.param)));
                         });

// --- On a GPU: two local ranks share cuda:0, their collectives on device memory through the local backend.

TEST(Gpt2OnCuda, AllStagesGiveBitIdenticalParametersAndTheLossFalls) {
  ZERO_SKIP_WITHOUT_GPU();
  for (DType precision : {DType::kF32, DType::kBF16}) expect_stages_agree(2, precision, Device::cuda(0));
}

TEST(Gpt2OnCuda, FollowsTheCpuRun) {
  ZERO_SKIP_WITHOUT_GPU();
  const absl::StatusOr<RankRun> cpu = train(2, 3, DType::kF32);
  const absl::StatusOr<RankRun> gpu = train(2, 3, DType::kF32, Device::cuda(0));
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  // Step 1's loss is a forward pass of the same initial parameters: only the kernels' summation order
  // differs, a few fp32 ulps per reduction of at most C = 32 (or V = 100) terms, far below 1e-5 relative.
  EXPECT_NEAR(gpu->losses[0], cpu->losses[0], 1e-5 * cpu->losses[0]);
  // After that AdamW steps amplify ulp differences in tiny gradients (m / sqrt(v) normalizes them), so
  // the runs are only held to following each other: 1% of the loss.
  for (int k = 1; k < kSteps; ++k) EXPECT_NEAR(gpu->losses[k], cpu->losses[k], 1e-2 * cpu->losses[k]) << k;
}

TEST(Gpt2OnCuda, ABatchLeftOnTheHostIsRefusedNamingTheDevice) {
  ZERO_SKIP_WITHOUT_GPU();
  const std::vector<absl::Status> statuses = run_local_ranks(1, [](Communicator& comm) -> absl::Status {
    Allocator alloc(comm.rank());
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Gpt2> model, Gpt2::create(*Gpt2Config::preset("tiny")));
    const OptimizerFactory sgd = [](ShardLayout layout, Allocator& a, Device d) {
      return make_sgd(SgdOptions{}, std::move(layout), a, d);
    };
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::create(*model, comm, alloc, sgd, ZeroConfig{.stage = 3, .device = Device::cuda(0)}));
    std::vector<int32_t> tokens(kSeqLen), targets(kSeqLen);
    fill_row(0, 100, tokens.data(), targets.data());
    const Batch on_host{.inputs = Tensor(tokens.data(), DType::kI32, {1, kSeqLen}),
                        .targets = Tensor(targets.data(), DType::kI32, {1, kSeqLen})};
    return engine->train_step({&on_host, 1}, 1e-2f).status();
  });
  ASSERT_FALSE(statuses[0].ok());
  EXPECT_NE(statuses[0].message().find("cuda:0"), absl::string_view::npos) << statuses[0];
}

}  // namespace
}  // namespace zero
