// Tensor parallelism across processes: one TP rank per MPI process, started by an MPI launcher
// (`mpirun -np N kvrt ...`, on one host or over a hostfile). Open MPI is the launcher and the
// transport; kvrt adds no machinery of its own.
//
// Collectives are point-to-point messages between the ranks (an all-reduce is a reduce-scatter
// then an all-gather, each rank owning near-equal parts), summed in rank order like the threads'
// communicator, so TP-N over MPI gives the bits TP-N over threads gives. Every wait has a
// deadline: a rank that stops answering (hung, stopped, its link down) is named in the error,
// and the group is broken from then on. A rank that dies is the launcher's to report: mpirun
// names it and stops the job (SIGTERM, then SIGKILL a second later).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/comm/tp_group.h"
#include "core/util/status.h"

namespace kvrt::comm {

// The number of processes an MPI launcher started this job with, read from the launcher's
// environment (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's PMIX_SIZE... MPICH's PMI_SIZE), or 0
// when no launcher started this process. Initialises nothing.
int launcher_world_size();

class MpiGroup : public TpGroup {
 public:
  // This process's group: MPI is initialised on the first call (MPI_THREAD_SERIALIZED: one
  // thread at a time talks to MPI), later calls return the same group. Collectives wait at
  // most timeout_s for the other ranks.
  static Result<MpiGroup*> world(double timeout_s);

  int size() const override { return size_; }
  int rank() const { return rank_; }
  std::vector<int> local_ranks() const override { return {rank_}; }
  // A communicator of its own (a duplicate of the world: its messages never meet another's).
  // The first is made with the group, so a rank that fails before asking for it leaves no rank
  // waiting in MPI_Comm_dup; later ones are made on demand (collective: every rank must ask in
  // the same order). `rank` must be this process's.
  std::unique_ptr<Communicator> communicator(int rank) override;
  // The start-up's communicator, whose waits are ten times longer: the ranks wait there for each
  // other to load their weights. The first is made with the group, later ones on demand.
  std::unique_ptr<Communicator> startup_communicator();
  // The cores shared out over the ranks on this host.
  int threads_per_rank(int cores) const override;
  // This process's host (MPI_Get_processor_name).
  const std::string& host() const { return host_; }

 private:
  MpiGroup() = default;
  std::unique_ptr<Communicator> make(void* comm, double timeout_s) const;
  int size_ = 1, rank_ = 0, local_size_ = 1;
  std::unique_ptr<Communicator> first_, startup_;
  double timeout_s_ = 60;
  std::string host_;
};

// Makes every wait of this process's MPI communicators fail now with `reason`, and every later
// collective too (the server's SIGTERM under a launcher that is stopping the job). Any thread.
void mpi_abandon(const std::string& reason);
// Whether a collective of this process failed or was abandoned: the group is broken and can
// only be aborted.
bool mpi_group_broken();
// The end of a process that initialised MPI: MPI_Finalize when the group is whole (every rank
// gets there), MPI_Abort when it is broken (the launcher then stops every rank). Returns
// exit_code; nothing is done when MPI was never initialised.
int mpi_finish(int exit_code);

}  // namespace kvrt::comm
