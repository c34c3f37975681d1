// A torchrun-style rendezvous: a key-value store served by rank 0 over TCP, and the launcher's environment.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace zero {

// What torchrun (or any launcher that mimics it) tells each process.
struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // the process's index on its node; picks its GPU
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // rank 0's store listens here
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. InvalidArgument naming the variable
// when one is missing or malformed, when RANK is not below WORLD_SIZE, or the port is outside 1..65535.
absl::StatusOr<DistributedEnv> distributed_env_from_environment();

class TcpStoreServer;

// One client connection to the store, plus, on the rank that hosts it, the server (a background thread).
// Values are arbitrary bytes. Thread-safe: calls are serialised on the one connection. Every call is bounded
// by the timeout: a missing key is DeadlineExceeded naming the key and the address, a server that went
// away is Unavailable. Wire format: host byte order, so every rank must share the host's endianness.
class TcpStore {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;            // the server's port; 0 on the server picks a free one (see port())
    bool is_server = false;  // start the server here (listening on every IPv4 interface) before connecting
    absl::Duration timeout = absl::Seconds(300);  // per call, and for connecting while the server starts
  };

  static absl::StatusOr<std::unique_ptr<TcpStore>> create(Options options);
  // Rank 0 hosts the store on MASTER_PORT; every rank connects to MASTER_ADDR:MASTER_PORT.
  static absl::StatusOr<std::unique_ptr<TcpStore>> create(const DistributedEnv& env, absl::Duration timeout);
  ~TcpStore();  // stops the server, if this store hosts it: clients' pending and later calls fail

  // The port clients connect to (the one the server bound, when it picked it).
  int port() const { return port_; }
  // "host:port"
  std::string address() const;

  absl::Status set(absl::string_view key, absl::string_view value);
  // Blocks until `key` exists.
  absl::StatusOr<std::string> get(absl::string_view key);
  // Adds `delta` to the integer stored at `key` (absent counts as 0) and returns the new value.
  absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta);
  // Blocks until every key exists; one timeout bounds the whole wait.
  absl::Status wait(std::span<const std::string> keys);

 private:
  TcpStore(Options options, std::unique_ptr<TcpStoreServer> server, int port);
  // Sends one request and reads its reply, connecting first if needed; on failure the connection is
  // dropped so the next call starts clean.
  absl::StatusOr<std::string> call(uint8_t command, absl::string_view key, absl::string_view payload,
                                   absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time deadline() const;  // now + the timeout
  absl::Status connect_locked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::unique_ptr<TcpStoreServer> server_;
  const int port_;
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace zero
