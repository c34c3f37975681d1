// How many OpenMP threads the CPU kernels called from a thread may use, and a rank's share of the host's cores.
#pragma once

namespace zero {

// The calling thread's setting (OpenMP's per-thread omp_get_max_threads(): kernels called from this thread
// split their work over that many threads).
int cpu_threads();
void set_cpu_threads(int threads);

// The cores this process may run on (its CPU affinity mask, which a container or taskset narrows).
int available_cores();

// Gives the calling rank thread its share of the host's cores, available_cores() / ranks_on_host and at least
// one, so that ranks sharing a host do not oversubscribe it (OpenMP would otherwise give every rank thread a
// team as large as the host). An OMP_NUM_THREADS in the environment is the user's own choice and is kept.
void use_rank_share_of_cores(int ranks_on_host);

}  // namespace zero
