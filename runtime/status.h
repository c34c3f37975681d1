// Error plumbing: absl::Status propagation macros and ZERO_CHECK for programmer errors.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace zero {

// Prints "file:line: check `cond` failed: message" and aborts. For broken invariants, never for user input.
[[noreturn]] void check_failed(absl::string_view cond, absl::string_view file, int line, absl::string_view message);

}  // namespace zero

#define ZERO_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) ::zero::check_failed(#cond, __FILE__, __LINE__, absl::StrCat(__VA_ARGS__)); \
  } while (0)

#define ZERO_RETURN_IF_ERROR(expr)                \
  do {                                            \
    if (::absl::Status _st = (expr); !_st.ok()) { \
      return _st;                                 \
    }                                             \
  } while (0)

#define ZERO_CONCAT_INNER(a, b) a##b
#define ZERO_CONCAT(a, b) ZERO_CONCAT_INNER(a, b)
#define ZERO_ASSIGN_OR_RETURN(lhs, expr) ZERO_ASSIGN_OR_RETURN_IMPL(ZERO_CONCAT(_statusor_, __LINE__), lhs, expr)
#define ZERO_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()
