# Abseil compiled from source with this build's flags, for the ThreadSanitizer build (scripts/tsan.sh): Debian's
# libabsl is not instrumented, so TSan cannot see absl::Mutex order memory and reports races that are not there.
# One static library of the sources zero uses, under every absl:: name zero's targets link.
# Input: ZERO_ABSEIL_SOURCE_DIR, the folder that holds absl/ (scripts/abseil_source.sh fetches it).
file(GLOB_RECURSE zero_absl_sources CONFIGURE_DEPENDS
     LIST_DIRECTORIES false RELATIVE ${ZERO_ABSEIL_SOURCE_DIR} ${ZERO_ABSEIL_SOURCE_DIR}/absl/*.cc)
# Not library code (tests, benchmarks, mocks, generators), not this platform's (Windows), or not used (random).
list(FILTER zero_absl_sources EXCLUDE REGEX "(_test|_benchmark|_testing|test_|mock|_win|_gen)[a-z_]*\\.cc$")
list(FILTER zero_absl_sources EXCLUDE REGEX "^absl/(random|.*/testing|.*/internal/test)/")
list(TRANSFORM zero_absl_sources PREPEND ${ZERO_ABSEIL_SOURCE_DIR}/)

add_library(zero_absl STATIC ${zero_absl_sources})
target_include_directories(zero_absl SYSTEM PUBLIC ${ZERO_ABSEIL_SOURCE_DIR})
target_link_libraries(zero_absl PUBLIC Threads::Threads)
target_compile_options(zero_absl PRIVATE -w)  # Abseil's code, not ours: its warnings are not ours to fix
foreach(name cleanup flags flags_parse flags_reflection flags_usage flat_hash_map inlined_vector status statusor
             str_format strings synchronization time)
  add_library(absl::${name} ALIAS zero_absl)
endforeach()
