// zero-selfcheck: runs every collective across in-process ranks and checks each result exactly.
//
// Inputs are small integers, so every sum, mean and max is exact in fp32, bf16, fp16 and int32 and the
// expected value is known in closed form; the byte counters are checked against the ring formulas.
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "runtime/allocator.h"
#include "runtime/comm/local.h"
#include "runtime/status.h"

ABSL_FLAG(int, ranks, 4, "in-process ranks (threads) to run");
ABSL_FLAG(int64_t, count, 100003, "elements per rank buffer (a prime, so chunks are uneven)");

namespace zero {
namespace {

// Rank r's element i: a small integer, exact in every dtype.
float input_value(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 7)); }

struct Check {
  std::string name;
  std::function<absl::Status(Communicator&, Allocator&, DType)> run;
};

absl::StatusOr<Buffer> filled(Allocator& alloc, DType dtype, int64_t count, int rank) {
  ZERO_ASSIGN_OR_RETURN(Buffer b, alloc.allocate(count * dtype_size(dtype), MemoryCategory::kCommBuffers));
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kI32) {
      static_cast<int32_t*>(b.data())[i] = static_cast<int32_t>(input_value(rank, i));
    } else {
      store_from_float(b.data(), dtype, i, input_value(rank, i));
    }
  }
  return b;
}

absl::Status expect_values(const Buffer& b, DType dtype, int64_t count, absl::string_view what,
                           const std::function<float(int64_t)>& expected) {
  for (int64_t i = 0; i < count; ++i) {
    const float got = dtype == DType::kI32 ? static_cast<float>(static_cast<const int32_t*>(b.data())[i])
                                           : load_as_float(b.data(), dtype, i);
    if (got != expected(i)) {
      return absl::InternalError(absl::StrFormat("%s %s: element %d is %g, expected %g", what, dtype_name(dtype), i,
                                                 got, expected(i)));
    }
  }
  return absl::OkStatus();
}

std::vector<Check> checks(int n, int64_t count) {
  const float rank_sum = n * (n + 1) / 2.0f;  // sum over r of (r + 1)
  const auto tensor = [](const Buffer& b, DType dtype, int64_t numel) { return b.tensor(dtype, {numel}); };
  return {
      {"allreduce sum",
       [=](Communicator& comm, Allocator& alloc, DType dtype) -> absl::Status {
         ZERO_ASSIGN_OR_RETURN(Buffer b, filled(alloc, dtype, count, comm.rank()));
         ZERO_RETURN_IF_ERROR(comm.allreduce(tensor(b, dtype, count), ReduceOp::kSum).wait());
         return expect_values(b, dtype, count, "allreduce sum", [=](int64_t i) { return rank_sum * (i % 7); });
       }},
      {"allreduce max",
       [=](Communicator& comm, Allocator& alloc, DType dtype) -> absl::Status {
         ZERO_ASSIGN_OR_RETURN(Buffer b, filled(alloc, dtype, count, comm.rank()));
         ZERO_RETURN_IF_ERROR(comm.allreduce(tensor(b, dtype, count), ReduceOp::kMax).wait());
         return expect_values(b, dtype, count, "allreduce max", [=](int64_t i) { return input_value(n - 1, i); });
       }},
      {"reduce_scatter + allgather",
       [=](Communicator& comm, Allocator& alloc, DType dtype) -> absl::Status {
         const int64_t chunk = count / n;  // the caller pads: here we simply use n * chunk elements
         ZERO_ASSIGN_OR_RETURN(Buffer in, filled(alloc, dtype, n * chunk, comm.rank()));
         ZERO_ASSIGN_OR_RETURN(Buffer shard, alloc.allocate(chunk * dtype_size(dtype), MemoryCategory::kCommBuffers));
         ZERO_RETURN_IF_ERROR(
             comm.reduce_scatter(tensor(in, dtype, n * chunk), tensor(shard, dtype, chunk), ReduceOp::kSum).wait());
         ZERO_RETURN_IF_ERROR(comm.allgather(tensor(shard, dtype, chunk), tensor(in, dtype, n * chunk)).wait());
         return expect_values(in, dtype, n * chunk, "reduce_scatter+allgather",
                              [=](int64_t i) { return rank_sum * (i % 7); });
       }},
      {"broadcast from last rank",
       [=](Communicator& comm, Allocator& alloc, DType dtype) -> absl::Status {
         ZERO_ASSIGN_OR_RETURN(Buffer b, filled(alloc, dtype, count, comm.rank()));
         ZERO_RETURN_IF_ERROR(comm.broadcast(tensor(b, dtype, count), n - 1).wait());
         return expect_values(b, dtype, count, "broadcast", [=](int64_t i) { return input_value(n - 1, i); });
       }},
  };
}

absl::Status check_byte_counters(const Communicator& comm, int64_t count) {
  // Per dtype: two allreduces of `count` elements, one reduce_scatter and one allgather of n*chunk.
  const int64_t n = comm.world_size();
  const int64_t chunk = count / n;
  int64_t expected = 0;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    const int64_t e = dtype_size(dtype);
    expected += 2 * (2 * (n - 1) * count * e / n) + 2 * (n - 1) * chunk * e;
  }
  const CommStats s = comm.stats();
  const int64_t sent = s.total_sent_bytes() - s.of(CollectiveOp::kBroadcast).sent_bytes;
  if (sent != expected) {
    return absl::InternalError(absl::StrFormat("rank %d counted %d bytes sent, the ring formulas give %d",
                                               comm.rank(), sent, expected));
  }
  return absl::OkStatus();
}

int run(int n, int64_t count) {
  std::printf("zero-selfcheck: %d in-process ranks, %lld elements per buffer\n", n, static_cast<long long>(count));
  const std::vector<Check> all = checks(n, count);
  std::vector<std::string> lines;
  std::mutex mu;
  const std::vector<absl::Status> statuses = run_local_ranks(n, [&](Communicator& comm) -> absl::Status {
    Allocator alloc(comm.rank());
    for (const Check& check : all) {
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
        ZERO_RETURN_IF_ERROR(check.run(comm, alloc, dtype));
        if (comm.rank() == 0) {
          std::lock_guard lock(mu);
          lines.push_back(absl::StrFormat("  %-28s %-6s ok", check.name, dtype_name(dtype)));
        }
      }
    }
    ZERO_RETURN_IF_ERROR(check_byte_counters(comm, count));
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      lines.push_back(absl::StrFormat("  %-28s        ok (%s sent by rank 0)", "byte counters vs ring formulas",
                                      format_bytes(comm.stats().total_sent_bytes())));
    }
    return absl::OkStatus();
  });
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  if (absl::Status s = root_cause(statuses); !s.ok()) {
    std::fprintf(stderr, "zero-selfcheck: FAILED: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("zero-selfcheck: all collectives exact on %d ranks\n", n);
  return 0;
}

}  // namespace
}  // namespace zero

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Checks every collective of the local backend across in-process ranks.");
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int64_t count = absl::GetFlag(FLAGS_count);
  if (ranks < 1) {
    std::fprintf(stderr, "zero-selfcheck: --ranks must be at least 1, got %d\n", ranks);
    return 2;
  }
  if (count < ranks) {
    std::fprintf(stderr, "zero-selfcheck: --count must be at least --ranks (%d), got %lld\n", ranks,
                 static_cast<long long>(count));
    return 2;
  }
  return zero::run(ranks, count);
}
