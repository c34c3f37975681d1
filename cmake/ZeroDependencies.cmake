# Finds zero's dependencies and resolves the AUTO|ON|OFF backend switches into ZERO_HAS_*.
find_package(Threads REQUIRED)
set(ZERO_ABSEIL_SOURCE_DIR "" CACHE PATH "Compile Abseil from this source folder instead of finding it (sanitizer builds)")
if(ZERO_ABSEIL_SOURCE_DIR)
  include(ZeroAbseilSource)
else()
  find_package(absl REQUIRED)
endif()
find_package(nlohmann_json 3 REQUIRED)  # safetensors headers
find_package(OpenMP REQUIRED COMPONENTS CXX)  # CPU optimizers
include(ZeroOpenBLAS)                         # CPU GEMMs
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)  # checkpoint checksums (header-only)
if(ZERO_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(ZERO_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()

# zero_resolve_switch(<switch> <found>) sets ZERO_HAS_<name> or fails when ON cannot be honoured.
function(zero_resolve_switch switch found hint)
  string(REPLACE "ZERO_WITH_" "ZERO_HAS_" has ${switch})
  string(TOUPPER "${${switch}}" mode)
  if(mode STREQUAL "OFF")
    set(${has} OFF PARENT_SCOPE)
  elseif(found)
    set(${has} ON PARENT_SCOPE)
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "${switch}=ON but it was not found: ${hint}")
  else()
    set(${has} OFF PARENT_SCOPE)
  endif()
endfunction()

# CUDA: compile for Ampere and Hopper even where no GPU is present.
set(cuda_found OFF)
if(NOT ZERO_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    set(cuda_found ${CUDAToolkit_FOUND})
  endif()
endif()
zero_resolve_switch(ZERO_WITH_CUDA ${cuda_found} "install the CUDA toolkit or pass -DZERO_WITH_CUDA=OFF")
if(ZERO_HAS_CUDA)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake < 3.26 does not know nvcc's C++20 flag
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
endif()

set(mpi_found OFF)
if(NOT ZERO_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C)
  set(mpi_found ${MPI_C_FOUND})
endif()
zero_resolve_switch(ZERO_WITH_MPI ${mpi_found} "apt-get install libopenmpi-dev openmpi-bin, or pass -DZERO_WITH_MPI=OFF")

# zero_find_beside_cuda(<NAME> <header> <library names>...) sets <NAME>_INCLUDE_DIR and <NAME>_LIBRARY: beside the CUDA
# toolkit, or under <NAME>_ROOT (-D or environment), as an NVIDIA wheel's folder (nvidia-nccl, nvidia-cudnn) holds
# include/ and lib/ with the versioned shared library alone.
function(zero_find_beside_cuda name header)
  set(roots ${${name}_ROOT} $ENV{${name}_ROOT})
  find_path(${name}_INCLUDE_DIR ${header} HINTS ${roots} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(${name}_LIBRARY NAMES ${ARGN} NAMES_PER_DIR HINTS ${roots} ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_ROOT}/lib PATH_SUFFIXES lib)  # NAMES_PER_DIR: the root wins, whatever name it has
endfunction()

set(nccl_found OFF)
if(ZERO_HAS_CUDA AND NOT ZERO_WITH_NCCL STREQUAL "OFF")
  zero_find_beside_cuda(NCCL nccl.h nccl libnccl.so.2)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(nccl_found ON)
    add_library(zero_nccl_lib INTERFACE)
    target_include_directories(zero_nccl_lib INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(zero_nccl_lib INTERFACE ${NCCL_LIBRARY})
  endif()
endif()
zero_resolve_switch(ZERO_WITH_NCCL ${nccl_found} "NCCL needs CUDA and nccl.h/libnccl; pass -DZERO_WITH_NCCL=OFF")

set(cudnn_found OFF)
if(ZERO_HAS_CUDA AND NOT ZERO_WITH_CUDNN STREQUAL "OFF")
  # cuDNN as NCCL; cudnn-frontend's headers under CUDNN_FRONTEND_ROOT (scripts/cudnn_frontend.sh fetches them).
  zero_find_beside_cuda(CUDNN cudnn.h cudnn libcudnn.so.9)
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT}
            PATH_SUFFIXES include)
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY AND CUDNN_FRONTEND_INCLUDE_DIR)
    set(cudnn_found ON)
  endif()
endif()
zero_resolve_switch(ZERO_WITH_CUDNN ${cudnn_found}
                    "cuDNN needs CUDA, cudnn.h/libcudnn and cudnn-frontend's headers (scripts/cudnn_frontend.sh DIR, then \
-DCUDNN_FRONTEND_ROOT=DIR); pass -DZERO_WITH_CUDNN=OFF")
