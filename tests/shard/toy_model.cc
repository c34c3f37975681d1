#include "tests/shard/toy_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero::testing {

namespace {

absl::StatusOr<Buffer> floats(Allocator& alloc, int64_t n) {
  ZERO_ASSIGN_OR_RETURN(Buffer b, alloc.allocate(n * 4, MemoryCategory::kActivations));
  if (n > 0) std::memset(b.data(), 0, n * 4);  // an empty buffer has no data pointer to pass
  return b;
}

// Parameters arrive in the engine's precision; the toy computes in fp32 and rounds once when it adds
// its gradient into the view.
std::vector<float> values_of(const Tensor& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = load_as_float(t.data(), t.dtype(), i);
  return v;
}

void add_to(const Tensor& grad, const std::vector<float>& delta) {
  for (int64_t i = 0; i < grad.numel(); ++i) {
    store_from_float(grad.data(), grad.dtype(), i, load_as_float(grad.data(), grad.dtype(), i) + delta[i]);
  }
}

// y = act(x W^T + b) with W (out, in); the first layer reads the batch.
class Linear final : public Unit {
 public:
  // sits_out_every > 0: the unit sits out the steps s with s % sits_out_every == sits_out_every - 1.
  Linear(std::string name, int64_t in, int64_t out, int sits_out_every = 0)
      : name_(std::move(name)), in_(in), out_(out), sits_out_every_(sits_out_every) {}
  absl::string_view name() const override { return name_; }
  bool runs(const UnitContext& ctx) const override {
    return sits_out_every_ == 0 || ctx.step % sits_out_every_ != sits_out_every_ - 1;
  }
  std::vector<ParamSpec> param_specs() const override {
    return {{"weight", {out_, in_}, Init::normal(0.5f)}, {"bias", {out_}, Init::normal(0.1f)}};
  }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor& x_in) override {
    x_ = x_in.data() != nullptr ? x_in : ctx.batch.inputs;
    const int64_t rows = x_.numel() / in_;
    ZERO_ASSIGN_OR_RETURN(y_, floats(ctx.allocator, rows * out_));
    const float* x = x_.data_as<float>();
    const std::vector<float> w = values_of(p.at("weight"));
    const std::vector<float> b = values_of(p.at("bias"));
    float* y = static_cast<float*>(y_.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out_; ++o) {
        float acc = b[o];
        for (int64_t i = 0; i < in_; ++i) acc += x[r * in_ + i] * w[o * in_ + i];
        y[r * out_ + o] = std::tanh(acc);
      }
    }
    return y_.tensor(DType::kF32, {rows, out_});
  }

  void release_saved() override { y_.reset(); }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& p, const ParamViews& g,
                                  const Tensor& dy_in) override {
    const int64_t rows = x_.numel() / in_;
    const float* x = x_.data_as<float>();
    const float* y = static_cast<const float*>(y_.data());
    const float* dy = dy_in.data_as<float>();
    const std::vector<float> w = values_of(p.at("weight"));
    std::vector<float> dw(out_ * in_), db(out_);
    const bool first = x_.data() == ctx.batch.inputs.data();
    ZERO_ASSIGN_OR_RETURN(Buffer dx_buf, floats(ctx.allocator, first ? 0 : rows * in_));
    float* dx = static_cast<float*>(dx_buf.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out_; ++o) {
        const float dz = dy[r * out_ + o] * (1.0f - y[r * out_ + o] * y[r * out_ + o]);
        db[o] += dz;
        for (int64_t i = 0; i < in_; ++i) {
          dw[o * in_ + i] += dz * x[r * in_ + i];
          if (!first) dx[r * in_ + i] += dz * w[o * in_ + i];
        }
      }
    }
    add_to(g.at("weight"), dw);
    add_to(g.at("bias"), db);
    y_.reset();
    dx_ = std::move(dx_buf);
    return first ? Tensor() : dx_.tensor(DType::kF32, {rows, in_});
  }

 private:
  std::string name_;
  int64_t in_, out_;
  int sits_out_every_;
  Tensor x_;
  Buffer y_, dx_;
};

// logits = h W + b with W (H, D), either its own or input.weight tied; mean cross-entropy.
class Head final : public Unit {
 public:
  Head(int64_t hidden, int64_t classes, bool tied) : hidden_(hidden), classes_(classes), tied_(tied) {}
  absl::string_view name() const override { return "head"; }
  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> specs = {{"bias", {classes_}, Init::zeros()}};
    if (!tied_) specs.push_back({"weight", {hidden_, classes_}, Init::normal(0.5f)});
    return specs;
  }
  std::vector<TiedParam> tied_params() const override {
    if (!tied_) return {};
    return {{"input", "weight"}};
  }

  absl::StatusOr<Tensor> forward(UnitContext& ctx, const ParamViews& p, const Tensor& h_in) override {
    h_ = h_in;
    const int64_t rows = h_.numel() / hidden_;
    ZERO_ASSIGN_OR_RETURN(probs_, floats(ctx.allocator, rows * classes_));
    const float* h = h_.data_as<float>();
    const std::vector<float> w = values_of(p.at("weight"));
    const std::vector<float> b = values_of(p.at("bias"));
    const int32_t* targets = ctx.batch.targets.data_as<int32_t>();
    float* probs = static_cast<float*>(probs_.data());
    double loss = 0;
    for (int64_t r = 0; r < rows; ++r) {
      float* pr = probs + r * classes_;
      for (int64_t c = 0; c < classes_; ++c) {
        float acc = b[c];
        for (int64_t j = 0; j < hidden_; ++j) acc += h[r * hidden_ + j] * w[j * classes_ + c];
        pr[c] = acc;
      }
      const float max = *std::max_element(pr, pr + classes_);
      ctx.correct += (std::max_element(pr, pr + classes_) - pr) == targets[r];
      float sum = 0;
      for (int64_t c = 0; c < classes_; ++c) sum += (pr[c] = std::exp(pr[c] - max));
      for (int64_t c = 0; c < classes_; ++c) pr[c] /= sum;
      loss -= std::log(pr[targets[r]]);
    }
    ctx.loss = static_cast<float>(loss / rows);
    ctx.predictions += rows;
    return probs_.tensor(DType::kF32, {rows, classes_});
  }

  void release_saved() override { probs_.reset(); }

  absl::StatusOr<Tensor> backward(UnitContext& ctx, const ParamViews& p, const ParamViews& g, const Tensor&) override {
    const int64_t rows = h_.numel() / hidden_;
    const float* h = h_.data_as<float>();
    const std::vector<float> w = values_of(p.at("weight"));
    std::vector<float> dw(hidden_ * classes_), db(classes_);
    const int32_t* targets = ctx.batch.targets.data_as<int32_t>();
    const float* probs = static_cast<const float*>(probs_.data());
    ZERO_ASSIGN_OR_RETURN(dh_, floats(ctx.allocator, rows * hidden_));
    float* dh = static_cast<float*>(dh_.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < classes_; ++c) {
        const float dlogit =
            ctx.loss_scale * (probs[r * classes_ + c] - (targets[r] == c ? 1.0f : 0.0f)) / static_cast<float>(rows);
        db[c] += dlogit;
        for (int64_t j = 0; j < hidden_; ++j) {
          dw[j * classes_ + c] += h[r * hidden_ + j] * dlogit;
          dh[r * hidden_ + j] += dlogit * w[j * classes_ + c];
        }
      }
    }
    add_to(g.at("weight"), dw);
    add_to(g.at("bias"), db);
    probs_.reset();
    return dh_.tensor(DType::kF32, {rows, hidden_});
  }

 private:
  int64_t hidden_, classes_;
  bool tied_;
  Tensor h_;
  Buffer probs_, dh_;
};

}  // namespace

ToyModel::ToyModel(const ToyConfig& config, int rank) {
  units_.push_back(std::make_unique<Linear>("input", config.features, config.hidden));
  const bool sits_out = config.sit_out_rank < 0 || config.sit_out_rank == rank;
  for (int k = 0; k < config.hidden_layers; ++k) {
    units_.push_back(std::make_unique<Linear>(absl::StrCat("hidden_", k), config.hidden, config.hidden,
                                              k == 0 && sits_out ? config.hidden_0_sits_out_every : 0));
  }
  // Tied: input.weight is (H, D), exactly the head's (H, D) weight.
  units_.push_back(std::make_unique<Head>(config.hidden, config.features, config.tied_head));
}

ToyModel::~ToyModel() = default;

std::vector<Unit*> ToyModel::units() {
  std::vector<Unit*> out;
  for (auto& u : units_) out.push_back(u.get());
  return out;
}

Batch ToyData::batch(int64_t features) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  return {Tensor(inputs.data(), DType::kF32, {rows, features}), Tensor(targets.data(), DType::kI32, {rows})};
}

ToyData toy_rows(const ToyConfig& config, int64_t begin, int64_t end, uint64_t seed) {
  ToyData data;
  for (int64_t row = begin; row < end; ++row) {
    std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + row));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const size_t first = data.inputs.size();
    for (int64_t i = 0; i < config.features; ++i) data.inputs.push_back(uniform(rng));
    // The class is the largest feature: learnable, so training visibly lowers the loss.
    data.targets.push_back(static_cast<int32_t>(std::max_element(data.inputs.begin() + first, data.inputs.end()) -
                                                (data.inputs.begin() + first)));
  }
  return data;
}

}  // namespace zero::testing
