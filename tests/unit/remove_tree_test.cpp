// remove_tree: what std::filesystem::remove_all does, through nftw (Note [libstdc++ before
// LibTorch]).
#include "trainyard/remove_tree.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../temp_dir.h"

namespace {

namespace fs = std::filesystem;

TEST(RemoveTree, RemovesAFolderWithEverythingUnderItButNotWhatLinksPointTo) {
  trainyard::test::TempDir dir;
  const fs::path outside = dir.path() / "outside.txt";
  std::ofstream(outside) << "keep";
  const fs::path tree = dir.path() / "tree";
  fs::create_directories(tree / "a" / "b");
  std::ofstream(tree / "a" / "b" / "f.bin") << "x";
  std::ofstream(tree / "g.txt") << "y";
  fs::create_symlink(outside, tree / "link");
  std::error_code ec;
  EXPECT_EQ(trainyard::remove_tree(tree.string(), ec), 6u);  // f.bin, b, a, g.txt, link, tree
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::exists(outside)) << "the link's target went too";
}

TEST(RemoveTree, AMissingPathIsNoErrorAndAFileIsRemoved) {
  trainyard::test::TempDir dir;
  std::error_code ec;
  EXPECT_EQ(trainyard::remove_tree((dir.path() / "none").string(), ec), 0u);
  EXPECT_FALSE(ec);
  std::ofstream(dir.path() / "file") << "z";
  EXPECT_EQ(trainyard::remove_tree((dir.path() / "file").string(), ec), 1u);
  EXPECT_FALSE(fs::exists(dir.path() / "file"));
}

TEST(RemoveTree, AnEntryThatCannotBeRemovedIsAnError) {
  // procfs refuses to unlink its entries, to root as well.
  std::error_code ec;
  EXPECT_EQ(trainyard::remove_tree("/proc/self/cwd", ec), 0u);
  EXPECT_TRUE(ec) << "no error for an entry that cannot be removed";
  EXPECT_TRUE(fs::exists("/proc/self/cwd"));
}

}  // namespace
