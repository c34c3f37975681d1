# ctest -P script: installs the build into WORK_DIR/prefix, then configures, builds and runs the consumer
# project against it with find_package(zero).
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
# zero's headers stay in one folder of their own: a top-level include/runtime would collide with other packages.
file(GLOB installed_includes RELATIVE ${WORK_DIR}/prefix/include ${WORK_DIR}/prefix/include/*)
if(NOT installed_includes STREQUAL "zero")
  message(FATAL_ERROR "include/ holds ${installed_includes}; zero's headers belong in include/zero/ alone")
endif()
# Through the environment (':'-separated): a ';' list in one argument would be split again by run()'s ARGV.
string(REPLACE "|" ":" prefixes "${WORK_DIR}/prefix|${DEPENDENCY_PREFIXES}")
set(ENV{CMAKE_PREFIX_PATH} "${prefixes}")
# The consumer uses no CUDA itself, so it must not need the CUDA toolkit, even from a build that links CUDA.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
message("${last_output}")
