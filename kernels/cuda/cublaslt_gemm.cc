// Half GEMMs through cuBLASLt with a bias, GELU or added-matrix epilogue: descriptors, the algorithm chosen once per
// problem, the call.
#include "kernels/cuda/cublaslt_gemm.h"

#include <cublasLt.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cublas_handle.h"
#include "kernels/cuda/cuda_kernels.h"
#include "runtime/cuda/stream_launch.h"
#include "runtime/status.h"

namespace zero::kernels::cuda {
namespace {

// cuBLASLt's descriptors, destroyed on every path.
struct LtDestroy {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
template <typename Descriptor>
using LtOwned = std::unique_ptr<std::remove_pointer_t<Descriptor>, LtDestroy>;

// A column-major (rows, cols) matrix of `t` with leading dimension ld.
absl::StatusOr<LtOwned<cublasLtMatrixLayout_t>> lt_layout(DType t, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&layout, cuda_data_type(t), rows, cols, ld));
  return LtOwned<cublasLtMatrixLayout_t>(layout);
}

template <typename Value>
absl::Status set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  return cublas_status(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)),
                       "cublasLtMatmulDescSetAttribute");
}
template <typename Value>
absl::Status set_attribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
                           const Value& value) {
  return cublas_status(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
                       "cublasLtMatmulPreferenceSetAttribute");
}

// The workspace a cuBLASLt GEMM may take, as llm.c and PyTorch give it; stream-ordered scratch for the call.
constexpr uint64_t kLtWorkspaceBytes = uint64_t{32} << 20;
// How many of the heuristic's algorithms, best first, are tried for one that suits (LtAlgorithms::choose).
constexpr int kLtCandidates = 8;

// The epilogue's bias and GELU-input pointers, each where it is not null.
absl::Status set_epilogue_pointers(cublasLtMatmulDesc_t desc, const void* bias, const void* gelu_pre) {
  if (bias != nullptr) ZERO_RETURN_IF_ERROR(set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  if (gelu_pre == nullptr) return absl::OkStatus();
  return set_attribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, gelu_pre);
}

// Whether `algo` keeps the sum in fp32 until the epilogue: no split over K, or its partials reduced in the compute
// type. The preference asks for that; this checks the answer where the algorithm's configuration can be read, since a
// split reduced in the output's dtype would round the sum, and add a C matrix, more than once.
bool sums_in_fp32(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 1;
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &written) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme),
                                           &written) != CUBLAS_STATUS_SUCCESS) {
    return true;  // unreadable: the preference's mask is all there is to go by
  }
  return splits <= 1 || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
}

// Whether `algo` may write D apart from C (cublasLt.h's OUT_OF_PLACE_RESULT_SUPPORT); unreadable: left to the call,
// whose refusal takes the unfused path.
bool writes_apart_from_c(const cublasLtMatmulAlgo_t& algo) {
  int32_t support = 1;
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT, &support, sizeof(support),
                                        &written) != CUBLAS_STATUS_SUCCESS) {
    return true;
  }
  return support != 0;
}

// One cuBLASLt GEMM problem on a device: all the heuristic's choice depends on.
struct LtProblem {
  int device;
  bool transpose_a, transpose_b;
  int64_t m, n, k, lda, ldb, ldd;
  DType half, d_dtype;
  bool bias;
  bool gelu;
  bool c;  // a C matrix added, apart from D
  bool operator==(const LtProblem&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const LtProblem& p) {
    return H::combine(std::move(h), p.device, p.transpose_a, p.transpose_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldd, p.half,
                      p.d_dtype, p.bias, p.gelu, p.c);
  }
};

// What `problem`'s epilogue does, for a log line.
const char* epilogue_name(const LtProblem& problem) {
  if (problem.gelu) return problem.bias ? "bias and GELU" : "GELU";
  if (problem.c) return problem.bias ? "bias and added-matrix" : "added-matrix";
  return problem.bias ? "bias" : "plain";
}

// Says once per problem, on stderr, that its epilogue runs unfused (slower, its bits the scratch path's), and why.
void log_unfused(const LtProblem& p, const char* why) {
  std::fprintf(stderr, "zero: %s GEMM %lldx%lldx%lld with a %s epilogue runs unfused: %s\n",
               std::string(dtype_name(p.half)).c_str(), static_cast<long long>(p.m), static_cast<long long>(p.n),
               static_cast<long long>(p.k), epilogue_name(p), why);
}

// The heuristic's best algorithm per problem, asked once per process; none where cuBLASLt offers none, or refused
// the one it offered.
class LtAlgorithms {
 public:
  static LtAlgorithms& get() {
    static auto* algorithms = new LtAlgorithms;
    return *algorithms;
  }

  // desc's bias and GELU input pointers, where it has them, are replaced for the query by one aligned to 16 bytes
  // exactly: the heuristic reads their alignment, and the choice must not depend on where the first caller's lay.
  absl::StatusOr<std::optional<cublasLtMatmulHeuristicResult_t>> choose(const LtProblem& problem, cublasLtHandle_t h,
                                                                        cublasLtMatmulDesc_t desc,
                                                                        cublasLtMatrixLayout_t a,
                                                                        cublasLtMatrixLayout_t b,
                                                                        cublasLtMatrixLayout_t d) {
    absl::MutexLock lock(&mu_);
    if (const auto it = chosen_.find(problem); it != chosen_.end()) return it->second;
    const void* aligned = reinterpret_cast<const void*>(uintptr_t{kLtAlignment});
    ZERO_RETURN_IF_ERROR(
        set_epilogue_pointers(desc, problem.bias ? aligned : nullptr, problem.gelu ? aligned : nullptr));
    cublasLtMatmulPreference_t raw_pref = nullptr;
    ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_pref));
    const LtOwned<cublasLtMatmulPreference_t> pref(raw_pref);
    ZERO_RETURN_IF_ERROR(set_attribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kLtWorkspaceBytes));
    ZERO_RETURN_IF_ERROR(set_attribute(pref.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                       static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)));
    for (const auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      ZERO_RETURN_IF_ERROR(set_attribute(pref.get(), attribute, kLtAlignment));
    }
    std::array<cublasLtMatmulHeuristicResult_t, kLtCandidates> heuristics{};
    int found = 0;
    const cublasStatus_t query =
        cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, d, d, pref.get(), kLtCandidates, heuristics.data(), &found);
    if (query != CUBLAS_STATUS_NOT_SUPPORTED) {
      ZERO_RETURN_IF_ERROR(cublas_status(query, "cublasLtMatmulAlgoGetHeuristic"));
    }
    // The heuristic's best that keeps its sums in fp32, writes D apart from C where the problem has one, and
    // passes cublasLtMatmulAlgoCheck: refused before any call rather than at one, so the caller's fallback never
    // follows a queued GEMM.
    std::optional<cublasLtMatmulHeuristicResult_t> result;
    for (int i = 0; query == CUBLAS_STATUS_SUCCESS && i < found && !result.has_value(); ++i) {
      cublasLtMatmulHeuristicResult_t checked{};
      if (heuristics[i].state == CUBLAS_STATUS_SUCCESS && sums_in_fp32(heuristics[i].algo) &&
          (!problem.c || writes_apart_from_c(heuristics[i].algo)) &&
          cublasLtMatmulAlgoCheck(h, desc, a, b, d, d, &heuristics[i].algo, &checked) == CUBLAS_STATUS_SUCCESS) {
        result = heuristics[i];
      }
    }
    if (!result.has_value()) {
      log_unfused(problem,
                  "none of the heuristic's best 8 keeps its sums in fp32, writes D apart from C where there is one and "
                  "passes cublasLtMatmulAlgoCheck");
    }
    chosen_.emplace(problem, result);
    return result;
  }

  // cuBLASLt refused `problem`'s algorithm at the call: the unfused path from now on.
  void refused(const LtProblem& problem) {
    absl::MutexLock lock(&mu_);
    std::optional<cublasLtMatmulHeuristicResult_t>& chosen = chosen_[problem];
    if (chosen.has_value()) log_unfused(problem, "cuBLASLt refused its algorithm at the call");  // once, of threads
    chosen = std::nullopt;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<LtProblem, std::optional<cublasLtMatmulHeuristicResult_t>> chosen_ ABSL_GUARDED_BY(mu_);
};

// What g asks the epilogue to do, in cuBLASLt's terms.
cublasLtEpilogue_t epilogue(const LtGemm& g) {
  if (g.gelu_pre != nullptr) {
    return g.bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  }
  return g.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// Why cuBLASLt cannot take g (NotFound: the caller's unfused path), as cublaslt_gemm.h lists; every pointer must be
// 16-byte aligned, as the heuristic is told.
absl::Status check_fusable(const LtGemm& g) {
  ZERO_CHECK(g.c == nullptr || g.c != g.d, "lt_gemm: C lies apart from D");
  for (const void* p : {g.a, g.b, g.c, static_cast<const void*>(g.d), g.bias, static_cast<const void*>(g.gelu_pre)}) {
    if (reinterpret_cast<uintptr_t>(p) % kLtAlignment != 0) {
      return absl::NotFoundError("cuBLASLt's GEMM needs 16-byte-aligned tensors");
    }
  }
  if (g.bias != nullptr && g.bias_dtype != g.d_dtype) {
    return absl::NotFoundError("cuBLASLt's bias epilogue here takes the bias in the output's dtype");
  }
  if (g.gelu_pre != nullptr && g.ldd % 8 != 0) {
    return absl::NotFoundError("cuBLASLt's GELU epilogue needs a leading dimension divisible by 8");
  }
  return absl::OkStatus();
}

// g's operation: fp32 compute and scale, the transposes, the epilogue and its bias type and GELU leading dimension
// (the epilogue's pointers are set apart, since the heuristic is asked with stand-ins).
absl::StatusOr<LtOwned<cublasLtMatmulDesc_t>> matmul_desc(const LtGemm& g) {
  cublasLtMatmulDesc_t raw_desc = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LtOwned<cublasLtMatmulDesc_t> desc(raw_desc);
  const auto op = [](bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; };
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, op(g.transpose_a)));
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, op(g.transpose_b)));
  ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue(g)));
  // The bias in D's type, which is also the default: set, as llm.c sets it and as it ran on an H200 at 273a0b2.
  const auto bias_type = static_cast<int32_t>(cuda_data_type(g.d_dtype));
  if (g.bias != nullptr) {
    ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type));
  }
  // The pre-activation takes D's type by default (cublasLt.h), which is gelu_pre's: setting it, even to that, is what
  // cublasLtMatmul may answer CUBLAS_STATUS_INVALID_VALUE to on a combination it does not support.
  if (g.gelu_pre != nullptr) {
    ZERO_RETURN_IF_ERROR(set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldd));
  }
  return desc;
}

std::atomic<int64_t> lt_gemms{0};

}  // namespace

int64_t cublaslt_gemms_run() { return lt_gemms.load(std::memory_order_relaxed); }

// As cublaslt_gemm.h says.
absl::Status lt_gemm(int device, DType half, const LtGemm& g) {
  ZERO_RETURN_IF_ERROR(check_fusable(g));
  ZERO_ASSIGN_OR_RETURN(const cublasLtHandle_t h, cublaslt_handle(device));
  ZERO_ASSIGN_OR_RETURN(const LtOwned<cublasLtMatmulDesc_t> desc, matmul_desc(g));
  // A as stored: (m, k), or (k, m) transposed; B likewise (k, n) or (n, k).
  ZERO_ASSIGN_OR_RETURN(const auto a, lt_layout(half, g.transpose_a ? g.k : g.m, g.transpose_a ? g.m : g.k, g.lda));
  ZERO_ASSIGN_OR_RETURN(const auto b, lt_layout(half, g.transpose_b ? g.n : g.k, g.transpose_b ? g.k : g.n, g.ldb));
  ZERO_ASSIGN_OR_RETURN(const auto d, lt_layout(g.d_dtype, g.m, g.n, g.ldd));
  const LtProblem problem{
      device,    g.transpose_a,     g.transpose_b,         g.m,           g.n, g.k, g.lda, g.ldb, g.ldd, half,
      g.d_dtype, g.bias != nullptr, g.gelu_pre != nullptr, g.c != nullptr};
  ZERO_ASSIGN_OR_RETURN(const auto algorithm,
                        LtAlgorithms::get().choose(problem, h, desc.get(), a.get(), b.get(), d.get()));
  if (!algorithm.has_value()) return absl::NotFoundError("cuBLASLt offers no GEMM with this epilogue for this shape");
  ZERO_RETURN_IF_ERROR(set_epilogue_pointers(desc.get(), g.bias, g.gelu_pre));
  const auto matmul = [&](void* workspace) {
    return library_call(current_cuda_stream(device), "cublasLtMatmul", [&](cudaStream_t stream) {
      const float alpha = 1.0f, beta = g.c != nullptr ? 1.0f : 0.0f;
      // C laid out as D (D itself without one: beta = 0 leaves it unread).
      const cublasStatus_t status =
          cublasLtMatmul(h, desc.get(), &alpha, g.a, a.get(), g.b, b.get(), &beta, g.c != nullptr ? g.c : g.d, d.get(),
                         g.d, d.get(), &algorithm->algo, workspace, algorithm->workspaceSize, stream);
      if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
        LtAlgorithms::get().refused(problem);
        return absl::NotFoundError("cuBLASLt refused its own algorithm");
      }
      ZERO_RETURN_IF_ERROR(cublas_status(status, "cublasLtMatmul"));
      lt_gemms.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    });
  };
  if (algorithm->workspaceSize == 0) return matmul(nullptr);
  return with_scratch(device, algorithm->workspaceSize, matmul);
}

}  // namespace zero::kernels::cuda
