// Fuzzes the checkpoint reader: any bytes as the one rank file of a 1-rank checkpoint of the toy model,
// loaded by a fresh stage-3 engine. The file's header and its zero.* metadata (format, save identity, step,
// layout, per-tensor checksums) are all input; a load must end in the checkpoint or an error.
// The corpus's seed is a real save: ZERO_FUZZ_SAVE_SEED=DIR fuzz_checkpoint writes one into DIR and exits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <unistd.h>

#include "runtime/comm/local.h"
#include "runtime/status.h"
#include "shard/engine.h"
#include "tests/shard/toy_model.h"
#include "tests/shard/toy_training.h"

namespace {

// The checkpoint being loaded, in a directory of the process's own (libFuzzer may run several), removed at exit.
struct CheckpointDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("zero-fuzz-checkpoint-" + std::to_string(getpid()));
  CheckpointDir() { std::filesystem::create_directories(path); }
  ~CheckpointDir() { std::filesystem::remove_all(path); }
};

const std::filesystem::path& checkpoint_dir() {
  static const CheckpointDir dir;
  return dir.path;
}

// Runs `use` on a fresh stage-3 engine over the toy model, on one local rank.
template <typename Use>
absl::Status with_toy_engine(Use use) {
  return zero::root_cause(zero::run_local_ranks(1, [&](zero::Communicator& comm) -> absl::Status {
    zero::Allocator allocator(comm.rank());
    zero::testing::ToyModel model(zero::testing::ToyConfig{});
    ZERO_ASSIGN_OR_RETURN(
        std::unique_ptr<zero::Engine> engine,
        zero::Engine::create(model, comm, allocator, zero::testing::adamw_factory(), zero::ZeroConfig{.stage = 3}));
    return use(*engine);
  }));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* seed_dir = std::getenv("ZERO_FUZZ_SAVE_SEED");
  if (seed_dir == nullptr) return 0;
  const absl::Status saved = with_toy_engine([&](zero::Engine& engine) { return engine.save_checkpoint(seed_dir); });
  std::fprintf(stderr, "ZERO_FUZZ_SAVE_SEED=%s: %s\n", seed_dir, saved.ToString().c_str());
  std::exit(saved.ok() ? 0 : 1);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::ofstream(checkpoint_dir() / "rank-00000-of-00001.safetensors", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  (void)with_toy_engine(
      [](zero::Engine& engine) { return engine.load_checkpoint(checkpoint_dir().string()).status(); });
  return 0;
}
