// The shape of the source tree, as docs/architecture.md states it: the folders of core/ include
// one another without a cycle, every header in core/X/ declares kvrt::X (or a namespace inside
// it), and no source file a reader has to follow is over 1,000 lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

fs::path source_dir() {
  const char* dir = std::getenv("KVRT_SOURCE_DIR");
  return dir != nullptr ? fs::path(dir) : fs::path(".");
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".h" || ext == ".cc" || ext == ".hpp" || ext == ".c" || ext == ".cu" ||
         ext == ".cuh";
}

std::vector<fs::path> sources_under(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && is_source(e.path())) out.push_back(e.path());
  }
  return out;
}

// folder -> the folders of core/ its files include.
std::map<std::string, std::set<std::string>> include_graph(const fs::path& core) {
  static const std::regex include(R"re(#include\s+"core/([a-z_0-9]+)/)re");
  std::map<std::string, std::set<std::string>> graph;
  for (const auto& folder : fs::directory_iterator(core)) {
    if (!folder.is_directory()) continue;
    const std::string name = folder.path().filename().string();
    auto& deps = graph[name];
    for (const fs::path& file : sources_under(folder.path())) {
      const std::string text = read(file);
      for (auto it = std::sregex_iterator(text.begin(), text.end(), include);
           it != std::sregex_iterator(); ++it) {
        if ((*it)[1] != name) deps.insert((*it)[1]);
      }
    }
  }
  return graph;
}

// A cycle through `node` as "a -> b -> a", or empty.
bool find_cycle(const std::map<std::string, std::set<std::string>>& graph, const std::string& node,
                std::map<std::string, int>& state, std::vector<std::string>& path) {
  state[node] = 1;
  path.push_back(node);
  auto it = graph.find(node);
  if (it != graph.end()) {
    for (const std::string& next : it->second) {
      if (state[next] == 1) {
        path.push_back(next);
        return true;
      }
      if (state[next] == 0 && find_cycle(graph, next, state, path)) return true;
    }
  }
  path.pop_back();
  state[node] = 2;
  return false;
}

TEST(Layout, TheFoldersOfCoreIncludeOneAnotherWithoutACycle) {
  const auto graph = include_graph(source_dir() / "core");
  ASSERT_FALSE(graph.empty()) << "no core/ under " << source_dir();
  std::map<std::string, int> state;
  for (const auto& [folder, deps] : graph) {
    std::vector<std::string> path;
    if (state[folder] == 0 && find_cycle(graph, folder, state, path)) {
      std::string cycle;
      for (const std::string& p : path) cycle += (cycle.empty() ? "" : " -> ") + p;
      ADD_FAILURE() << "the folders of core/ include one another in a cycle: " << cycle;
      return;
    }
  }
}

TEST(Layout, EveryHeaderInCoreXDeclaresTheNamespaceKvrtX) {
  const fs::path core = source_dir() / "core";
  for (const auto& folder : fs::directory_iterator(core)) {
    if (!folder.is_directory()) continue;
    const std::string name = folder.path().filename().string();
    const std::regex ns("namespace kvrt::" + name + R"re((\s|::|\{))re");
    for (const fs::path& file : sources_under(folder.path())) {
      if (file.extension() != ".h") continue;
      EXPECT_TRUE(std::regex_search(read(file), ns))
          << fs::relative(file, source_dir()).string() << " does not declare kvrt::" << name;
    }
  }
}

TEST(Layout, NoSourceFileIsOverAThousandLines) {
  const fs::path root = source_dir();
  // The conformance suites are one list of checks each, read check by check.
  for (const char* dir : {"core", "plugins", "kernels", "sdk/include", "sdk/examples"}) {
    for (const fs::path& file : sources_under(root / dir)) {
      const std::string text = read(file);
      const auto lines = std::count(text.begin(), text.end(), '\n');
      EXPECT_LE(lines, 1000) << fs::relative(file, root).string() << " has " << lines
                             << " lines";
    }
  }
}

}  // namespace
