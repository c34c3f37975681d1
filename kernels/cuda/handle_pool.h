// Library handles (cuBLAS, cuBLASLt, cuDNN) lent per (thread, device) by a pool that lives as long as the process.
#pragma once

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/status.h"

namespace zero::kernels::cuda {

// The calling thread's handle of a library for a device, as PyTorch's DeviceThreadHandlePool: cuBLAS and cuDNN ask
// multi-threaded callers for a handle per thread. `create` makes a handle of the current device. The first get() on
// a thread borrows one from the pool (made there when none is free); the thread gives it back when it exits, for the
// next thread, since local ranks are threads started anew for each run. Neither the pool nor its handles are ever
// destroyed: at exit the CUDA runtime may be unloaded before static destructors run, and destroying a handle would
// then crash; the driver frees a process's handles when it ends.
template <typename Handle, absl::StatusOr<Handle> (*create)()>
class ThreadHandles {
 public:
  // This thread's handle for `device`, which must be current.
  static absl::StatusOr<Handle> get(int device) {
    thread_local Lease lease;
    return lease.get(device);
  }

 private:
  // The handles no thread holds, by device.
  class Pool {
   public:
    absl::StatusOr<Handle> take(int device) {
      {
        absl::MutexLock lock(&mu_);
        std::vector<Handle>& free = free_[device];
        if (!free.empty()) {
          const Handle h = free.back();
          free.pop_back();
          return h;
        }
      }
      return create();
    }

    void give_back(int device, Handle h) {
      absl::MutexLock lock(&mu_);
      free_[device].push_back(h);
    }

   private:
    absl::Mutex mu_;
    absl::flat_hash_map<int, std::vector<Handle>> free_ ABSL_GUARDED_BY(mu_);
  };

  static Pool& pool() {
    static auto* pool = new Pool;
    return *pool;
  }

  // The handles one thread borrowed, by device. Its thread_local instance gives them back at thread exit; that
  // touches only the pool, never CUDA, so it is safe however late the thread ends.
  class Lease {
   public:
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      for (const auto& [device, h] : handles_) pool().give_back(device, h);
    }

    absl::StatusOr<Handle> get(int device) {
      if (auto it = handles_.find(device); it != handles_.end()) return it->second;
      ZERO_ASSIGN_OR_RETURN(const Handle h, pool().take(device));
      handles_.emplace(device, h);
      return h;
    }

   private:
    absl::flat_hash_map<int, Handle> handles_;
  };
};

}  // namespace zero::kernels::cuda
