// How many OpenMP threads the CPU kernels called from a thread may use, and a rank's share of the cores.
#pragma once

namespace zero {

// The calling thread's setting (OpenMP's per-thread omp_get_max_threads(): kernels called from this thread
// split their work over that many threads).
int cpu_threads();
void set_cpu_threads(int threads);

// The cores this process may run on (its CPU affinity mask, which a launcher, a container or taskset narrows).
int available_cores();

// Gives the calling rank thread its share of the cores: available_cores() over the `ranks_sharing` ranks that run
// on the same cores (the threads of this process, or processes whose affinity masks overlap), at least one, so
// that ranks do not oversubscribe them (OpenMP would otherwise give every rank thread a team as large as the mask).
// A valid OMP_NUM_THREADS caps it: a count per rank the user chose, which is never raised, and which an exported
// OMP_NUM_THREADS = nproc cannot turn into an oversubscription.
void use_rank_share_of_cores(int ranks_sharing);

}  // namespace zero
