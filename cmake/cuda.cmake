# The CUDA backend's build (included by CMakeLists.txt; docs/gpu.md).
#
# FULGUR_CUDA: AUTO (on when the CUDA toolkit is found), ON (an error
# without it) or OFF. With it on:
#   - src/ops/cuda/*.cu (CUDA C, behind the extern "C" launchers of
#     src/ops/cuda/launch.h) make one static library, fulgur_cuda_kernels,
#     compiled by nvcc for sm_90 (Hopper's code) plus compute_90 PTX (which
#     the driver compiles for any newer GPU), nothing else: each more
#     architecture adds a whole device compilation per file;
#   - the C files of the backend (src/core/device_cuda.c, src/ops/cuda/*.c,
#     src/comm/nccl.c) join their layers, with FULGUR_HAVE_CUDA defined;
#   - the CUDA runtime is linked statically (it loads the driver, libcuda,
#     only when first called, so a build with CUDA runs on a machine without
#     a GPU or a driver: every call is checked and says why), cuBLASLt
#     dynamically from the toolkit, NCCL and NVML are opened with dlopen
#     when used.
# FULGUR_CUDA_KERNELS: the fulgur_cuda_kernels archive of another build of
# this source tree, used instead of compiling the .cu files again: the
# sanitizer build of scripts/test.sh takes the release build's (nvcc code
# is not instrumented by the sanitizers in any case), so CI compiles the
# kernels once.

set(FULGUR_CUDA AUTO CACHE STRING "CUDA backend: AUTO (on when the CUDA toolkit is found), ON or OFF")
set(FULGUR_CUDA_KERNELS "" CACHE FILEPATH
  "libfulgur_cuda_kernels.a of another build of this tree to link instead of compiling src/ops/cuda/*.cu")
# The backend's C files, left out of their layers without CUDA.
set(FG_CUDA_C_REGEX "/src/ops/cuda/|/src/core/device_cuda\\.c$|/src/comm/nccl\\.c$")
set(FULGUR_HAVE_CUDA OFF)
set(FG_CUDA_LIBS "")

if(NOT FULGUR_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublasLt AND TARGET CUDA::cudart_static
     AND EXISTS "${CUDAToolkit_INCLUDE_DIRS}/nccl.h")
    set(FULGUR_HAVE_CUDA ON)
  elseif(FULGUR_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FULGUR_CUDA=ON: the CUDA toolkit (nvcc, the runtime, cuBLASLt and nccl.h) "
      "was not found; put nvcc on the PATH (e.g. /usr/local/cuda/bin) or set CUDAToolkit_ROOT")
  endif()
endif()

if(FULGUR_HAVE_CUDA)
  file(GLOB FG_CUDA_SRCS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/ops/cuda/*.cu)
  if(FULGUR_CUDA_KERNELS)
    if(NOT EXISTS "${FULGUR_CUDA_KERNELS}")
      message(FATAL_ERROR "FULGUR_CUDA_KERNELS=${FULGUR_CUDA_KERNELS}: no such file (build the "
        "release build first: it makes libfulgur_cuda_kernels.a)")
    endif()
    add_library(fulgur_cuda_kernels STATIC IMPORTED GLOBAL)
    # nvcc's host code calls the C++ runtime (static-local guards)
    set_target_properties(fulgur_cuda_kernels PROPERTIES IMPORTED_LOCATION "${FULGUR_CUDA_KERNELS}"
      INTERFACE_LINK_LIBRARIES stdc++)
    message(STATUS "fulgur: CUDA kernels from ${FULGUR_CUDA_KERNELS} (not compiled here)")
  else()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual") # sm_90 code + compute_90 PTX
    endif()
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    enable_language(CUDA)
    # Programs and libraries that link the kernels archive link with the C
    # compiler (the runtime comes in as CUDA::cudart_static), not nvcc.
    set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES FALSE)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_FLAGS_RELEASE "-O3 -lineinfo")
    add_library(fulgur_cuda_kernels STATIC ${FG_CUDA_SRCS})
    target_link_libraries(fulgur_cuda_kernels INTERFACE stdc++) # as the imported one above
    target_include_directories(fulgur_cuda_kernels PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
    set_target_properties(fulgur_cuda_kernels PROPERTIES CUDA_RUNTIME_LIBRARY Static
      POSITION_INDEPENDENT_CODE ON ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
    # the host compiler's warnings as the C code's; nvcc's own as errors
    target_compile_options(fulgur_cuda_kernels PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow;--expt-relaxed-constexpr>")
    if(FULGUR_WERROR)
      target_compile_options(fulgur_cuda_kernels PRIVATE
        "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Werror>")
    endif()
  endif()
  set(FG_CUDA_LIBS fulgur_cuda_kernels CUDA::cudart_static ${CMAKE_DL_LIBS})
endif()

# Called after the layers exist: the defines, headers and libraries of the
# layers that hold backend files.
function(fg_cuda_link_layers)
  if(NOT FULGUR_HAVE_CUDA)
    return()
  endif()
  foreach(l core ops comm)
    target_compile_definitions(fgo_${l} PRIVATE FULGUR_HAVE_CUDA)
    target_include_directories(fgo_${l} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endforeach()
  # core's device backend launches the fill kernel: the archive comes in with core
  target_link_libraries(fg_core PUBLIC fulgur_cuda_kernels CUDA::cudart_static ${CMAKE_DL_LIBS})
  target_link_libraries(fg_ops PUBLIC fulgur_cuda_kernels CUDA::cudart_static ${CMAKE_DL_LIBS})
  target_link_libraries(fg_comm PUBLIC CUDA::cudart_static ${CMAKE_DL_LIBS})
endfunction()

# tests/gpu/test_*.c: each names the layer it links in its first line
# ("layer: ops"); built in every build (without CUDA they test what the
# host shares with the kernels and skip the rest, saying why).
function(fg_cuda_tests)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/test_*.c)
  foreach(src ${srcs})
    get_filename_component(name ${src} NAME_WE)
    file(STRINGS ${src} first LIMIT_COUNT 1)
    string(REGEX MATCH "layer: ([a-z]+)" m "${first}")
    set(layer ${CMAKE_MATCH_1})
    if(NOT layer IN_LIST FG_LAYERS)
      message(FATAL_ERROR "${src}: the first line names no layer (\"/* layer: ops ...\")")
    endif()
    add_executable(${name} ${src})
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(${name} PRIVATE fg_${layer})
    if(FULGUR_HAVE_CUDA)
      target_compile_definitions(${name} PRIVATE FULGUR_HAVE_CUDA)
      target_include_directories(${name} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
    endif()
    add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
    set_tests_properties(${name} PROPERTIES LABELS "unit;gpu" TIMEOUT ${FG_TEST_TIMEOUT}
      ENVIRONMENT "${FG_TEST_ENV}")
  endforeach()
endfunction()
