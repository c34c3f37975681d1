#include "runtime/comm/mpi.h"

// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "runtime/allocator.h"
#include "runtime/comm/reduce.h"
#include "runtime/status.h"

namespace zero {
namespace {

constexpr int64_t kDefaultPieceBytes = int64_t{64} << 20;

const char* at_bytes(const void* base, int64_t offset) { return static_cast<const char*>(base) + offset; }
char* at_bytes(void* base, int64_t offset) { return static_cast<char*>(base) + offset; }

absl::Status mpi_status(int rc, absl::string_view call) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return absl::InternalError(absl::StrCat(call, " failed: ", absl::string_view(text, length)));
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Prints why this rank fails and ends every rank of the job.
[[noreturn]] void end_every_rank(const absl::Status& cause) {
  int rank = -1;
  if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "zero: rank %s: %s\n", rank < 0 ? "?" : std::to_string(rank).c_str(), cause.ToString().c_str());
  std::fflush(stderr);
  if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; this keeps [[noreturn]] honest where MPI is unusable
}

// Polls `request` (started by a call that returned `rc`) until it completes or `deadline` passes: a few
// spins, then sleeps doubling up to 1 ms, so oversubscribed ranks leave the cores to the ranks they wait for.
absl::Status wait_until(int rc, absl::string_view call, MPI_Request& request, absl::Time deadline,
                        absl::FunctionRef<std::string()> timeout_message) {
  ZERO_RETURN_IF_ERROR(mpi_status(rc, call));
  constexpr int kSpins = 16;
  absl::Duration nap = absl::Microseconds(4);
  for (int poll = 0;; ++poll) {
    int done = 0;
    ZERO_RETURN_IF_ERROR(mpi_status(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test"));
    if (done) return absl::OkStatus();
    if (absl::Now() >= deadline) return absl::DeadlineExceededError(timeout_message());
    if (poll >= kSpins) {
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }
}

// `len` bytes whose extent is `stride` bytes, so element r of an array of them is chunk r of a strided
// buffer: lets one MPI call move the same piece of every rank's chunk.
class StridedBytes {
 public:
  StridedBytes() = default;
  StridedBytes(const StridedBytes&) = delete;
  StridedBytes& operator=(const StridedBytes&) = delete;
  ~StridedBytes() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }

  absl::Status init(int64_t len, int64_t stride) {
    MPI_Datatype contiguous = MPI_DATATYPE_NULL;
    ZERO_RETURN_IF_ERROR(
        mpi_status(MPI_Type_contiguous(static_cast<int>(len), MPI_BYTE, &contiguous), "MPI_Type_contiguous"));
    const int rc = MPI_Type_create_resized(contiguous, 0, static_cast<MPI_Aint>(stride), &type_);
    MPI_Type_free(&contiguous);
    ZERO_RETURN_IF_ERROR(mpi_status(rc, "MPI_Type_create_resized"));
    return mpi_status(MPI_Type_commit(&type_), "MPI_Type_commit");
  }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

class MpiBackend final : public Backend {
 public:
  MpiBackend(MPI_Comm comm, const CommOptions& options, int64_t piece_bytes)
      : comm_(comm), options_(options), piece_bytes_(piece_bytes) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_size_);
    if (options_.allocator == nullptr) {
      own_allocator_ = std::make_unique<Allocator>(rank_);
      options_.allocator = own_allocator_.get();
    }
  }
  ~MpiBackend() override {
    if (mpi_usable()) MPI_Comm_free(&comm_);
  }

  absl::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status run(const Collective& c, absl::Time deadline) override {
    switch (c.op) {
      case CollectiveOp::kBarrier: {
        MPI_Request request;
        return finish(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", request, c, deadline);
      }
      case CollectiveOp::kAllreduce: return allreduce(c, deadline);
      default: break;
    }
    const int64_t chunk = c.chunk_bytes();
    const int64_t piece = piece_bytes_for(c.dtype);
    for (int64_t offset = 0; offset < chunk; offset += piece) {
      ZERO_RETURN_IF_ERROR(run_piece(c, offset, std::min(piece, chunk - offset), deadline));
    }
    return absl::OkStatus();
  }

  void abort(const absl::Status& cause) override { end_every_rank(cause); }

 private:
  // The largest piece one MPI call moves per rank: a whole number of elements, and small enough that
  // world size x piece byte offsets fit the int counts and displacements of MPI-3.
  int64_t piece_bytes_for(DType dtype) const {
    const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
    const int64_t limit = std::min<int64_t>(piece_bytes_, INT_MAX / world_size_);
    return std::max(esize, limit / esize * esize);
  }

  absl::Status finish(int rc, absl::string_view call, MPI_Request& request, const Collective& c, absl::Time deadline) {
    return wait_until(rc, call, request, deadline, [&] {
      return absl::StrCat("timed out in ", c.describe(), " on rank ", rank_, " after ",
                          absl::FormatDuration(options_.timeout),
                          ": a peer stopped answering, died or issued a different collective (MPI cannot tell "
                          "which; unless ZERO_DEBUG_COLLECTIVES=0, each collective is checked first). Raise "
                          "ZERO_COMM_TIMEOUT_S if a rank is legitimately slow");
    });
  }

  absl::StatusOr<Buffer> scratch(int64_t nbytes) {
    return options_.allocator->allocate(nbytes, MemoryCategory::kCommBuffers);
  }

  // Bytes [offset, offset + len) of every rank's chunk.
  absl::Status run_piece(const Collective& c, int64_t offset, int64_t len, absl::Time deadline) {
    const int n = world_size_;
    const int64_t chunk = c.chunk_bytes();
    const int ilen = static_cast<int>(len);
    const bool is_root = rank_ == c.root;
    StridedBytes strided;
    ZERO_RETURN_IF_ERROR(strided.init(len, chunk));
    MPI_Request request;
    switch (c.op) {
      case CollectiveOp::kReduceScatter: {
        ZERO_ASSIGN_OR_RETURN(Buffer received, scratch(n * len));
        ZERO_RETURN_IF_ERROR(finish(
            MPI_Ialltoall(at_bytes(c.send, offset), 1, strided.get(), received.data(), ilen, MPI_BYTE, comm_, &request),
            "MPI_Ialltoall", request, c, deadline));
        return reduce_pieces(c, received, len, at_bytes(c.recv, offset));
      }
      case CollectiveOp::kReduce: {
        ZERO_ASSIGN_OR_RETURN(Buffer received, scratch(is_root ? n * len : 0));
        ZERO_RETURN_IF_ERROR(finish(MPI_Igather(at_bytes(c.recv, offset), ilen, MPI_BYTE, received.data(), ilen,
                                                MPI_BYTE, c.root, comm_, &request),
                                    "MPI_Igather", request, c, deadline));
        return is_root ? reduce_pieces(c, received, len, at_bytes(c.recv, offset)) : absl::OkStatus();
      }
      case CollectiveOp::kAllgather:
      case CollectiveOp::kGather: {
        const bool all = c.op == CollectiveOp::kAllgather;
        // MPI forbids a send buffer inside the receive buffer (an in-place gather): send a copy instead.
        const bool stage = (all || is_root) && bytes_overlap(c.send, chunk, c.recv, n * chunk);
        ZERO_ASSIGN_OR_RETURN(Buffer staged, scratch(stage ? len : 0));
        const void* source = at_bytes(c.send, offset);
        if (stage) ZERO_RETURN_IF_ERROR(queue_copy_bytes(c.device, staged.data(), source, len));
        if (stage) source = staged.data();
        void* target = c.recv == nullptr ? nullptr : at_bytes(c.recv, offset);
        const int rc = all ? MPI_Iallgather(source, ilen, MPI_BYTE, target, 1, strided.get(), comm_, &request)
                           : MPI_Igather(source, ilen, MPI_BYTE, target, 1, strided.get(), c.root, comm_, &request);
        return finish(rc, all ? "MPI_Iallgather" : "MPI_Igather", request, c, deadline);
      }
      case CollectiveOp::kScatter: {
        // The root's own piece may land inside its send buffer (an in-place scatter): receive into a copy.
        const bool stage = is_root && bytes_overlap(c.send, n * chunk, c.recv, chunk);
        ZERO_ASSIGN_OR_RETURN(Buffer staged, scratch(stage ? len : 0));
        void* target = stage ? staged.data() : at_bytes(c.recv, offset);
        const void* source = is_root ? at_bytes(c.send, offset) : nullptr;
        ZERO_RETURN_IF_ERROR(
            finish(MPI_Iscatter(source, 1, strided.get(), target, ilen, MPI_BYTE, c.root, comm_, &request),
                   "MPI_Iscatter", request, c, deadline));
        return stage ? queue_copy_bytes(c.device, at_bytes(c.recv, offset), target, len) : absl::OkStatus();
      }
      case CollectiveOp::kBroadcast:
        return finish(MPI_Ibcast(at_bytes(c.recv, offset), ilen, MPI_BYTE, c.root, comm_, &request), "MPI_Ibcast",
                      request, c, deadline);
      default: return absl::InternalError(absl::StrCat("mpi backend: no piecewise form of ", c.describe()));
    }
  }

  // out = the rank-order reduction of the world size pieces of `len` bytes laid end to end in `received`.
  absl::Status reduce_pieces(const Collective& c, const Buffer& received, int64_t len, void* out) {
    std::vector<const void*> inputs(world_size_);
    for (int r = 0; r < world_size_; ++r) inputs[r] = at_bytes(received.data(), r * len);
    return reduce_in_rank_order(c.device, inputs, out, len / static_cast<int64_t>(dtype_size(c.dtype)), c.dtype,
                                c.reduce_op);
  }

  absl::Status allreduce(const Collective& c, absl::Time deadline) {
    const int64_t esize = static_cast<int64_t>(dtype_size(c.dtype));
    const int64_t segment = piece_bytes_for(c.dtype) / esize * world_size_;  // elements
    for (int64_t first = 0; first < c.count; first += segment) {
      ZERO_RETURN_IF_ERROR(
          allreduce_segment(c, at_bytes(c.recv, first * esize), std::min(segment, c.count - first), deadline));
    }
    return absl::OkStatus();
  }

  // Elements [0, count) of `buffer`: rank r reduces chunk_range(count, r, N), then everyone gathers the ranges.
  absl::Status allreduce_segment(const Collective& c, void* buffer, int64_t count, absl::Time deadline) {
    const int n = world_size_;
    const int64_t esize = static_cast<int64_t>(dtype_size(c.dtype));
    std::vector<int> range_bytes(n), range_offsets(n), mine(n), mine_offsets(n);
    for (int r = 0; r < n; ++r) {
      const auto [begin, end] = chunk_range(count, r, n);
      range_bytes[r] = static_cast<int>((end - begin) * esize);
      range_offsets[r] = static_cast<int>(begin * esize);
    }
    const int64_t my_bytes = range_bytes[rank_];
    for (int r = 0; r < n; ++r) {
      mine[r] = static_cast<int>(my_bytes);
      mine_offsets[r] = static_cast<int>(r * my_bytes);
    }
    ZERO_ASSIGN_OR_RETURN(Buffer received, scratch(n * my_bytes));
    MPI_Request request;
    ZERO_RETURN_IF_ERROR(
        finish(MPI_Ialltoallv(buffer, range_bytes.data(), range_offsets.data(), MPI_BYTE, received.data(), mine.data(),
                              mine_offsets.data(), MPI_BYTE, comm_, &request),
               "MPI_Ialltoallv", request, c, deadline));
    ZERO_RETURN_IF_ERROR(reduce_pieces(c, received, my_bytes, at_bytes(buffer, range_offsets[rank_])));
    return finish(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buffer, range_bytes.data(), range_offsets.data(), MPI_BYTE,
                                  comm_, &request),
                  "MPI_Iallgatherv", request, c, deadline);
  }

  MPI_Comm comm_;
  CommOptions options_;
  const int64_t piece_bytes_;
  int rank_ = 0;
  int world_size_ = 1;
  std::unique_ptr<Allocator> own_allocator_;
};

void finalize_at_exit() {
  if (mpi_usable()) MPI_Finalize();
}

// Initialises MPI once per process (MPI_THREAD_MULTIPLE) unless the program did, and checks its thread level.
absl::Status init_mpi() {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    return absl::FailedPreconditionError("MPI was already finalized; create communicators before MPI_Finalize");
  if (!initialized) {
    int provided = 0;
    ZERO_RETURN_IF_ERROR(
        mpi_status(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread"));
    std::atexit(finalize_at_exit);
  }
  int level = 0;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI runs at thread level ", level,
        " but the mpi communicator issues collectives from its own thread and "
        "needs MPI_THREAD_MULTIPLE (",
        MPI_THREAD_MULTIPLE,
        "): initialise MPI with MPI_Init_thread(..., "
        "MPI_THREAD_MULTIPLE, ...) or let make_mpi_communicator do it, with an Open MPI built with thread support"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> piece_bytes_from_env() {
  const char* s = std::getenv("ZERO_MPI_PIECE_BYTES");
  if (s == nullptr) return kDefaultPieceBytes;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(s, &bytes) || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZERO_MPI_PIECE_BYTES=", s, " is not a positive number of bytes; unset it for 64 MiB"));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> make_mpi_communicator(CommOptions options) {
  if (!options.debug_collectives.has_value()) options.debug_collectives = true;  // see CommOptions
  ZERO_ASSIGN_OR_RETURN(const int64_t piece_bytes, piece_bytes_from_env());
  ZERO_RETURN_IF_ERROR(init_mpi());
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request;
  ZERO_RETURN_IF_ERROR(wait_until(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), "MPI_Comm_idup", request,
                                  absl::Now() + options.timeout, [&] {
                                    return absl::StrCat("timed out after ", absl::FormatDuration(options.timeout),
                                                        " waiting for every rank of MPI_COMM_WORLD to create its "
                                                        "communicator; did a rank fail to start?");
                                  }));
  ZERO_RETURN_IF_ERROR(mpi_status(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"));
  return std::make_unique<Communicator>(std::make_unique<MpiBackend>(comm, options, piece_bytes), options);
}

HostPlacement mpi_host_placement() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  HostPlacement placement;
  int ranks_on_host = 1;
  MPI_Comm_rank(node, &placement.local_rank);
  MPI_Comm_size(node, &ranks_on_host);
  cpu_set_t mine;
  if (sched_getaffinity(0, sizeof(mine), &mine) != 0) CPU_ZERO(&mine);  // unknown: shares with every rank
  std::vector<cpu_set_t> all(static_cast<size_t>(ranks_on_host));
  MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all.data(), sizeof(mine), MPI_BYTE, node);
  MPI_Comm_free(&node);
  placement.ranks_sharing_cores = 0;
  for (cpu_set_t& other : all) {
    cpu_set_t both;
    CPU_AND(&both, &mine, &other);
    if (CPU_COUNT(&mine) == 0 || CPU_COUNT(&other) == 0 || CPU_COUNT(&both) > 0) ++placement.ranks_sharing_cores;
  }
  return placement;
}

int run_mpi_rank(const std::function<absl::Status(Communicator&)>& fn, CommOptions options) {
  return run_mpi_launched([&] { return make_mpi_communicator(options); }, fn);
}

int run_mpi_launched(const std::function<absl::StatusOr<std::unique_ptr<Communicator>>()>& make,
                     const std::function<absl::Status(Communicator&)>& fn) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm = make();
  if (!comm.ok()) end_every_rank(comm.status());
  const absl::Status status = run_rank(fn, **comm, mpi_host_placement().ranks_sharing_cores);
  if (!status.ok()) end_every_rank(status);
  comm->reset();  // drains pending work; a failure there ends every rank through Backend::abort
  MPI_Finalize();
  return 0;
}

}  // namespace zero
