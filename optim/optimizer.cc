#include "optim/optimizer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/device_memory.h"
#include "runtime/sim/sim_api.h"
#include "runtime/status.h"
#if ZERO_HAS_CUDA
#include "optim/cuda/optim_kernels.h"
#endif

namespace zero {
namespace {

absl::Status check_shard_tensor(const Tensor& t, absl::string_view what, DType dtype, int64_t numel, Device device) {
  if (t.dtype() != dtype || t.numel() != numel || !t.is_contiguous() || !(t.device() == device) ||
      t.data() == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", t.to_string(),
                                                   " but the optimizer's shard needs a contiguous ", dtype_name(dtype),
                                                   " tensor of ", numel, " elements on ", device.to_string()));
  }
  return absl::OkStatus();
}

optim::GradientRead gradient_read(const Gradients& g) {
  return {g.values.data(), g.values.dtype(), g.loss_scale, g.clip};
}

}  // namespace

absl::Status optim::check_device(Device device, absl::string_view optimizer, bool has_cuda_kernel) {
  if (device.is_cpu() || device.is_sim()) return absl::OkStatus();
#if ZERO_HAS_CUDA
  if (has_cuda_kernel) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(optimizer, " has no CUDA kernel yet; keep its shard on the CPU"));
#else
  (void)has_cuda_kernel;
  return absl::FailedPreconditionError(absl::StrCat(
      optimizer, " on ", device.to_string(), ": zero was built without CUDA; reconfigure with -DZERO_WITH_CUDA=ON"));
#endif
}

absl::StatusOr<optim::SquareBinsScratch> optim::allocate_square_bins(const ShardLayout& layout, Allocator& allocator,
                                                                     Device device) {
  SquareBinsScratch bins;
#if ZERO_HAS_CUDA
  if (device.is_cuda() && !layout.chunks().empty()) {
    const int64_t bytes = optim::square_bins_bytes(layout);
    ZERO_ASSIGN_OR_RETURN(bins.device, allocator.allocate(bytes, MemoryCategory::kWorkspace, device));
    ZERO_ASSIGN_OR_RETURN(bins.host, allocator.allocate_pinned(*device_api(device), bytes, MemoryCategory::kWorkspace));
    ZERO_ASSIGN_OR_RETURN(OwnedEvent copied, OwnedEvent::create(*device_api(device), device.index));
    bins.copied.emplace(std::move(copied));
  }
#endif
  (void)layout, (void)allocator, (void)device;
  return bins;
}

absl::Status Optimizer::check_step(const Tensor& params, const Gradients& grads, int64_t step, float lr) const {
  const int64_t n = layout_->shard_numel();
  ZERO_RETURN_IF_ERROR(check_shard_tensor(params, "params", DType::kF32, n, device_));
  const DType g = grads.values.dtype();
  ZERO_RETURN_IF_ERROR(check_shard_tensor(grads.values, "grads (fp32, bf16 or fp16)",
                                          g == DType::kBF16 || g == DType::kF16 ? g : DType::kF32, n, device_));
  if (!(std::isfinite(grads.loss_scale) && grads.loss_scale > 0 && std::isfinite(grads.clip) && grads.clip >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": gradients unscaled by ", grads.loss_scale, " and clipped by ", grads.clip,
                     "; the loss scale must be finite and > 0, the clip finite and >= 0"));
  }
  if (step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " step ", step, ": steps count from 1, as torch.optim's"));
  }
  if (!std::isfinite(lr) || lr < 0) return absl::InvalidArgumentError(absl::StrCat(name(), ": learning rate ", lr));
  return absl::OkStatus();
}

absl::Status Optimizer::step(Tensor params, const Gradients& grads, int64_t step, float lr, Communicator* comm,
                             const HalfCopy& half, const WholeParamNorms* norms) {
  ZERO_RETURN_IF_ERROR(check_step(params, grads, step, lr));
  if (half.enabled()) {
    const DType t = half.out.dtype() == DType::kF16 ? DType::kF16 : DType::kBF16;
    ZERO_RETURN_IF_ERROR(check_shard_tensor(half.out, "the half-precision copy", t, layout_->shard_numel(), device_));
  }
  if (norms != nullptr && (!communicates() || norms->size() != layout_->params().size())) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": norms given for ", norms->size(), " parameters; it ",
                                                   communicates() ? "has " : "takes none, having ",
                                                   layout_->params().size()));
  }
  return update({params.data_as<float>(), gradient_read(grads), step, lr, comm, &half, norms});
}

absl::StatusOr<NormParts> Optimizer::measure(Tensor params, const Gradients& grads, int64_t step, float lr) {
  ZERO_RETURN_IF_ERROR(check_step(params, grads, step, lr));
  static const HalfCopy kNoCopy;
  const StepArgs args{params.data_as<float>(), gradient_read(grads), step, lr, nullptr, &kNoCopy, nullptr};
  ZERO_ASSIGN_OR_RETURN(ChunkSumsReader read_sums, chunk_square_sums(args, /*wait=*/false));
  return NormParts{.layout = layout_, .read_sums = std::move(read_sums)};
}

absl::StatusOr<ChunkSumsReader> Optimizer::chunk_square_sums(const StepArgs&, bool) {
  return absl::UnimplementedError(absl::StrCat(name(), " takes no whole-parameter norms"));
}

absl::Status Optimizer::run_cpu_pass(std::string name, const StepArgs& a, PassAccess access, CpuPass cpu,
                                     bool wait) const {
  std::vector<float*> state;
  for (int i = 0; i < static_cast<int>(state_.size()); ++i) state.push_back(state_data(i));
  if (!device_.is_sim()) return cpu(*layout_, a, state);
  // The shard's tensors on the device as the launch declares them; Tensor() (no access) where the pass has no use.
  const int64_t n = layout_->shard_numel();
  std::vector<Access> accesses;
  const auto declare = [&](const void* p, DType dtype, Use use) {
    if (use == Use::kNone) return Tensor();
    const Tensor t(const_cast<void*>(p), dtype, {n}, device_);
    accesses.push_back(use == Use::kWrite ? writes(t) : reads(t));
    return t;
  };
  const Tensor grads = declare(a.grads.data, a.grads.dtype, Use::kRead);
  const Tensor params = declare(a.params, DType::kF32, access.params);
  HalfCopy half = *a.half;
  if (access.params == Use::kWrite) {
    accesses.push_back(writes(half.out));  // none when disabled: 0 bytes
  } else {
    half.out = Tensor();
  }
  std::vector<Tensor> states;
  for (const float* p : state) states.push_back(declare(p, DType::kF32, access.state));
  return launch_on_sim(
      device_, std::move(name), std::move(accesses),
      [layout = layout_, args = a, grads, params, half, states, cpu = std::move(cpu)](HostTensors& host) {
        HalfCopy host_half = half;
        host_half.out = host(half.out);
        std::vector<float*> host_state;
        for (const Tensor& t : states) host_state.push_back(host(t).data_as<float>());
        StepArgs host_args = args;
        host_args.params = host(params).data_as<float>();
        host_args.grads.data = host(grads).data();
        host_args.comm = nullptr;
        host_args.half = &host_half;
        if (!host.status().ok()) return host.status();
        return cpu(*layout, host_args, host_state);
      },
      wait);
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  const int64_t n = layout_->shard_numel();
  for (const auto& [name, buffer] : state_) out.emplace_back(name, buffer.tensor(DType::kF32, {n}));
  return out;
}

absl::Status Optimizer::allocate_state(Allocator& allocator, const std::vector<std::string>& names) {
  const int64_t nbytes = layout_->shard_numel() * static_cast<int64_t>(sizeof(float));
  for (const std::string& name : names) {
    ZERO_ASSIGN_OR_RETURN(Buffer b, allocator.allocate(nbytes, MemoryCategory::kOptimizerState, device_));
    if (device_.is_cpu()) {
      std::memset(b.data(), 0, nbytes);
    } else if (device_.is_sim()) {  // the host cannot touch it: a memset on the device, as cuda_zero
      const Tensor t = b.tensor(DType::kF32, {layout_->shard_numel()});
      ZERO_RETURN_IF_ERROR(launch_on_sim(device_, "zero optimizer state", {writes(t)}, [t](HostTensors& host) {
        const Tensor h = host(t);
        if (h.data() != nullptr) std::memset(h.data(), 0, h.nbytes());
        return absl::OkStatus();
      }));
    } else {
#if ZERO_HAS_CUDA
      ZERO_RETURN_IF_ERROR(optim::cuda_zero(device_.index, b.data(), nbytes));
#endif
    }
    state_.emplace_back(name, std::move(b));
  }
  return absl::OkStatus();
}

absl::StatusOr<WholeParamNorms> Optimizer::whole_param_norms(const StepArgs& args) {
  if (args.norms != nullptr) return *args.norms;
  if (args.comm == nullptr) {
    for (const FlatParam& p : layout_->params()) {
      if (p.numel > 0 && (p.offset < layout_->shard_begin() || p.offset + p.numel > layout_->shard_end())) {
        return absl::FailedPreconditionError(absl::StrCat(
            name(), " needs whole-parameter norms but parameter '", p.name, "' is not entirely in this shard [",
            layout_->shard_begin(), ", ", layout_->shard_end(), "); pass the rank's communicator"));
      }
    }
  }
  ZERO_ASSIGN_OR_RETURN(ChunkSumsReader read_sums, chunk_square_sums(args, /*wait=*/true));
  ZERO_ASSIGN_OR_RETURN(
      std::vector<WholeParamNorms> norms,
      reduce_norm_parts({NormParts{.layout = layout_, .read_sums = std::move(read_sums)}}, args.comm));
  return std::move(norms[0]);
}

absl::StatusOr<std::vector<WholeParamNorms>> reduce_norm_parts(const std::vector<NormParts>& parts,
                                                               Communicator* comm) {
  constexpr int kWire = SquareSum::kWireInts;
  // Each shard's chunks merged per parameter of its layout, then every shard's parameters on one wire.
  std::vector<std::vector<std::array<SquareSum, 2>>> per_param;
  size_t sums = 0;
  for (const NormParts& shard : parts) {
    std::vector<std::array<SquareSum, 2>>& merged = per_param.emplace_back();
    if (shard.layout == nullptr) continue;  // a shard that measured nothing: no norms
    merged.resize(shard.layout->params().size());
    const std::vector<ShardChunk>& chunks = shard.layout->chunks();
    ZERO_ASSIGN_OR_RETURN(const ChunkSquareSums per_chunk, shard.read_sums());
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (int q = 0; q < 2; ++q) merged[chunks[c].param][q].merge(per_chunk[c][q]);
    }
    sums += 2 * merged.size();
  }
  std::vector<int32_t> wire(sums * kWire);
  size_t at = 0;
  for (const auto& shard : per_param) {
    for (const std::array<SquareSum, 2>& param : shard) {
      for (const SquareSum& sum : param) {
        sum.to_wire(&wire[at]);
        at += kWire;
      }
    }
  }
  if (comm != nullptr && comm->world_size() > 1 && !wire.empty()) {
    Tensor t(wire.data(), DType::kI32, {static_cast<int64_t>(wire.size())});
    ZERO_RETURN_IF_ERROR(comm->allreduce(t, ReduceOp::kSum).wait());
  }
  std::vector<WholeParamNorms> norms;
  at = 0;
  for (const auto& shard : per_param) {
    WholeParamNorms& shard_norms = norms.emplace_back(shard.size());
    for (std::array<double, 2>& param : shard_norms) {
      for (double& norm : param) {
        norm = std::sqrt(SquareSum::from_wire(&wire[at]).value());
        at += kWire;
      }
    }
  }
  return norms;
}

}  // namespace zero
