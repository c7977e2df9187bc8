// How a subcommand that runs a model starts (generate, bench, serve): the configuration, the
// plugins and the runtime, in this process -- its TP ranks as threads -- or as one rank of an
// MPI job (`mpirun -np N kvrt ...`, tp.backend = "mpi" or "auto" under a launcher).
//
// Under MPI the start is one collective: every rank loads its config, plugins and weights, then
// they exchange how it went and what they loaded. A rank that failed fails every rank with its
// reason and its rank named; a rank whose configuration differs from rank 0's (model, weight
// dtype, plugin or plugin version, page size, pool size, plugin options) is refused with the
// difference named. Then rank 0 runs the subcommand and the others follow() it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/plugin/registry.h"
#include "core/runtime/runtime.h"

namespace kvrt::comm {
class MpiGroup;
}

namespace kvrt::runtime {

struct Session {
  config::Config cfg;         // tp.size filled in from the launcher under MPI
  plugin::Registry registry;  // knows cfg's plugin tables
  Runtime rt;
  comm::MpiGroup* mpi = nullptr;  // this process's MPI group; null with threads
  int rank() const;
  bool leads() const { return rt.engine->leads(); }
};

// `config_path` may be empty (the defaults); `overrides` are --set's.
Result<std::unique_ptr<Session>> start(const std::string& config_path,
                                       const std::vector<std::string>& overrides);

// A following rank's whole job: runs rank 0's commands until rank 0 stops the group. Returns the
// process's exit code (0 when rank 0 stopped it, 1 when the group failed: the reason, naming the
// rank, is on stderr).
int follow(Session& session);

// What the subcommands that cannot run as TP ranks say under a launcher with more than one
// process (e.g. "kvrt eval"), or OK when there is no such launcher.
Status refuse_under_launcher(const std::string& what);

}  // namespace kvrt::runtime
