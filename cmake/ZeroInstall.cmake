# Installs zero's libraries, headers, tools and a CMake package, so another project can find_package(zero).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(zero_exported runtime kernels optim module shard plan models data)
set(zero_export_targets "")
foreach(name IN LISTS zero_exported)
  set_target_properties(zero_${name} PROPERTIES EXPORT_NAME ${name})  # zero_shard -> zero::shard
  list(APPEND zero_export_targets zero_${name})
endforeach()
if(ZERO_HAS_NCCL)
  list(APPEND zero_export_targets zero_nccl_lib)
endif()

install(TARGETS ${zero_export_targets} EXPORT zeroTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY runtime kernels optim shard models DESTINATION include/zero
        FILES_MATCHING PATTERN "*.h")
install(EXPORT zeroTargets NAMESPACE zero:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero)

if(ZERO_HAS_CUDA)  # the files zeroConfig.cmake points the consumer's CUDA::cudart, cublas, cublasLt (and nvrtc, for cuDNN) at
  set(ZERO_CUDA_LIBRARIES "")
  set(cuda_linked cudart cublas cublasLt)
  if(ZERO_HAS_CUDNN)
    list(APPEND cuda_linked nvrtc)
  endif()
  foreach(name IN LISTS cuda_linked)
    get_target_property(location CUDA::${name} IMPORTED_LOCATION)
    list(APPEND ZERO_CUDA_LIBRARIES "${name}=${location}")
  endforeach()
endif()
configure_package_config_file(cmake/zeroConfig.cmake.in ${CMAKE_BINARY_DIR}/zeroConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/zeroConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/zeroConfig.cmake ${CMAKE_BINARY_DIR}/zeroConfigVersion.cmake
              cmake/ZeroOpenBLAS.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zero)

foreach(tool zero-train zero-plan zero-bench)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
