# fleet_add_test(NAME name SOURCES a.cc b.cc LIBS lib... [TIMEOUT seconds] [LABELS l...])
# One GoogleTest executable registered with CTest as one test; every test has
# a timeout so a hang fails the run instead of stalling it.
#
# Every test compiles with one precompiled header of GoogleTest, gMock and the
# library headers tests use most: parsing them took ~3 s of a test file's
# ~10 s, and test files were half of a cold build. GCC uses it where a test's
# flags match its host's (the same for every test but the macros the test
# adds, which those headers do not read), and otherwise parses the headers
# as if there were none, so it changes how fast a test builds, never what.
function(fleet_add_test_pch_host)
  add_executable(fleet_test_pch ${CMAKE_SOURCE_DIR}/tests/pch_host.cc)
  target_link_libraries(fleet_test_pch PRIVATE GTest::gtest GTest::gmock fleet_test_main)
  set_target_properties(fleet_test_pch PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/pch)
  target_precompile_headers(fleet_test_pch PRIVATE
    <gtest/gtest.h> <gmock/gmock.h> <glog/logging.h> <absl/strings/str_cat.h>
    <absl/container/flat_hash_map.h> <google/protobuf/message.h>
    <algorithm> <atomic> <chrono> <cmath> <cstdint> <cstdio> <cstdlib> <cstring> <filesystem>
    <fstream> <functional> <future> <map> <memory> <mutex> <optional> <random> <regex> <set>
    <span> <sstream> <string> <thread> <vector>)
endfunction()

function(fleet_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT TARGET fleet_test_pch)
    fleet_add_test_pch_host()
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock fleet_test_main)
  target_precompile_headers(${T_NAME} REUSE_FROM fleet_test_pch)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "FLEET_BIN_DIR=${CMAKE_BINARY_DIR}/bin;FLEET_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
