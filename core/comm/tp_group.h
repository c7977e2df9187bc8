// Where a TP group's ranks run. The engine asks its group which ranks this process runs and for
// each one's communicator: every rank, as threads (ThreadGroup, core/comm/thread_communicator.h),
// or one rank per process under an MPI launcher (MpiGroup, core/comm/mpi_group.h).
#pragma once

#include <memory>
#include <vector>

#include "core/comm/communicator.h"

namespace kvrt::comm {

class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int size() const = 0;
  // The ranks this process runs, ascending: all of them, or its own.
  virtual std::vector<int> local_ranks() const = 0;
  // The communicator of local rank `rank`, used by one thread; the group outlives it.
  virtual std::unique_ptr<Communicator> communicator(int rank) = 0;
  // The cores each local rank's products may use, of this machine's `cores`.
  virtual int threads_per_rank(int cores) const = 0;
};

}  // namespace kvrt::comm
