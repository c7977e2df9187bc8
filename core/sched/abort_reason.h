// The scheduler's abort reasons read "request <id>: <why>" (for its log). Whoever groups or
// shows them by cause (kvrt bench's report, the server's 400) wants the <why> alone.
#pragma once

#include <string>

namespace kvrt::sched {

// `reason` without a leading "request <digits>: ", or unchanged when it has none.
inline std::string without_request_id(const std::string& reason) {
  const std::string prefix = "request ";
  const size_t colon = reason.find(": ");
  if (reason.rfind(prefix, 0) != 0 || colon == std::string::npos || colon == prefix.size()) {
    return reason;
  }
  const std::string id = reason.substr(prefix.size(), colon - prefix.size());
  if (id.find_first_not_of("0123456789") != std::string::npos) return reason;
  return reason.substr(colon + 2);
}

}  // namespace kvrt::sched
