// ZERO_VECTOR_CLONES: a function compiled for AVX2 and for the baseline ISA, picked when the program loads.
#pragma once

// GCC/Clang target_clones. Only for code whose bits do not depend on the vector width: elementwise math and
// reductions in a fixed order (as sum_fp64), no fp32 `omp simd reduction(+)`. AVX2 without FMA: no contraction
// either, so the AVX2 clone computes what the baseline one computes, bit for bit.
// Under ThreadSanitizer, the baseline alone: the clones' resolver runs while the program loads, before the
// sanitizer's runtime that its instrumentation calls is ready.
#if defined(__SANITIZE_THREAD__)
#define ZERO_VECTOR_CLONES
#else
#define ZERO_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
