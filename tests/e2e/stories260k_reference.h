// The real model the end-to-end tests run, and what issue 3 says it must produce: greedy
// decoding of "Once upon a time" (with BOS) gives exactly these first 27 ids.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace kvrt::stories260k {

inline const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};
inline const std::vector<int32_t> kExpected = {432, 383, 286, 261, 376, 298, 315, 421, 395,
                                               317, 426, 338, 401, 396, 267, 337, 410, 408,
                                               419, 292, 411, 322, 265, 282, 295, 433, 426};

// ../shared/models/stories260k from the repository root (tests skip when it is absent).
inline std::string model_dir() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/../shared/models/stories260k";
}

}  // namespace kvrt::stories260k
