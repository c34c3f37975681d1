// Failures of the mpi backend under a real mpirun: a killed, stalled, failing, throwing or diverging rank
// ends the whole job with a non-zero exit and a message that says why, never a hang.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

// Generous: every scenario ends in a few seconds; the stalled rank alone would wait forever and the
// communicators' own timeout is 120 s where the scenario does not set a short one.
constexpr absl::Duration kNoHangBound = absl::Seconds(60);

struct JobResult {
  int exit_code = -1;  // mpirun's; 128 + signal if it was killed
  bool hung = false;   // still running at kNoHangBound (then killed)
  std::string output;  // stdout and stderr of mpirun and every rank
};

// Runs `mpirun --oversubscribe -np ranks worker scenario` with `env` added, collecting its output.
JobResult run_job(int ranks, const std::string& scenario, std::vector<std::string> env) {
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  int fds[2];
  if (pipe(fds) != 0) return {.output = "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // a group of its own, so a hung job can be killed whole
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (std::string& e : env) putenv(e.data());
    const std::string np = std::to_string(ranks);
    execl(ZERO_MPIEXEC, ZERO_MPIEXEC, "--oversubscribe", "-np", np.c_str(), ZERO_MPI_FAILURE_WORKER, scenario.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  JobResult result;
  const absl::Time deadline = absl::Now() + kNoHangBound;
  char chunk[4096];
  while (true) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      result.hung = true;
      break;
    }
    pollfd p{.fd = fds[0], .events = POLLIN, .revents = 0};
    if (poll(&p, 1, static_cast<int>(left_ms)) < 0 && errno != EINTR) break;
    if (p.revents == 0) continue;
    const ssize_t got = read(fds[0], chunk, sizeof(chunk));
    if (got <= 0) break;  // EOF: mpirun and every rank closed their output
    result.output.append(chunk, got);
  }
  close(fds[0]);
  if (result.hung) kill(-pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

void expect_failed_promptly(const JobResult& job) {
  EXPECT_FALSE(job.hung) << "the job was still running after " << kNoHangBound << ":\n" << job.output;
  EXPECT_NE(job.exit_code, 0) << job.output;
}

TEST(MpiFailures, KilledRankEndsTheJob) {
  const JobResult job = run_job(4, "kill", {"ZERO_COMM_TIMEOUT_S=120"});
  expect_failed_promptly(job);
  EXPECT_THAT(job.output, HasSubstr("signal 9"));  // mpirun names the killed rank's signal
}

TEST(MpiFailures, StalledRankTimesOutOnItsPeers) {
  // The timeout also bounds creating the communicators and the first allreduce, which all four processes,
  // oversubscribing a loaded machine, must reach in time.
  const JobResult job = run_job(4, "stall", {"ZERO_COMM_TIMEOUT_S=5"});
  expect_failed_promptly(job);
  // Under MPI each collective is checked first, so the peers time out in the check of the stalled one.
  EXPECT_THAT(job.output, HasSubstr("DEADLINE_EXCEEDED: checking that every rank issues #1 allreduce(fp32 x 10, "
                                    "sum): timed out in #0 allgather(uint8 x 32) on rank "));
}

TEST(MpiFailures, RankReturningAnErrorEndsEveryRank) {
  const JobResult job = run_job(3, "error", {"ZERO_COMM_TIMEOUT_S=120"});
  expect_failed_promptly(job);
  EXPECT_THAT(job.output, HasSubstr("zero: rank 1: DATA_LOSS: checkpoint is truncated"));
}

TEST(MpiFailures, RankThrowingEndsEveryRank) {
  const JobResult job = run_job(3, "exception", {"ZERO_COMM_TIMEOUT_S=120"});
  expect_failed_promptly(job);
  EXPECT_THAT(job.output, HasSubstr("zero: rank 0: INTERNAL: rank 0 threw: simulated crash"));
}

TEST(MpiFailures, DivergingRanksAreNamedWithoutAskingForTheCheck) {
  // On by default under MPI: unchecked, the allgather's 3 x 12 floats land in the allreduce's 12.
  for (const std::vector<std::string>& env :
       {std::vector<std::string>{"ZERO_COMM_TIMEOUT_S=120"}, {"ZERO_COMM_TIMEOUT_S=120", "ZERO_DEBUG_COLLECTIVES=1"}}) {
    const JobResult job = run_job(3, "diverge", env);
    expect_failed_promptly(job);
    EXPECT_THAT(job.output,
                HasSubstr("ranks 0, 2 issued #0 allreduce(fp32 x 12, sum); rank 1 issued #0 allgather(fp32 x 12)"));
  }
}

}  // namespace
}  // namespace zero
