// Tensor parallelism on NVIDIA GPUs: NCCL moves the ranks' device buffers, over NVLink or PCIe
// within a host and over the network between hosts. An NcclGroup decorates the group that says
// where the ranks run (a ThreadGroup: every rank a thread of this process, one GPU each; or an
// MpiGroup: one rank per process) and keeps using that group's communicators for host buffers,
// so the engine's commands, statuses and logits travel as before.
//
// What differs from the threads' and MPI's communicators (core/comm/communicator.h):
// - Each call goes where its buffer lives (cudaPointerGetAttributes): device and managed memory
//   through NCCL on the given stream (nullptr: the legacy default stream), host memory, pinned
//   or not, through the inner communicator (broadcast_idle always). Every rank must pass the
//   same kind, or the ranks wait for each other in different transports.
// - Device collectives are stream-ordered: they return once queued on the caller's stream, and
//   the caller's next operation on that stream sees the result. Their CommStats seconds are
//   therefore the time to queue them, not to run them, unless the caller synchronises.
// - NCCL sums in its own order (rings, trees, NVLink switches), not in rank order: every rank
//   gets the same bits, but not the bits the threads or MPI would give. bf16 is summed as
//   bf16, each partial sum rounded as it passes between ranks (up to size - 1 roundings where
//   the others round once from an f32 sum): converting to f32 would need twice the buffer in
//   scratch and two conversion kernels per all-reduce, for an error of a few bf16 ulps of the
//   partial sums at TP <= 8.
// - Waits have no deadline: a rank that stops answering leaves the others' kernels waiting.
#pragma once

#include <memory>
#include <vector>

#include "core/comm/tp_group.h"
#include "core/util/status.h"

// nccl.h's ncclComm_t is a pointer to this: users of this header need no NCCL include.
struct ncclComm;

namespace kvrt::comm {

class NcclGroup : public TpGroup {
 public:
  // NCCL communicators for the local ranks of `inner`, which must outlive the group (it is not
  // owned: MpiGroup::world's group belongs to the process). Local rank local_ranks()[i] runs on
  // CUDA device devices[i]; by default rank r runs on device r % (the devices this process
  // sees), so TP-N threads take devices 0..N-1 and MPI ranks on a host of G GPUs take
  // rank % G (ranks numbered host by host).
  //
  // Collective over the whole group, like the communicators: every process calls it with its
  // inner group. Under MPI, rank 0 makes NCCL's unique id and it reaches the other ranks over
  // the inner group's communicator, together with each rank's readiness, so a rank that cannot
  // start is named on every rank instead of leaving them waiting. Fails (InvalidArgument,
  // Unsupported, Internal) when the devices list does not fit the local ranks, when there are
  // fewer CUDA devices than local ranks, when a process runs some but not all ranks of a
  // multi-process group, or when NCCL cannot initialise; messages name the rank, the device and
  // NCCL's reason. The caller's current CUDA device is left as it was. Main thread.
  static Result<std::unique_ptr<NcclGroup>> create(TpGroup& inner, std::vector<int> devices = {});
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const override { return size_; }
  std::vector<int> local_ranks() const override { return ranks_; }
  // Local rank `rank`'s communicator (nullptr for a rank this process does not run): device
  // buffers through NCCL, host buffers through the inner group's communicator for that rank.
  // All that one rank's communicators do must come from one thread at a time (they share its
  // NCCL communicator); the group outlives them.
  std::unique_ptr<Communicator> communicator(int rank) override;
  // The inner group's answer: the host-side work of each rank.
  int threads_per_rank(int cores) const override { return inner_.threads_per_rank(cores); }
  // The CUDA device of local rank `rank` (-1 for a rank this process does not run): the rank's
  // thread makes it current and keeps its buffers and streams there.
  int device(int rank) const;

 private:
  explicit NcclGroup(TpGroup& inner);
  // Each device's context, so that a GPU that cannot be used (taken in exclusive mode, lost) is
  // named before any rank waits in NCCL.
  Status open_devices();
  // The NCCL communicators, from the ncclUniqueId's bytes (nccl.h stays out of this header).
  Status init_comms(const void* unique_id);
  int index_of(int rank) const;

  TpGroup& inner_;
  int size_ = 0;
  std::vector<int> ranks_;        // local ranks, ascending
  std::vector<int> devices_;      // [local index] CUDA device
  std::vector<ncclComm*> comms_;  // [local index], destroyed with the group
  // [local index] the inner communicator used at start-up (multi-process), kept for the rank's
  // first communicator() so that an MpiGroup makes no second duplicate of its world.
  std::vector<std::unique_ptr<Communicator>> startup_;
  // [local index] set by a rank's communicator when a collective failed: the group then aborts
  // that NCCL communicator instead of waiting for its work to drain. Each element is written by
  // its rank's thread only.
  std::unique_ptr<bool[]> failed_;
};

}  // namespace kvrt::comm
