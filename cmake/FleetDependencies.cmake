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
# librocksdb-dev: the disk tier of sparse tables (ps/table/row_db.h).
pkg_check_modules(ROCKSDB REQUIRED IMPORTED_TARGET rocksdb)
# libdivide-dev: header-only division by a runtime constant (shard routing).
find_path(LIBDIVIDE_INCLUDE_DIR libdivide.h REQUIRED)

# libgoogle-perftools-dev: tcmalloc_minimal, the malloc of the programs that
# send and serve PS requests (fleet_ps_allocator: ps_server, ps_worker,
# heter_worker, ps_bench). Each request allocates ~25 small blocks (header
# parts, ZeroMQ frames, the call's bookkeeping); a malloc and free of a
# small block cost ~130 instructions in glibc (its free ~90 even from the
# thread cache) and ~67 in tcmalloc (bench/README.md, round 13). Off for
# the fuzz build (ASan brings its own malloc) or with -DFLEET_TCMALLOC=OFF;
# the programs then run on glibc's malloc.
option(FLEET_TCMALLOC "Link the PS programs with tcmalloc_minimal" ON)
add_library(fleet_ps_allocator INTERFACE)
if(FLEET_TCMALLOC AND NOT FLEET_FUZZ)
  find_library(TCMALLOC_MINIMAL_LIBRARY tcmalloc_minimal)
  if(TCMALLOC_MINIMAL_LIBRARY)
    target_link_libraries(fleet_ps_allocator INTERFACE ${TCMALLOC_MINIMAL_LIBRARY})
  else()
    message(WARNING "tcmalloc_minimal not found (scripts/setup.sh installs libgoogle-perftools-dev): "
                    "the PS programs use glibc's malloc")
  endif()
endif()

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
