# Every dependency is a Debian package (scripts/setup.sh installs them) or,
# for CUDA, the toolkit under /usr/local/cuda.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gflags REQUIRED)
find_package(glog REQUIRED)
find_package(GTest REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(absl REQUIRED)
find_package(Gloo REQUIRED)
find_package(cppzmq REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# libmicrohttpd-dev: the HTTP server (comm/http_server.h): one event thread
# for every connection, per-connection buffer caps, bodies read only once a
# request is admitted. cpp-httplib stays for clients.
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
find_package(ZLIB REQUIRED)
# libzip-dev: reads and writes FleetX's *_idx.npz (NumPy zip) files.
pkg_check_modules(LIBZIP REQUIRED IMPORTED_TARGET libzip)
# libpcre2-dev: GPT-2's pre-tokenizer regex needs Unicode properties (\p{L}).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# nlohmann-json3-dev: reads GPT-2's encoder.json (and jsonl text).
find_package(nlohmann_json REQUIRED)
# libdivide-dev: header-only division by a runtime constant (shard routing).
find_path(LIBDIVIDE_INCLUDE_DIR libdivide.h REQUIRED)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu/openblas-pthread REQUIRED)

set(FLEET_CUDA OFF)
if(FLEET_WITH_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    if(NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
      set(FLEET_CUDA ON)
      set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 does not know nvcc 13 accepts C++20
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
        set(CMAKE_CUDA_ARCHITECTURES 80)
      endif()
    else()
      message(STATUS "nvcc found but NCCL is missing: building without CUDA")
    endif()
  else()
    message(STATUS "nvcc not found: building without CUDA")
  endif()
endif()
message(STATUS "FleetPS CUDA/NCCL support: ${FLEET_CUDA}")
