// cuDNN's fused flash attention: cudnn-frontend SDPA graphs, forward and backward, built once per shape and thread.
#include "kernels/cuda/cudnn_attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/handle_pool.h"
#include "runtime/cuda/stream_launch.h"
#include "runtime/status.h"

namespace zero::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using fe::graph::Graph;
using fe::graph::Tensor_attributes;

// OK; Unimplemented where cuDNN has no engine for the graph on this GPU (a refusal: the caller runs the tiled kernels);
// Internal for anything else (a library that did not load, a graph it cannot run), naming the step and cuDNN's message.
absl::Status fe_status(const fe::error_object& e, const char* what) {
  using enum fe::error_code_t;
  if (e.is_good()) return absl::OkStatus();
  const std::string message = absl::StrCat("cuDNN ", what, ": ", e.err_msg);
  if (e.code == GRAPH_NOT_SUPPORTED || e.code == HEURISTIC_QUERY_FAILED ||
      e.code == GRAPH_EXECUTION_PLAN_CREATION_FAILED) {
    return absl::UnimplementedError(message);
  }
  return absl::InternalError(
      absl::StrCat(message, " (ZERO_CUDNN_ATTENTION=0 runs the tiled attention kernels instead of cuDNN's)"));
}

absl::Status cudnn_status(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudnnGetErrorString(s)));
}

// A shape of the attention: batch, sequence, heads, head size.
struct Dims {
  int64_t b, t, nh, hs;
  template <typename H>
  friend H AbslHashValue(H h, const Dims& d) {
    return H::combine(std::move(h), d.b, d.t, d.nh, d.hs);
  }
  friend bool operator==(const Dims&, const Dims&) = default;
};

// The tensors the graphs read and write, by uid.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// q, k, v and their gradients as (B, NH, T, HS) views of (B, T, 3C), each starting at its own third; o and do of
// (B, T, C); the statistics (B, NH, T, 1) fp32.
std::vector<int64_t> qkv_strides(const Dims& d) { return {d.t * 3 * d.nh * d.hs, d.hs, 3 * d.nh * d.hs, 1}; }
std::vector<int64_t> out_strides(const Dims& d) { return {d.t * d.nh * d.hs, d.hs, d.nh * d.hs, 1}; }
std::vector<int64_t> head_dims(const Dims& d) { return {d.b, d.nh, d.t, d.hs}; }

std::shared_ptr<Tensor_attributes> input(Graph& g, const char* name, Uid uid, std::vector<int64_t> dims,
                                         std::vector<int64_t> strides) {
  return g.tensor(
      Tensor_attributes().set_name(name).set_uid(uid).set_dim(std::move(dims)).set_stride(std::move(strides)));
}

void set_output(Tensor_attributes& t, Uid uid, std::vector<int64_t> dims, std::vector<int64_t> strides) {
  t.set_output(true).set_uid(uid).set_dim(std::move(dims)).set_stride(std::move(strides));
}

std::vector<int64_t> stats_dims(const Dims& d) { return {d.b, d.nh, d.t, 1}; }
std::vector<int64_t> stats_strides(const Dims& d) { return {d.nh * d.t, d.t, 1, 1}; }

float score_scale(const Dims& d) { return 1.0f / std::sqrt(static_cast<float>(d.hs)); }

std::shared_ptr<Graph> new_graph(DType dtype) {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// q, k, v: the inputs both graphs read from (B, T, 3C).
std::array<std::shared_ptr<Tensor_attributes>, 3> qkv_inputs(Graph& g, const Dims& d) {
  return {input(g, "q", kQ, head_dims(d), qkv_strides(d)), input(g, "k", kK, head_dims(d), qkv_strides(d)),
          input(g, "v", kV, head_dims(d), qkv_strides(d))};
}

// out = softmax(q k^T · scale + causal mask) v, with the statistics for backward.
std::shared_ptr<Graph> forward_graph(DType dtype, const Dims& d) {
  std::shared_ptr<Graph> g = new_graph(dtype);
  const auto [q, k, v] = qkv_inputs(*g, d);
  const auto options = fe::graph::SDPA_attributes()
                           .set_name("attention")
                           .set_generate_stats(true)
                           .set_causal_mask(true)
                           .set_attn_scale(score_scale(d));
  const auto [o, stats] = g->sdpa(q, k, v, options);
  set_output(*o, kO, head_dims(d), out_strides(d));
  set_output(*stats, kStats, stats_dims(d), stats_strides(d));
  stats->set_data_type(fe::DataType_t::FLOAT);
  return g;
}

// dq, dk, dv from do and the forward's q, k, v, o and statistics; deterministic.
std::shared_ptr<Graph> backward_graph(DType dtype, const Dims& d) {
  std::shared_ptr<Graph> g = new_graph(dtype);
  const auto [q, k, v] = qkv_inputs(*g, d);
  const auto o = input(*g, "o", kO, head_dims(d), out_strides(d));
  const auto d_o = input(*g, "do", kDO, head_dims(d), out_strides(d));
  const auto stats = input(*g, "stats", kStats, stats_dims(d), stats_strides(d));
  stats->set_data_type(fe::DataType_t::FLOAT);
  const auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_causal_mask(true)
                           .set_attn_scale(score_scale(d))
                           .set_deterministic_algorithm(true);
  const auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  set_output(*dq, kDQ, head_dims(d), qkv_strides(d));
  set_output(*dk, kDK, head_dims(d), qkv_strides(d));
  set_output(*dv, kDV, head_dims(d), qkv_strides(d));
  return g;
}

// Validates `g` and builds its plan for `h`; Unimplemented with cuDNN's reason where it has none for this GPU.
absl::Status build(Graph& g, cudnnHandle_t h) {
  ZERO_RETURN_IF_ERROR(fe_status(g.validate(), "validate"));
  ZERO_RETURN_IF_ERROR(fe_status(g.build_operation_graph(h), "build_operation_graph"));
  ZERO_RETURN_IF_ERROR(fe_status(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"));
  ZERO_RETURN_IF_ERROR(fe_status(g.check_support(h), "check_support"));
  return fe_status(g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
}

// A shape's two graphs on one handle, with their workspace sizes; both null where cuDNN refused the shape.
struct Plans {
  std::shared_ptr<Graph> forward, backward;
  int64_t forward_workspace = 0, backward_workspace = 0;
};

absl::StatusOr<Plans> build_plans(cudnnHandle_t h, DType dtype, const Dims& d) {
  Plans p{.forward = forward_graph(dtype, d), .backward = backward_graph(dtype, d)};
  absl::Status status = build(*p.forward, h);
  if (status.ok()) status = build(*p.backward, h);
  if (status.ok()) status = fe_status(p.forward->get_workspace_size(p.forward_workspace), "get_workspace_size");
  if (status.ok()) status = fe_status(p.backward->get_workspace_size(p.backward_workspace), "get_workspace_size");
  // cuDNN may leave a non-sticky CUDA error behind while it probes engines: cleared, so that the launch around this
  // does not report it as its own.
  cudaGetLastError();
  if (!status.ok()) return status;
  return p;
}

// Every handle's plans, by shape. A handle serves one thread at a time (ThreadHandles), so a graph never runs on two
// threads at once.
class PlanCache {
 public:
  absl::StatusOr<std::shared_ptr<const Plans>> get(cudnnHandle_t h, DType dtype, const Dims& d) {
    const Key key{h, dtype, d};
    {
      absl::MutexLock lock(&mu_);
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    absl::StatusOr<Plans> built = build_plans(h, dtype, d);
    if (!built.ok() && built.status().code() != absl::StatusCode::kUnimplemented) return built.status();
    auto plans = std::make_shared<const Plans>(built.ok() ? *std::move(built) : Plans{});
    absl::MutexLock lock(&mu_);
    if (!built.ok() && refusals_logged_.insert({dtype, d}).second) {
      std::fprintf(stderr,
                   "zero: cuDNN attention refused %s B=%lld T=%lld NH=%lld HS=%lld, using the tiled kernels: %s\n",
                   std::string(dtype_name(dtype)).c_str(), static_cast<long long>(d.b), static_cast<long long>(d.t),
                   static_cast<long long>(d.nh), static_cast<long long>(d.hs), built.status().ToString().c_str());
    }
    plans_.emplace(key, plans);
    return plans;
  }

 private:
  using Key = std::tuple<cudnnHandle_t, DType, Dims>;
  absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<const Plans>> plans_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::pair<DType, Dims>> refusals_logged_ ABSL_GUARDED_BY(mu_);
};

PlanCache& plan_cache() {
  static auto* cache = new PlanCache;  // never destroyed, as the handles its graphs were built for
  return *cache;
}

absl::StatusOr<cudnnHandle_t> create_handle() {
  cudnnHandle_t h = nullptr;
  ZERO_RETURN_IF_ERROR(cudnn_status(cudnnCreate(&h), "cudnnCreate"));
  return h;
}

// body() (an absl::Status) as a launch on `stream`, with `h` set to it: what cuDNN queues (building plans may, running
// them does) goes there. The body's error is returned, not kept as the device's failure.
template <typename Body>
absl::Status on_stream(cudnnHandle_t h, Stream stream, const char* name, Body&& body) {
  return library_call(stream, name, [&](cudaStream_t native) {
    ZERO_RETURN_IF_ERROR(cudnn_status(cudnnSetStream(h, native), "cudnnSetStream"));
    return body();
  });
}

// Runs the forward (or backward) graph of `d` on cuda:`device`'s current stream with `pack`'s pointers and a
// stream-ordered workspace; false where cuDNN refused the shape.
absl::StatusOr<bool> run(int device, DType dtype, const Dims& d, bool backward,
                         std::unordered_map<int64_t, void*> pack) {
  CudaDeviceGuard guard;
  ZERO_RETURN_IF_ERROR(guard.set(device));
  ZERO_ASSIGN_OR_RETURN(const cudnnHandle_t h, (ThreadHandles<cudnnHandle_t, create_handle>::get(device)));
  const Stream stream = current_cuda_stream(device);
  std::shared_ptr<const Plans> plans;
  ZERO_RETURN_IF_ERROR(on_stream(h, stream, "cudnn_attention_plans", [&]() -> absl::Status {
    ZERO_ASSIGN_OR_RETURN(plans, plan_cache().get(h, dtype, d));
    return absl::OkStatus();
  }));
  if (plans->forward == nullptr) return false;
  const Graph& graph = backward ? *plans->backward : *plans->forward;
  const int64_t workspace = backward ? plans->backward_workspace : plans->forward_workspace;
  const auto execute = [&](void* ws) {
    return on_stream(h, stream, "cudnn_attention", [&] { return fe_status(graph.execute(h, pack, ws), "execute"); });
  };
  ZERO_RETURN_IF_ERROR(workspace > 0 ? with_scratch(device, static_cast<size_t>(workspace), execute)
                                     : execute(nullptr));
  return true;
}

// The byte offset of q's (or k's, v's) first element in a row of (B, T, 3C).
void* part(const void* qkv, int index, const Dims& d, DType dtype) {
  return static_cast<char*>(const_cast<void*>(qkv)) + index * d.nh * d.hs * dtype_size(dtype);
}

}  // namespace

absl::StatusOr<bool> cudnn_attention_forward(int device, void* out, float* lse, const void* inp, DType dtype, int64_t b,
                                             int64_t t, int64_t nh, int64_t hs) {
  const Dims d{b, t, nh, hs};
  return run(device, dtype, d, /*backward=*/false,
             {{kQ, part(inp, 0, d, dtype)},
              {kK, part(inp, 1, d, dtype)},
              {kV, part(inp, 2, d, dtype)},
              {kO, out},
              {kStats, lse}});
}

absl::StatusOr<bool> cudnn_attention_backward(int device, void* dinp, const void* dout, const void* inp,
                                              const void* out, const float* lse, DType dtype, int64_t b, int64_t t,
                                              int64_t nh, int64_t hs) {
  const Dims d{b, t, nh, hs};
  return run(device, dtype, d, /*backward=*/true,
             {{kQ, part(inp, 0, d, dtype)},
              {kK, part(inp, 1, d, dtype)},
              {kV, part(inp, 2, d, dtype)},
              {kO, const_cast<void*>(out)},
              {kDO, const_cast<void*>(dout)},
              {kStats, const_cast<float*>(lse)},
              {kDQ, part(dinp, 0, d, dtype)},
              {kDK, part(dinp, 1, d, dtype)},
              {kDV, part(dinp, 2, d, dtype)}});
}

}  // namespace zero::kernels::cuda
