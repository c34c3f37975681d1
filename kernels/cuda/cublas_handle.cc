// cuBLAS handles lent per (thread, device) by a pool that is never destroyed, as PyTorch's DeviceThreadHandlePool.
#include "kernels/cuda/cublas_handle.h"

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace zero::kernels::cuda {

absl::Status cublas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")"));
}

namespace {

// fp32 in, fp32 products and sums: the default math keeps cublasSgemm off TF32, so results differ from the CPU only
// by summation order (kernels::Fp32Gemm::kTf32 asks for TF32 per call, through the compute type).
// bf16/fp16 in (cublasGemmEx, compute 32F): tensor cores, products exact in fp32 and summed in fp32; the
// DISALLOW flag keeps split-K partial sums in fp32 too (by default cuBLAS may reduce them in a half C's
// dtype), so a half output is rounded exactly once. It changes nothing for fp32 outputs.
absl::Status configure(cublasHandle_t h) {
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h, 0));
  return absl::OkStatus();
}

// A new handle of the current device.
absl::StatusOr<cublasHandle_t> create_handle() {
  cublasHandle_t h = nullptr;
  ZERO_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h));
  if (absl::Status s = configure(h); !s.ok()) {
    cublasDestroy(h);
    return s;
  }
  return h;
}

// The handles no thread holds, by device.
class HandlePool {
 public:
  // A handle of `device` (current) that a thread gave back, or a new one.
  absl::StatusOr<cublasHandle_t> take(int device) {
    {
      absl::MutexLock lock(&mu_);
      std::vector<cublasHandle_t>& free = free_[device];
      if (!free.empty()) {
        const cublasHandle_t h = free.back();
        free.pop_back();
        return h;
      }
    }
    return create_handle();
  }

  void give_back(int device, cublasHandle_t h) {
    absl::MutexLock lock(&mu_);
    free_[device].push_back(h);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<int, std::vector<cublasHandle_t>> free_ ABSL_GUARDED_BY(mu_);
};

// Never destroyed, nor are its handles: at exit the CUDA runtime may be unloaded before static destructors
// run, and cublasDestroy would then crash. The driver frees a process's handles when it ends.
HandlePool& pool() {
  static auto* pool = new HandlePool;
  return *pool;
}

// The handles one thread borrowed, by device. Its thread_local instance gives them back at thread exit;
// that touches only the pool, never CUDA, so it is safe however late the thread ends.
class ThreadLease {
 public:
  ThreadLease() = default;
  ThreadLease(const ThreadLease&) = delete;
  ThreadLease& operator=(const ThreadLease&) = delete;
  ~ThreadLease() {
    for (const auto& [device, h] : handles_) pool().give_back(device, h);
  }

  absl::StatusOr<cublasHandle_t> get(int device) {
    if (auto it = handles_.find(device); it != handles_.end()) return it->second;
    ZERO_ASSIGN_OR_RETURN(const cublasHandle_t h, pool().take(device));
    handles_.emplace(device, h);
    return h;
  }

 private:
  absl::flat_hash_map<int, cublasHandle_t> handles_;
};

}  // namespace

absl::StatusOr<cublasHandle_t> cublas_handle(int device) {
  thread_local ThreadLease lease;
  return lease.get(device);
}

}  // namespace zero::kernels::cuda
