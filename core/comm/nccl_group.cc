#include "core/comm/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kernels/cuda/pointer.h"

namespace kvrt::comm {
namespace {

std::string where(int rank, int device) {
  return "TP rank " + std::to_string(rank) + " (CUDA device " + std::to_string(device) + ")";
}

// NCCL's name for the error, and its last message when it left one (which says what failed).
std::string nccl_error(ncclResult_t e, ncclComm_t comm) {
  std::string text = ncclGetErrorString(e);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') text += std::string(": ") + detail;
  return text;
}

ncclDataType_t nccl_type(ElementType type) {
  switch (type) {
    case ElementType::kF32:
      return ncclFloat32;
    case ElementType::kBF16:
      return ncclBfloat16;
    case ElementType::kU8:
      return ncclUint8;
  }
  return ncclUint8;
}

// The record each rank contributes at a multi-process start: its readiness, then (rank 0's)
// NCCL unique id.
constexpr size_t kStatusBytes = 256;
constexpr size_t kRecordBytes = kStatusBytes + sizeof(ncclUniqueId);

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device,
                   std::unique_ptr<Communicator> host, bool* failed)
      : comm_(comm),
        rank_(rank),
        size_(size),
        device_(device),
        host_(std::move(host)),
        failed_(failed) {}

  const char* backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status all_reduce_sum(void* data, size_t n, ElementType type, Stream stream) override {
    if (!cuda::is_device_memory(data)) {
      return forward([&] { return host_->all_reduce_sum(data, n, type, stream); });
    }
    if (type == ElementType::kU8) {
      return Status::InvalidArgument("all_reduce_sum: bytes cannot be summed");
    }
    if (size_ == 1) return Status::Ok();
    if (Status s = usable("all_reduce_sum"); !s.ok()) return s;
    const auto start = std::chrono::steady_clock::now();
    if (Status s = check("all_reduce_sum", ncclAllReduce(data, data, n, nccl_type(type), ncclSum,
                                                         comm_, cuda_stream(stream)));
        !s.ok()) {
      return s;
    }
    count(all_reduce_bytes_sent(n, type, size_, rank_), start);
    return Status::Ok();
  }

  Status all_gather(const void* in, std::span<const size_t> counts, void* out, ElementType type,
                    Stream stream) override {
    if (counts.size() != static_cast<size_t>(size_)) {
      return Status::InvalidArgument("all_gather: " + std::to_string(counts.size()) +
                                     " counts for " + std::to_string(size_) + " ranks");
    }
    // `in` may be null (nothing to give): where `out` lives decides.
    const bool device = cuda::is_device_memory(out);
    if (counts[rank_] > 0 && cuda::is_device_memory(in) != device) {
      return Status::InvalidArgument("all_gather on " + where(rank_, device_) +
                                     ": the input and output are not both device memory");
    }
    if (!device) {
      return forward([&] { return host_->all_gather(in, counts, out, type, stream); });
    }
    if (Status s = usable("all_gather"); !s.ok()) return s;
    const auto start = std::chrono::steady_clock::now();
    const ncclDataType_t nccl = nccl_type(type);
    const cudaStream_t cuda = cuda_stream(stream);
    const size_t bytes = element_bytes(type);
    ncclResult_t e = ncclSuccess;
    if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; })) {
      e = ncclAllGather(in, out, counts[0], nccl, comm_, cuda);
    } else {
      // Unequal parts: one broadcast per rank into its place, fused into one launch. Every rank
      // skips the same empty parts, since every rank has the same counts.
      e = ncclGroupStart();
      size_t offset = 0;
      for (int r = 0; r < size_ && e == ncclSuccess; ++r) {
        char* part = static_cast<char*>(out) + offset * bytes;
        if (counts[r] > 0) {
          e = ncclBroadcast(r == rank_ ? in : part, part, counts[r], nccl, r, comm_, cuda);
        }
        offset += counts[r];
      }
      // The group must be closed even after a failed call, or this thread's later NCCL calls
      // would all join it.
      const ncclResult_t end = ncclGroupEnd();
      if (e == ncclSuccess) e = end;
    }
    if (Status s = check("all_gather", e); !s.ok()) return s;
    count(all_gather_bytes_sent(counts, type, rank_), start);
    return Status::Ok();
  }

  Status broadcast(void* data, size_t n, ElementType type, int root, Stream stream) override {
    if (!cuda::is_device_memory(data)) {
      return forward([&] { return host_->broadcast(data, n, type, root, stream); });
    }
    if (size_ == 1) return Status::Ok();
    if (root < 0 || root >= size_) {
      return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " of " +
                                     std::to_string(size_) + " ranks");
    }
    if (Status s = usable("broadcast"); !s.ok()) return s;
    const auto start = std::chrono::steady_clock::now();
    if (Status s = check("broadcast", ncclBroadcast(data, data, n, nccl_type(type), root, comm_,
                                                    cuda_stream(stream)));
        !s.ok()) {
      return s;
    }
    count(broadcast_bytes_sent(n, type, size_, rank_, root), start);
    return Status::Ok();
  }

  // The engine's wait for commands: always a host buffer, so always the inner communicator's,
  // with its (absent) deadline.
  Status broadcast_idle(void* data, size_t n, ElementType type, int root) override {
    return forward([&] { return host_->broadcast_idle(data, n, type, root); });
  }

 private:
  static cudaStream_t cuda_stream(Stream stream) { return static_cast<cudaStream_t>(stream); }

  // A host collective, done by the inner communicator and counted here as it counted it.
  template <class Call>
  Status forward(Call call) {
    const CommStats before = host_->stats();
    Status s = call();
    const CommStats& after = host_->stats();
    stats_.collectives += after.collectives - before.collectives;
    stats_.bytes_sent += after.bytes_sent - before.bytes_sent;
    stats_.seconds += after.seconds - before.seconds;
    return s;
  }

  // An error an earlier collective left behind (a peer that failed, a link that broke): NCCL
  // reports it here rather than in the call that met it, since kernels run after calls return.
  Status usable(const char* what) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t e = ncclCommGetAsyncError(comm_, &async);
    return check(what, e != ncclSuccess ? e : async);
  }

  Status check(const char* what, ncclResult_t e) {
    if (e == ncclSuccess) return Status::Ok();
    *failed_ = true;
    return Status::Internal(std::string("NCCL ") + what + " on " + where(rank_, device_) + ": " +
                            nccl_error(e, comm_));
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::unique_ptr<Communicator> host_;
  bool* failed_;
};

}  // namespace

NcclGroup::NcclGroup(TpGroup& inner) : inner_(inner) {}

NcclGroup::~NcclGroup() {
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (comms_[i] == nullptr) continue;
    // Destroy waits for the communicator's queued work, which a failed group may never finish.
    if (failed_[i]) {
      (void)ncclCommAbort(comms_[i]);
    } else {
      (void)ncclCommDestroy(comms_[i]);
    }
  }
}

int NcclGroup::index_of(int rank) const {
  const auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  return it == ranks_.end() ? -1 : static_cast<int>(it - ranks_.begin());
}

int NcclGroup::device(int rank) const {
  const int i = index_of(rank);
  return i < 0 ? -1 : devices_[i];
}

Result<std::unique_ptr<NcclGroup>> NcclGroup::create(TpGroup& inner, std::vector<int> devices) {
  std::unique_ptr<NcclGroup> group(new NcclGroup(inner));
  group->size_ = inner.size();
  group->ranks_ = inner.local_ranks();
  const std::vector<int>& ranks = group->ranks_;
  const int local = static_cast<int>(ranks.size());
  const bool multi_process = local < group->size_;
  // A process with some ranks of several would need its ranks' threads to exchange the id at
  // once; no TpGroup runs ranks that way.
  if (multi_process && local != 1) {
    return Status::Unsupported("NCCL group: this process runs " + std::to_string(local) + " of " +
                               std::to_string(group->size_) +
                               " TP ranks; it must run all of them or one");
  }
  if (!devices.empty()) {
    if (devices.size() != ranks.size()) {
      return Status::InvalidArgument("NCCL group: " + std::to_string(devices.size()) +
                                     " CUDA devices listed for " + std::to_string(local) +
                                     " local TP ranks");
    }
    for (size_t i = 0; i < devices.size(); ++i) {
      if (std::find(devices.begin(), devices.begin() + i, devices[i]) != devices.begin() + i) {
        return Status::InvalidArgument("NCCL group: CUDA device " + std::to_string(devices[i]) +
                                       " is listed for two TP ranks (NCCL needs one GPU each)");
      }
    }
  }

  // This process's readiness; under MPI every rank hears it before anyone waits in NCCL.
  Status ready;
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) count = 0;
  if (count < local) {
    std::string why = "NCCL group: " + std::to_string(local) + " local TP ranks need " +
                      std::to_string(local) + " CUDA devices, this process sees " +
                      std::to_string(count);
    if (counted != cudaSuccess) why += std::string(" (") + cudaGetErrorString(counted) + ")";
    ready = Status::Unsupported(why);
  } else if (devices.empty()) {
    for (int r : ranks) devices.push_back(r % count);
  } else {
    for (size_t i = 0; i < devices.size() && ready.ok(); ++i) {
      if (devices[i] < 0 || devices[i] >= count) {
        ready = Status::InvalidArgument("NCCL group: CUDA device " + std::to_string(devices[i]) +
                                        " for TP rank " + std::to_string(ranks[i]) +
                                        ", this process sees " + std::to_string(count));
      }
    }
  }
  group->devices_ = devices;
  if (ready.ok()) ready = group->open_devices();
  ncclUniqueId id{};
  if (ready.ok() && ranks.front() == 0) {
    if (const ncclResult_t e = ncclGetUniqueId(&id); e != ncclSuccess) {
      ready = Status::Internal("NCCL group: " + where(0, devices.front()) +
                               " could not make NCCL's unique id: " + nccl_error(e, nullptr));
    }
  }

  if (multi_process) {
    std::unique_ptr<Communicator> comm = inner.communicator(ranks.front());
    std::vector<uint8_t> mine(kRecordBytes, 0), all(kRecordBytes * group->size_, 0);
    status_to_record(ready, std::span<uint8_t>(mine.data(), kStatusBytes));
    std::memcpy(mine.data() + kStatusBytes, &id, sizeof(id));
    const std::vector<size_t> counts(group->size_, kRecordBytes);
    if (Status s = comm->all_gather(mine.data(), counts, all.data(), ElementType::kU8, nullptr);
        !s.ok()) {
      return s.WithContext("NCCL group: exchanging NCCL's unique id");
    }
    for (int r = 0; r < group->size_ && ready.ok(); ++r) {
      if (r == ranks.front()) continue;
      const Status theirs =
          status_from_record(std::span<const uint8_t>(all.data() + r * kRecordBytes, kStatusBytes));
      if (!theirs.ok()) {
        ready = theirs.WithContext("TP rank " + std::to_string(r) + " cannot start");
      }
    }
    std::memcpy(&id, all.data() + kStatusBytes, sizeof(id));  // rank 0's
    group->startup_.push_back(std::move(comm));
  }
  if (!ready.ok()) return ready;
  if (Status s = group->init_comms(&id); !s.ok()) return s;
  return group;
}

Status NcclGroup::open_devices() {
  int caller_device = 0;
  (void)cudaGetDevice(&caller_device);
  Status status;
  for (size_t i = 0; i < ranks_.size() && status.ok(); ++i) {
    cudaError_t e = cudaSetDevice(devices_[i]);
    if (e == cudaSuccess) e = cudaFree(nullptr);  // makes the device's context
    if (e != cudaSuccess) {
      status = Status::Internal("NCCL group: " + where(ranks_[i], devices_[i]) +
                                " cannot be used: " + cudaGetErrorString(e));
    }
  }
  (void)cudaSetDevice(caller_device);
  return status;
}

Status NcclGroup::init_comms(const void* unique_id) {
  ncclUniqueId id;
  std::memcpy(&id, unique_id, sizeof(id));
  const size_t local = ranks_.size();
  failed_ = std::make_unique<bool[]>(local);  // all false
  startup_.resize(local);
  comms_.assign(local, nullptr);
  int caller_device = 0;
  (void)cudaGetDevice(&caller_device);
  // ncclCommInitRank waits until every rank has joined: one thread starting several ranks
  // groups their starts, else the first would wait for the others forever.
  ncclResult_t e = ncclGroupStart();
  cudaError_t set = cudaSuccess;
  for (size_t i = 0; i < local && e == ncclSuccess; ++i) {
    if (const cudaError_t s = cudaSetDevice(devices_[i]); s != cudaSuccess && set == cudaSuccess) {
      set = s;
    }
    e = ncclCommInitRank(&comms_[i], size_, id, ranks_[i]);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (e == ncclSuccess) e = end;
  (void)cudaSetDevice(caller_device);
  if (e == ncclSuccess && set == cudaSuccess) return Status::Ok();
  std::string on = local == 1 ? where(ranks_[0], devices_[0]) : "local TP ranks";
  if (local > 1) {
    for (size_t i = 0; i < local; ++i) {
      on += (i == 0 ? " " : ", ") + std::to_string(ranks_[i]) + " (CUDA device " +
            std::to_string(devices_[i]) + ")";
    }
  }
  const std::string why =
      e != ncclSuccess ? nccl_error(e, nullptr) : std::string(cudaGetErrorString(set));
  for (size_t i = 0; i < local; ++i) failed_[i] = true;  // the destructor aborts what was made
  return Status::Internal("NCCL group: NCCL could not initialise " + on + ": " + why);
}

std::unique_ptr<Communicator> NcclGroup::communicator(int rank) {
  const int i = index_of(rank);
  if (i < 0) return nullptr;
  std::unique_ptr<Communicator> host =
      startup_[i] != nullptr ? std::move(startup_[i]) : inner_.communicator(rank);
  return std::make_unique<NcclCommunicator>(comms_[i], rank, size_, devices_[i], std::move(host),
                                            &failed_[i]);
}

}  // namespace kvrt::comm
