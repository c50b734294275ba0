// The README's quick start as a user types it: the short run it documents
// (`bash scripts/quickstart.sh --epochs 1 --limit 3000`) installs nothing new here (the suite runs
// after scripts/setup.sh), rebuilds nothing, and trains. The one change to the command as written
// is a --storage appended (a later flag wins), so that the test never touches the user's results/.
// And every path of the repository that README.md, docs/ and deploy/'s READMEs name exists, and
// every `trainyard` command in README.md's code blocks parses (TRAINYARD_PARSE_ONLY=1: flags known,
// values valid, nothing run).
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
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

// Paths into the repository that `text` names: words starting with one of its top folders and a
// '/', not preceded by a word character or '/', with trailing punctuation cut. Patterns (*, {},
// <>, ...) are left out, and so are kubectl's `exec deploy/NAME` resource names.
std::vector<std::string> repository_paths_in(const std::string& text) {
  static const char* const kTops[] = {"bench/",   "cmake/",   "deploy/", "docs/",  "examples/",
                                      "include/", "scripts/", "src/",    "tests/", "tools/"};
  auto word_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' ||
           c == '-' || c == '+';
  };
  std::vector<std::string> out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i > 0 && word_char(text[i - 1])) continue;
    for (const char* top : kTops) {
      if (text.compare(i, std::strlen(top), top) != 0) continue;
      std::size_t end = i;
      while (end < text.size() && word_char(text[end])) ++end;
      std::string path = text.substr(i, end - i);
      while (!path.empty() && (path.back() == '.' || path.back() == '-')) path.pop_back();
      const bool pattern = end < text.size() && std::strchr("*{<", text[end]) != nullptr;
      const bool kubectl = i >= 5 && text.compare(i - 5, 5, "exec ") == 0;
      if (!pattern && !kubectl && path.find("...") == std::string::npos) out.push_back(path);
      break;
    }
  }
  return out;
}

// A path names a file or folder, or a program the build makes from PATH.cpp or as a target of the
// folder's CMakeLists.txt (build/tests/unit_tests, build/bench/allreduce_bench).
bool names_something(const std::filesystem::path& root, const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(root / path) || fs::exists(root / (path + ".cpp"))) return true;
  const fs::path p(path);
  const auto cmake = root / p.parent_path() / "CMakeLists.txt";
  return fs::exists(cmake) &&
         read_file(cmake).find("add_executable(" + p.filename().string()) != std::string::npos;
}

// A shell line's words: blanks separate, '...' and "..." quote (a backslash escapes in the
// latter).
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\'' || c == '"') {
      in_word = true;
      for (++i; i < line.size() && line[i] != c; ++i) {
        if (c == '"' && line[i] == '\\' && i + 1 < line.size()) ++i;
        word += line[i];
      }
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// Every command line in README.md's fenced code blocks that runs trainyard (build/trainyard or an
// installed trainyard), after leading VAR=value assignments, continuation lines joined and
// comments cut.
std::vector<std::vector<std::string>> trainyard_commands_in_readme() {
  const std::string readme = read_file(std::string(TRAINYARD_SOURCE_DIR) + "/README.md");
  std::vector<std::vector<std::string>> out;
  std::istringstream lines(readme);
  bool fenced = false;
  std::string joined;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("```")) {
      fenced = !fenced;
      joined.clear();
      continue;
    }
    if (!fenced) continue;
    joined += (joined.empty() ? "" : " ") + line;
    if (!joined.empty() && joined.back() == '\\') {
      joined.pop_back();
      continue;
    }
    const auto comment = joined.find("  #");
    const auto words =
        shell_words(comment == std::string::npos ? joined : joined.substr(0, comment));
    joined.clear();
    // Commands separated by ';', one sent to the background by '&'.
    std::vector<std::vector<std::string>> commands(1);
    for (auto w : words) {
      const bool ends = w.ends_with(";");
      if (ends) w.pop_back();
      if (!w.empty() && w != "&") commands.back().push_back(w);
      if (ends) commands.emplace_back();
    }
    for (auto& c : commands) {
      while (!c.empty() && std::regex_match(c.front(), std::regex("[A-Z_][A-Z0-9_]*=.*")))
        c.erase(c.begin());
      if (c.size() >= 2 && (c[0] == "build/trainyard" || c[0] == "trainyard")) out.push_back(c);
    }
  }
  return out;
}

TEST(Docs, EveryTrainyardCommandInTheReadmeParses) {
  const auto commands = trainyard_commands_in_readme();
  EXPECT_GE(commands.size(), 10u) << "the README's code blocks show trainyard commands";
  for (auto argv : commands) {
    std::string text;
    for (const auto& w : argv) text += w + " ";
    argv[0] = TRAINYARD_CLI_PATH;
    auto r = run_program(argv, {{"TRAINYARD_PARSE_ONLY", "1"}}, 20s);
    EXPECT_TRUE(r.status.success()) << "README.md: `" << text << "` does not parse:\n" << r.err;
  }
}

TEST(Docs, EveryRepositoryPathTheDocsNameExists) {
  namespace fs = std::filesystem;
  const fs::path root = TRAINYARD_SOURCE_DIR;
  std::vector<fs::path> docs = {root / "README.md"};
  for (const auto* dir : {"docs", "deploy/kubernetes", "deploy/ecs"})
    for (const auto& e : fs::directory_iterator(root / dir))
      if (e.path().extension() == ".md") docs.push_back(e.path());
  int checked = 0;
  for (const auto& doc : docs)
    for (const auto& path : repository_paths_in(read_file(doc))) {
      ++checked;
      EXPECT_TRUE(names_something(root, path))
          << fs::relative(doc, root).string() << " names " << path << ", which does not exist";
    }
  EXPECT_GT(checked, 50) << "the docs name paths; the scan found too few";
}

}  // namespace
