// The TCP store and the torchrun environment: real sockets on 127.0.0.1, real environment variables.
#include "runtime/comm/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zero {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<TcpStore> start_server(absl::Duration timeout = absl::Seconds(30)) {
  auto store = TcpStore::create({.host = "127.0.0.1", .port = 0, .is_server = true, .timeout = timeout});
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

std::unique_ptr<TcpStore> connect_to(int port, absl::Duration timeout = absl::Seconds(30)) {
  auto store = TcpStore::create({.host = "127.0.0.1", .port = port, .is_server = false, .timeout = timeout});
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(store).value();
}

// A port nothing listens on right now: bound and released by the kernel's ephemeral choice.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(TcpStoreTest, SetThenGetReturnsTheSameBytesOnAnotherClient) {
  auto server = start_server();
  auto client = connect_to(server->port());
  const std::string value("a\0b\xff", 4);  // arbitrary bytes, NUL included
  ASSERT_TRUE(server->set("k", value).ok());
  auto got = client->get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
}

TEST(TcpStoreTest, SetOverwritesAnEarlierValue) {
  auto server = start_server();
  ASSERT_TRUE(server->set("k", "first").ok());
  ASSERT_TRUE(server->set("k", "second").ok());
  EXPECT_EQ(server->get("k").value(), "second");
}

TEST(TcpStoreTest, GetBlocksUntilAnotherClientSetsTheKey) {
  auto server = start_server();
  auto setter = connect_to(server->port());
  absl::StatusOr<std::string> got;
  std::thread getter([&] { got = server->get("late"); });
  absl::SleepFor(absl::Milliseconds(200));  // the get is parked on the server by now (or arrives later: same result)
  ASSERT_TRUE(setter->set("late", "here").ok());
  getter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
}

TEST(TcpStoreTest, AddFromManyClientsCountsEveryDeltaOnce) {
  auto server = start_server();
  constexpr int kClients = 8;
  constexpr int kAddsEach = 50;
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = connect_to(server->port());
      for (int i = 0; i < kAddsEach; ++i) seen[c].push_back(client->add("counter", 1).value());
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  // Every add saw a distinct running total: 1..400, each exactly once.
  EXPECT_EQ(all.size(), static_cast<size_t>(kClients * kAddsEach));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kAddsEach);
  EXPECT_EQ(server->add("counter", -400).value(), 0);
  EXPECT_EQ(server->get("counter").value(), "0");
}

TEST(TcpStoreTest, AddToANonIntegerValueFailsNamingTheKey) {
  auto server = start_server();
  ASSERT_TRUE(server->set("text", "hello").ok());
  auto added = server->add("text", 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(added.status())) << added.status();
  EXPECT_THAT(added.status().message(), HasSubstr("'text'"));
  EXPECT_EQ(server->add("fresh", 5).value(), 5);  // the connection is still usable
}

TEST(TcpStoreTest, WaitReturnsOnceEveryKeyExists) {
  auto server = start_server();
  auto client = connect_to(server->port());
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = client->wait(std::vector<std::string>{"a", "b"}); });
  ASSERT_TRUE(server->set("b", "").ok());
  ASSERT_TRUE(server->set("a", "").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(TcpStoreTest, GetOfAMissingKeyTimesOutNamingKeyAndAddress) {
  auto server = start_server();
  // The timeout also bounds the reconnecting get at the end, which the server's threads must answer.
  auto client = connect_to(server->port(), absl::Seconds(2));
  auto got = client->get("never");
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("'never'"));
  EXPECT_THAT(got.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", server->port())));
  // The timed-out call dropped its connection; the next call reconnects and works.
  ASSERT_TRUE(server->set("never", "now").ok());
  EXPECT_EQ(client->get("never").value(), "now");
}

TEST(TcpStoreTest, ClientStartedBeforeTheServerConnectsOnceItListens) {
  const int port = free_port();
  absl::StatusOr<std::unique_ptr<TcpStore>> client;
  std::thread early(
      [&] { client = TcpStore::create({.host = "127.0.0.1", .port = port, .timeout = absl::Seconds(30)}); });
  // The client is retrying meanwhile, most likely; one that starts later connects at once: same result.
  absl::SleepFor(absl::Milliseconds(300));
  auto server = TcpStore::create({.host = "127.0.0.1", .port = port, .is_server = true});
  ASSERT_TRUE(server.ok()) << server.status();
  early.join();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*server)->set("k", "v").ok());
  EXPECT_EQ((*client)->get("k").value(), "v");
}

TEST(TcpStoreTest, ConnectingWithNoServerFailsAfterTheTimeout) {
  const int port = free_port();
  auto client = TcpStore::create({.host = "127.0.0.1", .port = port, .timeout = absl::Milliseconds(300)});
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status())) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(TcpStoreTest, ServerThatGoesAwayFailsAPendingGetInsteadOfHanging) {
  auto server = start_server(absl::Seconds(120));
  auto client = connect_to(server->port(), absl::Seconds(120));
  absl::StatusOr<std::string> got;
  std::thread getter([&] { got = client->get("never"); });
  // The get is parked on the server by now, most likely; one sent after the server closed the connection
  // loses it the same way.
  absl::SleepFor(absl::Milliseconds(200));
  server.reset();
  getter.join();
  // Unavailable, not DeadlineExceeded: it did not hang until the 120 s timeout.
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("lost the connection"));
}

TEST(TcpStoreTest, ListeningOnAPortInUseFailsSayingSo) {
  auto first = start_server();
  auto second = TcpStore::create({.host = "127.0.0.1", .port = first->port(), .is_server = true});
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("MASTER_PORT"));
}

// Sets the torchrun variables for one test and restores the environment after it.
class DistributedEnvTest : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};

  void SetUp() override {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.push_back(v ? std::optional<std::string>(v) : std::nullopt);
    }
    set("RANK", "3");
    set("WORLD_SIZE", "8");
    set("LOCAL_RANK", "1");
    set("MASTER_ADDR", "node0.example");
    set("MASTER_PORT", "29501");
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) {
        setenv(kNames[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kNames[i]);
      }
    }
  }
  static void set(const char* name, const char* value) { setenv(name, value, 1); }

  std::vector<std::optional<std::string>> saved_;
};

TEST_F(DistributedEnvTest, ReadsTheVariablesTorchrunSets) {
  auto env = distributed_env_from_environment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "node0.example");
  EXPECT_EQ(env->master_port, 29501);
}

TEST_F(DistributedEnvTest, MissingVariableIsNamed) {
  unsetenv("MASTER_ADDR");
  auto env = distributed_env_from_environment();
  EXPECT_TRUE(absl::IsInvalidArgument(env.status()));
  EXPECT_THAT(env.status().message(), HasSubstr("MASTER_ADDR is not set"));
}

TEST_F(DistributedEnvTest, NonIntegerIsRejectedQuotingIt) {
  set("WORLD_SIZE", "eight");
  auto env = distributed_env_from_environment();
  EXPECT_TRUE(absl::IsInvalidArgument(env.status()));
  EXPECT_THAT(env.status().message(), HasSubstr("WORLD_SIZE='eight' is not an integer"));
}

TEST_F(DistributedEnvTest, RankNotBelowWorldSizeIsRejected) {
  set("RANK", "8");
  auto env = distributed_env_from_environment();
  EXPECT_TRUE(absl::IsInvalidArgument(env.status()));
  EXPECT_THAT(env.status().message(), HasSubstr("RANK=8 is not below WORLD_SIZE=8"));
}

TEST_F(DistributedEnvTest, PortOutsideTheValidRangeIsRejected) {
  set("MASTER_PORT", "70000");
  auto env = distributed_env_from_environment();
  EXPECT_TRUE(absl::IsInvalidArgument(env.status()));
  EXPECT_THAT(env.status().message(), HasSubstr("MASTER_PORT=70000 is outside 1..65535"));
  set("MASTER_PORT", "0");
  EXPECT_TRUE(absl::IsInvalidArgument(distributed_env_from_environment().status()));
}

TEST_F(DistributedEnvTest, StoreFromTheEnvironmentHostsOnRankZeroAndConnectsElsewhere) {
  const DistributedEnv rank0{
      .rank = 0, .world_size = 2, .local_rank = 0, .master_addr = "127.0.0.1", .master_port = free_port()};
  DistributedEnv rank1 = rank0;
  rank1.rank = 1;
  auto host = TcpStore::create(rank0, absl::Seconds(30));
  ASSERT_TRUE(host.ok()) << host.status();
  auto peer = TcpStore::create(rank1, absl::Seconds(30));
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE((*peer)->set("from1", "x").ok());
  EXPECT_EQ((*host)->get("from1").value(), "x");
}

}  // namespace
}  // namespace zero
