// `kvrt serve`: the runtime, the serving core on its step thread, the HTTP server; SIGINT or
// SIGTERM stops accepting, gives running requests shutdown_grace_s, aborts the rest, exits 0.
#pragma once

#include <string>
#include <vector>

namespace kvrt::cli {

int run_serve(const std::string& config_path, const std::vector<std::string>& overrides);

}  // namespace kvrt::cli
