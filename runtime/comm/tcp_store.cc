#include "runtime/comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace zero {

namespace {

// Requests: u8 command, u32 key length, key, u64 payload length, payload.
// Replies: u8 kReplyOk or kReplyError, u64 length, then the value (or the error message).
enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4 };
constexpr uint8_t kReplyOk = 0;
constexpr uint8_t kReplyError = 1;

absl::string_view command_name(uint8_t command) {
  switch (command) {
    case kSet: return "set";
    case kGet: return "get";
    case kAdd: return "add";
    case kWait: return "wait";
  }
  return "?";
}

std::string errno_text(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

// Milliseconds until `deadline` for poll(): -1 for never, at least 0, at most INT_MAX.
int poll_timeout_ms(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)));
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

// Waits until `fd` is ready for `events`: DeadlineExceeded at the deadline, Unavailable on a hang-up.
absl::Status wait_ready(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = poll(&p, 1, poll_timeout_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("poll failed: ", errno_text(errno)));
    if (n == 0) return absl::DeadlineExceededError("timed out");
    if (p.revents & (events | POLLHUP | POLLERR)) return absl::OkStatus();  // recv/send report what it is
  }
}

absl::Status send_all(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ZERO_RETURN_IF_ERROR(wait_ready(fd, POLLOUT, deadline));
    const ssize_t sent = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (sent < 0) return absl::UnavailableError(absl::StrCat("send failed: ", errno_text(errno)));
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return absl::OkStatus();
}

absl::Status recv_all(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ZERO_RETURN_IF_ERROR(wait_ready(fd, POLLIN, deadline));
    const ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got < 0) return absl::UnavailableError(absl::StrCat("recv failed: ", errno_text(errno)));
    if (got == 0) return absl::UnavailableError("the peer closed the connection");
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status send_value(int fd, T value, absl::Time deadline) {
  return send_all(fd, &value, sizeof(T), deadline);
}

template <typename T>
absl::StatusOr<T> recv_value(int fd, absl::Time deadline) {
  T value;
  ZERO_RETURN_IF_ERROR(recv_all(fd, &value, sizeof(T), deadline));
  return value;
}

// A length-prefixed byte string, the length being of type L.
template <typename L>
absl::Status send_bytes(int fd, absl::string_view bytes, absl::Time deadline) {
  ZERO_RETURN_IF_ERROR(send_value<L>(fd, static_cast<L>(bytes.size()), deadline));
  return send_all(fd, bytes.data(), bytes.size(), deadline);
}

template <typename L>
absl::StatusOr<std::string> recv_bytes(int fd, absl::Time deadline) {
  ZERO_ASSIGN_OR_RETURN(const L size, recv_value<L>(fd, deadline));
  std::string bytes(size, '\0');
  ZERO_RETURN_IF_ERROR(recv_all(fd, bytes.data(), bytes.size(), deadline));
  return bytes;
}

std::string encode_int64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof(v)); }

absl::StatusOr<int64_t> decode_int64(absl::string_view bytes) {
  if (bytes.size() != sizeof(int64_t)) return absl::DataLossError("store: malformed integer in a reply");
  int64_t v;
  std::memcpy(&v, bytes.data(), sizeof(v));
  return v;
}

// True when the peer of `fd` hung up (the client of a parked get gave up).
bool peer_hung_up(int fd) {
  pollfd p{.fd = fd, .events = POLLRDHUP, .revents = 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// Connects to host:port once, within `deadline`. Returns the connected (blocking) socket.
absl::StatusOr<int> connect_once(const std::string& host, int port, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = absl::UnavailableError(absl::StrCat("socket failed: ", errno_text(errno)));
      continue;
    }
    absl::Status status;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      status = errno == EINPROGRESS ? wait_ready(fd, POLLOUT, deadline) : absl::UnavailableError(errno_text(errno));
      int err = 0;
      socklen_t len = sizeof(err);
      if (status.ok() && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
        status = absl::UnavailableError(errno_text(err));
      }
    }
    if (status.ok()) {
      freeaddrinfo(found);
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    close(fd);
    last = status;
  }
  freeaddrinfo(found);
  return last;
}

absl::StatusOr<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     " is not set; launch with torchrun (or mpirun-style launchers that export RANK, WORLD_SIZE, "
                     "LOCAL_RANK, MASTER_ADDR and MASTER_PORT), or set it yourself"));
  }
  return std::string(value);
}

absl::StatusOr<int> env_int(const char* name, int min, int max) {
  ZERO_ASSIGN_OR_RETURN(const std::string text, env_string(name));
  int value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "' is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=", value, " is outside ", min, "..", max));
  }
  return value;
}

}  // namespace

absl::StatusOr<DistributedEnv> distributed_env_from_environment() {
  DistributedEnv env;
  ZERO_ASSIGN_OR_RETURN(env.world_size, env_int("WORLD_SIZE", 1, INT_MAX));
  ZERO_ASSIGN_OR_RETURN(env.rank, env_int("RANK", 0, INT_MAX));
  if (env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("RANK=", env.rank, " is not below WORLD_SIZE=", env.world_size,
                                                   "; ranks run from 0 to WORLD_SIZE-1"));
  }
  ZERO_ASSIGN_OR_RETURN(env.local_rank, env_int("LOCAL_RANK", 0, INT_MAX));
  ZERO_ASSIGN_OR_RETURN(env.master_addr, env_string("MASTER_ADDR"));
  ZERO_ASSIGN_OR_RETURN(env.master_port, env_int("MASTER_PORT", 1, 65535));
  return env;
}

// Serves the key-value map: one thread accepts, one thread per connection answers its requests in order.
class TcpStoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> start(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::UnavailableError(absl::StrCat("store server: socket failed: ", errno_text(errno)));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("store server: cannot listen on port ", port, ": ", errno_text(err),
                                                 "; another process may hold it: pick another MASTER_PORT"));
    }
    auto server = std::unique_ptr<TcpStoreServer>(new TcpStoreServer(fd, ntohs(addr.sin_port)));
    if (pipe2(server->wake_, O_CLOEXEC) != 0) {
      return absl::UnavailableError(absl::StrCat("store server: pipe failed: ", errno_text(errno)));
    }
    server->acceptor_ = std::thread([s = server.get()] { s->accept_loop(); });
    return server;
  }

  ~TcpStoreServer() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (int fd : connections_) shutdown(fd, SHUT_RDWR);  // wakes their threads; each closes its own fd
    }
    if (acceptor_.joinable()) {
      const char byte = 0;
      (void)!write(wake_[1], &byte, 1);
      acceptor_.join();
    }
    std::vector<std::thread> threads;  // joined without the lock, which each takes as it ends
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
      if (fd >= 0) close(fd);
    }
  }

  int port() const { return port_; }

 private:
  TcpStoreServer(int listen_fd, int port) : listen_fd_(listen_fd), port_(port) {}

  void accept_loop() {
    for (;;) {
      pollfd p[2] = {{.fd = listen_fd_, .events = POLLIN, .revents = 0},
                     {.fd = wake_[0], .events = POLLIN, .revents = 0}};
      if (poll(p, 2, -1) < 0 && errno != EINTR) return;
      if (p[1].revents != 0) return;
      if (p[0].revents == 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      connections_.insert(fd);
      threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    while (serve_one(fd).ok()) {
    }
    absl::MutexLock lock(&mu_);
    connections_.erase(fd);
    close(fd);
  }

  // Reads one request and answers it; an error ends the connection.
  absl::Status serve_one(int fd) {
    const absl::Time forever = absl::InfiniteFuture();
    ZERO_ASSIGN_OR_RETURN(const uint8_t command, recv_value<uint8_t>(fd, forever));
    ZERO_ASSIGN_OR_RETURN(const std::string key, recv_bytes<uint32_t>(fd, forever));
    ZERO_ASSIGN_OR_RETURN(std::string payload, recv_bytes<uint64_t>(fd, forever));
    absl::StatusOr<std::string> reply = handle(fd, command, key, std::move(payload));
    if (absl::IsCancelled(reply.status())) return reply.status();  // no one to answer
    ZERO_RETURN_IF_ERROR(send_value<uint8_t>(fd, reply.ok() ? kReplyOk : kReplyError, forever));
    return send_bytes<uint64_t>(fd, reply.ok() ? *reply : std::string(reply.status().message()), forever);
  }

  absl::StatusOr<std::string> handle(int fd, uint8_t command, const std::string& key, std::string payload) {
    absl::MutexLock lock(&mu_);
    switch (command) {
      case kSet: data_[key] = std::move(payload); return std::string();
      case kGet:
      case kWait: {
        // Parked until the key appears; the client bounds the wait by its timeout and hangs up, which is
        // polled for every 100 ms.
        const auto key_set_or_stopping = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || data_.contains(key);
        };
        while (!data_.contains(key)) {
          if (stopping_ || peer_hung_up(fd)) return absl::CancelledError("client gone");
          mu_.AwaitWithTimeout(absl::Condition(&key_set_or_stopping), absl::Milliseconds(100));
        }
        return command == kGet ? data_[key] : std::string();
      }
      case kAdd: {
        ZERO_ASSIGN_OR_RETURN(const int64_t delta, decode_int64(payload));
        int64_t value = 0;
        if (auto it = data_.find(key); it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
          return absl::FailedPreconditionError(
              absl::StrCat("store: add to key '", key, "', which holds a value that is not an integer"));
        }
        value += delta;
        data_[key] = absl::StrCat(value);
        return encode_int64(value);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("store: unknown command ", command));
  }

  const int listen_fd_;
  const int port_;
  int wake_[2] = {-1, -1};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  std::set<int> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);  // one per connection, serving it
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::create(Options options) {
  std::unique_ptr<TcpStoreServer> server;
  int port = options.port;
  if (options.is_server) {
    ZERO_ASSIGN_OR_RETURN(server, TcpStoreServer::start(options.port));
    port = server->port();
  }
  auto store = std::unique_ptr<TcpStore>(new TcpStore(std::move(options), std::move(server), port));
  {
    absl::MutexLock lock(&store->mu_);
    ZERO_RETURN_IF_ERROR(store->connect_locked(absl::Now() + store->options_.timeout));
  }
  return store;
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::create(const DistributedEnv& env, absl::Duration timeout) {
  return create({.host = env.master_addr, .port = env.master_port, .is_server = env.rank == 0, .timeout = timeout});
}

TcpStore::TcpStore(Options options, std::unique_ptr<TcpStoreServer> server, int port)
    : options_(std::move(options)), server_(std::move(server)), port_(port) {}

TcpStore::~TcpStore() {
  if (fd_ >= 0) close(fd_);
  server_.reset();
}

std::string TcpStore::address() const { return absl::StrCat(options_.host, ":", port_); }

absl::Status TcpStore::connect_locked(absl::Time deadline) {
  absl::Duration pause = absl::Milliseconds(10);
  for (;;) {
    absl::StatusOr<int> fd = connect_once(options_.host, port_, deadline);
    if (fd.ok()) {
      fd_ = *fd;
      return absl::OkStatus();
    }
    if (absl::Now() + pause >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("could not connect to the store at ", address(), " within ",
                                                      absl::FormatDuration(options_.timeout),
                                                      " (last error: ", fd.status().message(),
                                                      "); check that rank 0 is running and that MASTER_ADDR and "
                                                      "MASTER_PORT point at it"));
    }
    absl::SleepFor(pause);  // the server may not be up yet
    pause = std::min(pause * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<std::string> TcpStore::call(uint8_t command, absl::string_view key, absl::string_view payload,
                                           absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (fd_ < 0) ZERO_RETURN_IF_ERROR(connect_locked(deadline));
  const int fd = fd_;
  const auto exchange = [&]() -> absl::StatusOr<std::string> {
    ZERO_RETURN_IF_ERROR(send_value<uint8_t>(fd, command, deadline));
    ZERO_RETURN_IF_ERROR(send_bytes<uint32_t>(fd, key, deadline));
    ZERO_RETURN_IF_ERROR(send_bytes<uint64_t>(fd, payload, deadline));
    ZERO_ASSIGN_OR_RETURN(const uint8_t reply, recv_value<uint8_t>(fd, deadline));
    ZERO_ASSIGN_OR_RETURN(std::string body, recv_bytes<uint64_t>(fd, deadline));
    if (reply != kReplyOk) return absl::FailedPreconditionError(body);
    return body;
  };
  absl::StatusOr<std::string> result = exchange();
  if (result.ok() || absl::IsFailedPrecondition(result.status())) return result;
  close(fd_);  // the connection is mid-request: start the next call on a fresh one
  fd_ = -1;
  if (absl::IsDeadlineExceeded(result.status())) {
    const bool waits = command == kGet || command == kWait;
    const std::string what = waits ? absl::StrCat("waiting for key '", key, "'")
                                   : absl::StrCat("on ", command_name(command), " of key '", key, "'");
    return absl::DeadlineExceededError(absl::StrCat(
        "timed out after ", absl::FormatDuration(options_.timeout), " ", what, " in the store at ", address(),
        waits ? "; no rank has set it (did the rank that sets it fail or use another key?)" : ""));
  }
  return absl::UnavailableError(absl::StrCat("lost the connection to the store at ", address(), " during ",
                                             command_name(command), " of key '", key, "' (", result.status().message(),
                                             "); did the rank hosting it (rank 0) exit?"));
}

absl::Time TcpStore::deadline() const { return absl::Now() + options_.timeout; }

absl::Status TcpStore::set(absl::string_view key, absl::string_view value) {
  return call(kSet, key, value, deadline()).status();
}

absl::StatusOr<std::string> TcpStore::get(absl::string_view key) { return call(kGet, key, "", deadline()); }

absl::StatusOr<int64_t> TcpStore::add(absl::string_view key, int64_t delta) {
  ZERO_ASSIGN_OR_RETURN(const std::string reply, call(kAdd, key, encode_int64(delta), deadline()));
  return decode_int64(reply);
}

absl::Status TcpStore::wait(std::span<const std::string> keys) {
  const absl::Time all_by = deadline();
  for (const std::string& key : keys) ZERO_RETURN_IF_ERROR(call(kWait, key, "", all_by).status());
  return absl::OkStatus();
}

}  // namespace zero
