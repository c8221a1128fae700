# CUDA codec module _zipccl_cuda (included by CMakeLists.txt when ZIPCCL_CUDA
# resolves to ON). Kernels: cuda/window.cu (window codec), cuda/entropy.cu (entropy
# codec), cuda/transport.cu (the ladder's row-prefix copy); module: cuda/module_cuda.cc.
#
#   ZIPCCL_CUDA_ARCHITECTURES  "80;90" by default: SASS for every entry, plus PTX
#                              of the last one (JIT for newer GPUs).
#   ZIPCCL_PTXAS_VERBOSE       ON prints ptxas -v (registers, spills, stack) per kernel.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
option(ZIPCCL_PTXAS_VERBOSE "Print ptxas resource usage (-Xptxas -v) for the CUDA kernels" OFF)

set(_zipccl_cuda_archs "")
list(LENGTH ZIPCCL_CUDA_ARCHITECTURES _zipccl_narch)
if(_zipccl_narch EQUAL 0)
  message(FATAL_ERROR "ZIPCCL_CUDA_ARCHITECTURES is empty")
endif()
math(EXPR _zipccl_last "${_zipccl_narch} - 1")
foreach(_i RANGE ${_zipccl_last})
  list(GET ZIPCCL_CUDA_ARCHITECTURES ${_i} _a)
  if(_i EQUAL _zipccl_last)
    list(APPEND _zipccl_cuda_archs "${_a}")        # SASS + PTX
  else()
    list(APPEND _zipccl_cuda_archs "${_a}-real")   # SASS only
  endif()
endforeach()
message(STATUS "zipccl_jax: building the CUDA module for architectures ${_zipccl_cuda_archs} "
               "(nvcc ${CMAKE_CUDA_COMPILER_VERSION})")

# The kernels as a static library (nvcc does not see nanobind's compiler flags),
# linked into the nanobind module together with the static CUDA runtime.
add_library(zipccl_cuda_kernels STATIC cuda/window.cu cuda/entropy.cu cuda/transport.cu cuda/mailbox.cu)
set_target_properties(zipccl_cuda_kernels PROPERTIES
  CUDA_ARCHITECTURES "${_zipccl_cuda_archs}"
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Static
  POSITION_INDEPENDENT_CODE ON
  CUDA_VISIBILITY_PRESET hidden
  CXX_VISIBILITY_PRESET hidden)
target_include_directories(zipccl_cuda_kernels PRIVATE ffi cuda)
target_include_directories(zipccl_cuda_kernels SYSTEM PRIVATE ${XLA_FFI_INCLUDE_DIR})
target_compile_options(zipccl_cuda_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-O3 -lineinfo --Werror=all-warnings -Xcompiler=-Wall>)
if(ZIPCCL_PTXAS_VERBOSE)
  target_compile_options(zipccl_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
endif()

nanobind_add_module(_zipccl_cuda NB_STATIC cuda/module_cuda.cc)
target_include_directories(_zipccl_cuda PRIVATE ffi cuda)
target_include_directories(_zipccl_cuda SYSTEM PRIVATE ${XLA_FFI_INCLUDE_DIR})
if(TARGET CUDA::cudart_static)
  # Static cudart: the module imports (and registers) on machines without a driver.
  target_link_libraries(_zipccl_cuda PRIVATE zipccl_cuda_kernels CUDA::cudart_static)
else()
  message(WARNING "zipccl_jax: no static CUDA runtime in this toolkit; linking the shared one "
                  "(the module will then need libcudart at import time)")
  target_link_libraries(_zipccl_cuda PRIVATE zipccl_cuda_kernels CUDA::cudart)
endif()
set_target_properties(_zipccl_cuda PROPERTIES CUDA_RUNTIME_LIBRARY Static)
install(TARGETS _zipccl_cuda LIBRARY DESTINATION .)
