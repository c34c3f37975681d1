// ZERO_HD: marks the small inline functions that host code and CUDA device code both call, so one definition serves
// both.
#pragma once

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__ __forceinline__
#else
#define ZERO_HD inline
#endif
