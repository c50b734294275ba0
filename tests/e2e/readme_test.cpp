// The README's quick start as a user types it: the short run it documents
// (`bash scripts/quickstart.sh --epochs 1 --limit 3000`) installs nothing new here (the suite runs
// after scripts/setup.sh), rebuilds nothing, and trains. The one change to the command as written
// is a --storage appended (a later flag wins), so that the test never touches the user's results/.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../multiproc/multiproc_util.h"

namespace {
using trainyard::mptest::read_file;
using trainyard::mptest::run_program;
using trainyard::mptest::TempDir;
using namespace std::chrono_literals;

// Every `bash scripts/quickstart.sh ...` command with arguments that the README shows in
// backquotes, split on spaces.
std::vector<std::vector<std::string>> short_runs_in_readme() {
  const std::string readme = read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md");
  std::vector<std::vector<std::string>> commands;
  const std::regex quoted("`(bash scripts/quickstart\\.sh [^`]+)`");
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), quoted);
       it != std::sregex_iterator(); ++it) {
    std::vector<std::string> argv;
    std::istringstream words((*it)[1].str());
    for (std::string w; words >> w;) argv.push_back(w);
    commands.push_back(argv);
  }
  return commands;
}

TEST(Readme, TheShortRunCommandWorksAsWritten) {
  const auto commands = short_runs_in_readme();
  ASSERT_FALSE(commands.empty()) << "README.md shows no short run of scripts/quickstart.sh";
  for (auto argv : commands) {
    TempDir dir;
    argv.insert(argv.end(), {"--storage", dir.str()});
    // From the repository root, where the README's commands are typed.
    std::string line = "cd '" + std::string(TRAINYARD_SOURCE_DIR) + "' && exec";
    for (const auto& a : argv) line += " '" + a + "'";
    auto r = run_program({"/bin/sh", "-c", line}, {}, 110s);
    ASSERT_FALSE(r.timed_out) << r.out << r.err;
    ASSERT_TRUE(r.status.success()) << r.out << r.err;
    EXPECT_NE(r.out.find("Training result"), std::string::npos) << r.out;
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "fashion-mnist" / "result.json")) << r.out;
  }
}

}  // namespace
