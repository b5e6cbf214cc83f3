// LogDirLock (launch/log_dir_lock.h): one job per log folder, also when the
// hosts of one job share it (NFS). Each case holds locks through separate
// open file descriptions, as separate fleetruns would.
#include "launch/log_dir_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "tests/data/test_util.h"

namespace fleet::launch {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(LogDirLock, AJobOnOneMachineHoldsTheFolderAgainstAnyOther) {
  data::testing::TempDir dir;
  auto held = LogDirLock::Acquire(dir.path(), "j");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(ReadAll(dir.File(".fleetrun.lock")),
            "job j host (one machine) pid " + std::to_string(getpid()) + "\n");
  for (const auto& [job, host] : {std::pair<std::string, std::string>{"j", ""},
                                  {"other", ""},
                                  {"j", "10.0.0.2"}}) {
    auto second = LogDirLock::Acquire(dir.path(), job, host, "10.0.0.1:36001");
    ASSERT_FALSE(second.ok()) << job << " " << host;
    EXPECT_NE(second.status().message().find("is in use by another live job (fleetrun job j host "
                                             "(one machine) pid "),
              std::string::npos)
        << second.status().ToString();
  }
}

TEST(LogDirLock, TheHostsOfOneJobShareTheFolderAndAnotherJobIsRefusedNamingTheHolder) {
  data::testing::TempDir dir;
  const std::string store = "10.0.0.1:36001";
  auto a = LogDirLock::Acquire(dir.path(), "j", "10.0.0.1", store);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = LogDirLock::Acquire(dir.path(), "j", "10.0.0.2", store);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(ReadAll(dir.File(".fleetrun.10.0.0.2.lock")),
            "job j host 10.0.0.2 store " + store + " pid " + std::to_string(getpid()) + "\n");
  // The same host twice; another job id; the same (default) id with another
  // store (another cluster's job); a job on one machine.
  struct Case {
    std::string job, host, store;
  };
  for (const Case& c : {Case{"j", "10.0.0.2", store}, Case{"k", "10.0.0.3", store},
                        Case{"j", "10.0.0.3", "10.0.0.9:36001"}, Case{"j", "", ""}}) {
    auto refused = LogDirLock::Acquire(dir.path(), c.job, c.host, c.store);
    ASSERT_FALSE(refused.ok()) << c.job << " " << c.host << " " << c.store;
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("is in use by another live job (fleetrun job j host "
                                              "10.0.0."),
              std::string::npos)
        << refused.status().ToString();
  }
  // A third host of the job joins.
  EXPECT_TRUE(LogDirLock::Acquire(dir.path(), "j", "10.0.0.3", store).ok());
}

TEST(LogDirLock, ADeadJobsLocksAreTakenOver) {
  data::testing::TempDir dir;
  {
    auto dead = LogDirLock::Acquire(dir.path(), "old", "10.0.0.1", "10.0.0.1:36001");
    ASSERT_TRUE(dead.ok());
  }  // released, as a killed fleetrun's lock is: the file stays
  ASSERT_TRUE(std::filesystem::exists(dir.File(".fleetrun.10.0.0.1.lock")));
  auto one_machine = LogDirLock::Acquire(dir.path(), "new");
  EXPECT_TRUE(one_machine.ok()) << one_machine.status().ToString();
}

TEST(LogDirLock, ALinkInPlaceOfTheLockIsNeverFollowed) {
  data::testing::TempDir dir;
  std::filesystem::create_symlink(dir.File("target"), dir.File(".fleetrun.lock"));
  auto lock = LogDirLock::Acquire(dir.path(), "j");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), StatusCode::kIOError) << lock.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir.File("target")));
}

}  // namespace
}  // namespace fleet::launch
