// What the tokenizer tests share: the source tree (for tests/data and ../shared), a scratch
// directory to write tokenizer files into, and texts shortened for failure messages.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kvrt::text::test_support {

// $KVRT_SOURCE_DIR (the repository root, which ctest sets), or "" when unset.
inline std::string source_dir() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return root == nullptr ? "" : root;
}

inline std::string shorten(const std::string& text) {
  return text.size() <= 80 ? text : text.substr(0, 80) + "...";
}

// A fresh directory under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "kvrt_tokenizer_test_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes <dir>/name and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::filesystem::path file = std::filesystem::path(path_) / name;
    std::ofstream(file, std::ios::binary) << text;
    return file.string();
  }

 private:
  std::string path_;
};

}  // namespace kvrt::text::test_support
