# OpenBLAS as the target OpenBLAS::OpenBLAS, from OpenBLAS's own CMake package (OpenBLASConfig.cmake): no
# pkg-config needed, so a machine with only CMake (the GPU image, scripts/gpu/) finds it too.
# Included by zero's build and by the installed zeroConfig.cmake.
find_package(OpenBLAS CONFIG REQUIRED)
if(NOT TARGET OpenBLAS::OpenBLAS)  # OpenBLAS's package defines the target itself only in newer versions
  add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
  target_include_directories(OpenBLAS::OpenBLAS INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(OpenBLAS::OpenBLAS INTERFACE ${OpenBLAS_LIBRARIES})
endif()
