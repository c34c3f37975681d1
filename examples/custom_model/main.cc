// custom_model: your own C++ model trained under any ZeRO stage — the module contract in one file.
//
// A two-unit regression model, y = w2 · relu(W1 x + b1) + b2, learning y = sin(x0) + x1^2 / 2 from
// generated data on in-process ranks. Each unit declares its parameters and writes forward and
// backward; the engine owns every parameter, gradient and optimizer byte and shards them per stage.
//
//   custom_model --stage=3 --ranks=4 --steps=200
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "examples/common/tool_flags.h"
#include "optim/optimizers.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "shard/stage.h"

ABSL_FLAG(int, stage, 3, "ZeRO stage: 0, 1, 2 or 3");
ABSL_FLAG(int, ranks, 4, "in-process ranks");
ABSL_FLAG(int, steps, 200, "optimizer steps");

namespace {

using namespace zero;

constexpr int64_t kIn = 2, kHidden = 64, kRowsPerRank = 32;

// h = relu(x W^T + b): (B, 2) -> (B, 64). The first unit reads the batch.
class Hidden final : public Unit {
 public:
  // dh: where the next unit's backward leaves d(loss)/dh, freed here once read.
  explicit Hidden(Buffer& dh) : dh_(dh) {}
  absl::string_view name() const override { return "hidden"; }
  std::vector<ParamSpec> param_specs() const override {
    return {{"weight", {kHidden, kIn}, Init::normal(1.0f)}, {"bias", {kHidden}, Init::normal(0.5f)}};
  }
  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor&) override {
    x_ = ctx.batch.inputs.data_as<float>();
    rows_ = ctx.batch.inputs.size(0);
    ZERO_ASSIGN_OR_RETURN(h_, ctx.allocator.allocate(rows_ * kHidden * 4, MemoryCategory::kActivations));
    const float* w = p.at("weight").data_as<float>();
    const float* b = p.at("bias").data_as<float>();
    float* h = static_cast<float*>(h_.data());
    for (int64_t r = 0; r < rows_; ++r) {
      for (int64_t j = 0; j < kHidden; ++j) {
        h[r * kHidden + j] = std::max(0.0f, b[j] + w[j * kIn] * x_[r * kIn] + w[j * kIn + 1] * x_[r * kIn + 1]);
      }
    }
    return h_.tensor(DType::kF32, {rows_, kHidden});
  }
  void release_saved() override { h_.reset(); }
  absl::StatusOr<Tensor> backward(UnitContext&, const ParamViews&, const ParamViews& g, const Tensor& dh) override {
    const float* h = static_cast<const float*>(h_.data());
    float* dw = g.at("weight").data_as<float>();
    float* db = g.at("bias").data_as<float>();
    for (int64_t r = 0; r < rows_; ++r) {
      for (int64_t j = 0; j < kHidden; ++j) {
        const float dz = h[r * kHidden + j] > 0 ? dh.data_as<float>()[r * kHidden + j] : 0.0f;
        db[j] += dz;
        dw[j * kIn] += dz * x_[r * kIn];
        dw[j * kIn + 1] += dz * x_[r * kIn + 1];
      }
    }
    h_.reset();
    dh_.reset();      // the last reader of the gradient frees it: held past the step, it would leak into the next
    return Tensor();  // the first unit has no input gradient
  }

 private:
  const float* x_ = nullptr;
  int64_t rows_ = 0;
  Buffer h_;
  Buffer& dh_;
};

// y = h w + b and the mean squared error against the targets: (B, 64) -> (B).
class Output final : public Unit {
 public:
  // dh: where backward writes d(loss)/dh for the previous unit, which frees it.
  explicit Output(Buffer& dh) : dh_(dh) {}
  absl::string_view name() const override { return "output"; }
  std::vector<ParamSpec> param_specs() const override {
    return {{"weight", {kHidden}, Init::normal(0.1f)}, {"bias", {1}, Init::zeros()}};
  }
  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor& h) override {
    h_ = h;
    const int64_t rows = h.size(0);
    ZERO_ASSIGN_OR_RETURN(err_, ctx.allocator.allocate(rows * 4, MemoryCategory::kActivations));
    float* err = static_cast<float*>(err_.data());
    double loss = 0;
    for (int64_t r = 0; r < rows; ++r) {
      float y = p.at("bias").data_as<float>()[0];
      for (int64_t j = 0; j < kHidden; ++j)
        y += h.data_as<float>()[r * kHidden + j] * p.at("weight").data_as<float>()[j];
      err[r] = y - ctx.batch.targets.data_as<float>()[r];
      loss += err[r] * err[r];
    }
    ctx.loss = static_cast<float>(loss / rows);
    return err_.tensor(DType::kF32, {rows});
  }
  void release_saved() override { err_.reset(); }
  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& p, const ParamViews& g, const Tensor&) override {
    const int64_t rows = h_.size(0);
    ZERO_ASSIGN_OR_RETURN(dh_, ctx.allocator.allocate(rows * kHidden * 4, MemoryCategory::kActivations));
    float* dh = static_cast<float*>(dh_.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float dy = ctx.loss_scale * 2.0f * static_cast<const float*>(err_.data())[r] / static_cast<float>(rows);
      g.at("bias").data_as<float>()[0] += dy;
      for (int64_t j = 0; j < kHidden; ++j) {
        g.at("weight").data_as<float>()[j] += dy * h_.data_as<float>()[r * kHidden + j];
        dh[r * kHidden + j] = dy * p.at("weight").data_as<float>()[j];
      }
    }
    err_.reset();
    return dh_.tensor(DType::kF32, {rows, kHidden});
  }

 private:
  Tensor h_;
  Buffer err_;
  Buffer& dh_;
};

class Regressor final : public Model {
 public:
  std::vector<Unit*> units() override { return {&hidden_, &output_}; }

 private:
  Buffer dh_;  // d(loss)/dh, from output's backward to hidden's
  Hidden hidden_{dh_};
  Output output_{dh_};
};

// This rank's rows of step `step`: x uniform in [-2, 2)^2, y = sin(x0) + x1^2 / 2.
void make_batch(int step, int rank, std::vector<float>& x, std::vector<float>& y) {
  std::mt19937 rng(static_cast<uint32_t>(step * 1000 + rank));
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  for (int64_t r = 0; r < kRowsPerRank; ++r) {
    x[r * kIn] = uniform(rng);
    x[r * kIn + 1] = uniform(rng);
    y[r] = std::sin(x[r * kIn]) + 0.5f * x[r * kIn + 1] * x[r * kIn + 1];
  }
}

absl::Status train(Communicator& comm) {
  ZeroConfig config;
  config.stage = absl::GetFlag(FLAGS_stage);  // the one line that picks the stage
  config.persistence_threshold = 0;
  Allocator allocator(comm.rank());
  Regressor model;
  OptimizerFactory adam = [](ShardLayout layout, Allocator& a, Device d) {
    return make_adam({}, std::move(layout), a, d);
  };
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::create(model, comm, allocator, adam, config));
  std::vector<float> x(kRowsPerRank * kIn), y(kRowsPerRank);
  float first = 0, last = 0;
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    make_batch(step, comm.rank(), x, y);
    const Batch batch{Tensor(x.data(), DType::kF32, {kRowsPerRank, kIn}),
                      Tensor(y.data(), DType::kF32, {kRowsPerRank})};
    ZERO_ASSIGN_OR_RETURN(StepResult result, engine->train_step({&batch, 1}, 0.01f));
    (step == 0 ? first : last) = result.loss;
    if (comm.rank() == 0 && step % 50 == 0) std::printf("step %4d  loss %.4f\n", step, result.loss);
  }
  if (comm.rank() == 0) {
    std::printf("stage %d, %d ranks: loss %s from %.4f to %.4f\n%s", config.stage, comm.world_size(),
                last < first ? "fell" : "did not fall", first, last, allocator.summary().c_str());
  }
  if (const int64_t held = allocator.stats().current_of(MemoryCategory::kActivations); held != 0) {
    return absl::InternalError(absl::StrCat(held, " bytes of activations outlived the last step"));
  }
  return last < first ? absl::OkStatus() : absl::InternalError("the loss did not fall");
}

// A flag's value out of range, named as the user typed it.
absl::Status check_flags() {
  if (const int stage = absl::GetFlag(FLAGS_stage); !StagePolicy::valid(stage)) {
    return absl::InvalidArgumentError(absl::StrCat("--stage=", stage, ": ZeRO stages are 0, 1, 2 and 3"));
  }
  if (const int ranks = absl::GetFlag(FLAGS_ranks); ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks=", ranks, ": at least one rank is needed"));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  zero::parse_tool_flags(argc, argv,
                         "Trains a model written against zero's module contract (examples/custom_model/main.cc) under "
                         "a ZeRO stage on in-process ranks.\n\nusage: custom_model [--stage S] [--ranks N] [--steps K]",
                         "examples/custom_model/");
  if (const absl::Status bad = check_flags(); !bad.ok()) {
    std::fprintf(stderr, "custom_model: %s\n", std::string(bad.message()).c_str());
    return 2;
  }
  const absl::Status status = zero::root_cause(zero::run_local_ranks(absl::GetFlag(FLAGS_ranks), train));
  if (!status.ok()) std::fprintf(stderr, "custom_model: %s\n", std::string(status.message()).c_str());
  return status.ok() ? 0 : 1;
}
