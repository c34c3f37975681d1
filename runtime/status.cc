#include "runtime/status.h"

#include <cstdio>
#include <cstdlib>

namespace zero {

void check_failed(absl::string_view cond, absl::string_view file, int line, absl::string_view message) {
  std::fprintf(stderr, "%.*s:%d: check `%.*s` failed: %.*s\n", static_cast<int>(file.size()), file.data(), line,
               static_cast<int>(cond.size()), cond.data(), static_cast<int>(message.size()), message.data());
  std::abort();
}

}  // namespace zero
