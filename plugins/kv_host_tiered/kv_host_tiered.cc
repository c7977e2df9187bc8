// kv_host_tiered: wraps an inner device store (named in its table) and adds a host RAM pool of
// pages keyed by chained page hashes. The device side is the inner store unchanged, so this
// adds no decode capacity; the host pool keeps prefixes the device evicts, for reuse.
//
// Policies (when a page reported through tier_save is copied to the host):
//   write_through            on INSERTED (and on HIT when the host lost it)
//   write_through_selective  once INSERTED + HIT reports for its hash reach
//                            write_through_threshold
//   write_back               on EVICTING
// Copies run on one copy thread, in call order; tickets complete in order. On a CUDA device the
// host pool is pinned and the copies are queued on a stream of the store's own, so they overlap
// the compute stream; consecutive pages move as one block per layer and part. The host pool
// evicts its least-recently-used page when full; pages with a copy in flight are pinned.
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvrt/plugin.hpp"
#include "plugins/common/device_pages.h"

namespace kvrt::plugins {
namespace {

enum class Policy { kWriteThrough, kWriteThroughSelective, kWriteBack };

struct TierOptions {
  std::string inner;
  double host_pool_gib = 0;
  double host_pool_ratio = 2.0;
  Policy policy = Policy::kWriteThrough;
  int64_t threshold = 2;

  explicit TierOptions(const sdk::ConfigView& config) {
    inner = config.string("inner", "kv_bf16_paged");
    host_pool_gib = config.real("host_pool_gib", 0.0);
    host_pool_ratio = config.real("host_pool_ratio", 2.0);
    threshold = config.integer("write_through_threshold", 2);
    const std::string p = config.string("policy", "write_through");
    if (p == "write_through") {
      policy = Policy::kWriteThrough;
    } else if (p == "write_through_selective") {
      policy = Policy::kWriteThroughSelective;
    } else if (p == "write_back") {
      policy = Policy::kWriteBack;
    } else {
      sdk::fail(KVRT_ERR_CONFIG,
                "policy: expected write_through, write_through_selective or "
                "write_back, found \"" +
                    p + "\"");
    }
    // Bounded so the page count below is a well-defined integer.
    if (!(host_pool_gib >= 0 && host_pool_gib <= 1 << 20)) {
      sdk::fail(KVRT_ERR_CONFIG, "host_pool_gib: expected a number in [0, 1048576], found " +
                                     std::to_string(host_pool_gib));
    }
    if (!(host_pool_ratio >= 0 && host_pool_ratio <= 1024)) {
      sdk::fail(KVRT_ERR_CONFIG, "host_pool_ratio: expected a number in [0, 1024], found " +
                                     std::to_string(host_pool_ratio));
    }
    if (threshold < 1) sdk::fail(KVRT_ERR_CONFIG, "write_through_threshold must be >= 1");
  }
};

// The inner store as opened through the host.
struct Inner {
  const kvrt_kv_store_api* api = nullptr;
  const kvrt_host_api* host = nullptr;
  const kvrt_config* config = nullptr;

  Inner(const kvrt_host_api* host_api, const std::string& name) {
    // On failure the host (or the inner store) has recorded why; that message is passed on.
    kvrt_status s = host_api->open_kv_store(host_api, name.c_str(), &api, &host, &config);
    if (s != KVRT_OK) throw sdk::Forwarded(s);
  }
  void check(kvrt_status s) const {
    if (s != KVRT_OK) throw sdk::Forwarded(s);
  }
};

class TieredStore : public sdk::StoreBase {
 public:
  TieredStore(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
              sdk::ConfigView config)
      : StoreBase(host, g, num_pages), options_(config), inner_(open_inner(host, options_)) {
    inner_.check(inner_.api->create(inner_.host, &g, num_pages, inner_.config, &store_));
    try {
      plan_segments();
      capacity_ = host_pages(options_, page_bytes_, num_pages);
      // On a GPU the pool is pinned, so its copies run asynchronously on the copy stream.
      pool_ = sdk::HostBuffer(host, device::on_cuda(g) ? KVRT_MEMORY_PINNED_HOST : KVRT_MEMORY_HOST,
                              capacity_ * page_bytes_, "the host tier");
      copy_stream_ = std::make_unique<device::CopyStream>(g);
      slots_.resize(capacity_);
      // Taken from the back: slots go out in ascending order, so a run of device pages saved
      // together lands in a run of slots and moves as one block (copy_runs).
      for (uint64_t i = capacity_; i-- > 0;) free_.push_back(i);
      copier_ = std::thread([this] { copy_loop(); });
    } catch (...) {
      inner_.api->destroy(store_);
      throw;
    }
  }

  ~TieredStore() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    if (copier_.joinable()) copier_.join();
    inner_.api->destroy(store_);
  }

  static uint64_t page_bytes(const kvrt_host_api* host, const kvrt_kv_geometry& g,
                             sdk::ConfigView config) {
    Inner inner = open_inner(host, TierOptions(config));
    uint64_t bytes = 0;
    inner.check(inner.api->page_bytes(inner.host, &g, inner.config, &bytes));
    return bytes;
  }

  // The tier's size: host_pool_gib when positive, else host_pool_ratio times the device pages.
  static uint64_t host_pages(const TierOptions& options, uint64_t page_bytes,
                             uint64_t device_pages) {
    return options.host_pool_gib > 0
               ? static_cast<uint64_t>(options.host_pool_gib * (1ull << 30)) / page_bytes
               : static_cast<uint64_t>(options.host_pool_ratio * static_cast<double>(device_pages));
  }
  static uint64_t tier_pages(const kvrt_host_api* host, const kvrt_kv_geometry& g,
                             sdk::ConfigView config, uint64_t device_pages) {
    return host_pages(TierOptions(config), page_bytes(host, g, config), device_pages);
  }

  // The inner store, refusing this very plugin (also when named by path): it would recurse.
  static Inner open_inner(const kvrt_host_api* host, const TierOptions& options) {
    Inner inner(host, options.inner);
    if (inner.api->create == sdk::kv_store_table<TieredStore>().create) {
      sdk::fail(KVRT_ERR_CONFIG, "inner: '" + options.inner + "' is kv_host_tiered itself");
    }
    return inner;
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info = inner_info();
    info.host_tier_pages = capacity_;  // device tokens stay the inner store's
    return info;
  }

  kvrt_kv_layout layout(uint32_t layer) const {
    kvrt_kv_layout l{};
    l.struct_size = sizeof(l);
    inner_.check(inner_.api->layout(store_, layer, &l));
    return l;
  }

  // (ABI 1.3) The inner store's format: the device pages are its. None (UNSUPPORTED) when the
  // inner store gives none.
  kvrt_kv_format format(uint32_t layer) const {
    const kvrt_kv_store_api_1_3* t = kvrt_kv_store_api_1_3_of(inner_.api);
    if (t == nullptr || t->format == nullptr) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, "the inner store gives no format");
    }
    kvrt_kv_format f{};
    f.struct_size = sizeof(f);
    inner_.check(t->format(store_, layer, &f));
    return f;
  }

  void write(const kvrt_kv_write* w) { inner_.check(inner_.api->write(store_, w)); }

  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    if (inner_.api->gather == nullptr) sdk::fail(KVRT_ERR_UNSUPPORTED, "inner store has no gather");
    inner_.check(inner_.api->gather(store_, layer, n, slots, k, v));
  }

  // ---- tier ----

  kvrt_tier_info tier_info() const {
    std::lock_guard lock(mutex_);
    kvrt_tier_info info = stats_;
    info.struct_size = sizeof(info);
    info.capacity_pages = capacity_;
    info.used_pages = capacity_ - free_.size();
    return info;
  }

  uint32_t tier_lookup(uint32_t n, const uint64_t* hashes) {
    std::lock_guard lock(mutex_);
    uint32_t hits = 0;
    for (; hits < n; ++hits) {
      auto it = index_.find(hashes[hits]);
      if (it == index_.end()) break;
      touch(it->second);
    }
    return hits;
  }

  uint64_t tier_save(uint32_t n, const uint64_t* hashes, const int64_t* pages,
                     kvrt_tier_reason reason) {
    std::unique_lock lock(mutex_);
    Job job;
    job.copies.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      if (!should_copy(hashes[i], reason)) continue;
      if (auto it = index_.find(hashes[i]); it != index_.end()) {
        touch(it->second);
        continue;
      }
      uint64_t slot = 0;
      if (!take_slot(&slot)) continue;  // every host page is pinned by a copy: best effort
      slots_[slot].hash = hashes[i];
      index_[hashes[i]] = slot;
      queue_copy(&job, slot, pages[i], true);
      ++stats_.saved_pages;
    }
    return submit(std::move(job));
  }

  uint64_t tier_load(uint32_t n, const uint64_t* hashes, const int64_t* pages, uint8_t* loaded) {
    std::unique_lock lock(mutex_);
    Job job;
    job.copies.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      auto it = index_.find(hashes[i]);
      loaded[i] = it != index_.end();
      if (!loaded[i]) continue;
      touch(it->second);
      queue_copy(&job, it->second, pages[i], false);
      ++stats_.loaded_pages;
    }
    return submit(std::move(job));
  }

  void tier_wait(uint64_t ticket) {
    std::unique_lock lock(mutex_);
    if (ticket > issued_) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "ticket " + std::to_string(ticket) +
                                               " was never issued (last is " +
                                               std::to_string(issued_) + ")");
    }
    done_.wait(lock, [&] { return completed_ >= ticket; });
    // Report (once) the failures of this ticket and of earlier ones nobody waited for.
    auto end = failures_.upper_bound(ticket);
    if (failures_.begin() != end) {
      std::string message = failures_.begin()->second;
      const size_t count = static_cast<size_t>(std::distance(failures_.begin(), end));
      failures_.erase(failures_.begin(), end);
      if (count > 1) message += " (and " + std::to_string(count - 1) + " more failed calls)";
      sdk::fail(KVRT_ERR_INTERNAL, message);
    }
  }

 private:
  // One contiguous run of a device page's bytes in one layer (K, V or their scales).
  struct Segment {
    uint8_t* base;
    int64_t page_stride;
    uint64_t bytes;
  };
  struct Copy {
    uint64_t slot;
    int64_t device_page;
    bool to_host;
  };
  struct Job {
    uint64_t ticket = 0;
    std::vector<Copy> copies;
  };
  struct HostSlot {
    uint64_t hash = 0;
    uint32_t pins = 0;      // copies in flight; a pinned page is never evicted
    bool filled = false;    // its save copy completed: its bytes are the page's
    bool orphaned = false;  // its save failed: freed once unpinned
    std::list<uint64_t>::iterator lru;
    bool in_lru = false;
  };

  kvrt_kv_info inner_info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    inner_.check(inner_.api->info(store_, &info));
    return info;
  }

  // A device page is, per layer, its K block, V block and scale blocks; a host page is their
  // concatenation, exactly page_bytes long.
  void plan_segments() {
    const kvrt_kv_geometry& g = geometry();
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      kvrt_kv_layout l = layout(layer);
      segments_.push_back({static_cast<uint8_t*>(l.k_base), l.k_page_stride,
                           static_cast<uint64_t>(l.k_page_stride)});
      if (l.v_base != l.k_base) {
        segments_.push_back({static_cast<uint8_t*>(l.v_base), l.v_page_stride,
                             static_cast<uint64_t>(l.v_page_stride)});
      }
      if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
        segments_.push_back({reinterpret_cast<uint8_t*>(l.k_scale), l.scale_page_stride,
                             static_cast<uint64_t>(l.scale_page_stride)});
        if (l.v_scale != l.k_scale) {
          segments_.push_back({reinterpret_cast<uint8_t*>(l.v_scale), l.scale_page_stride,
                               static_cast<uint64_t>(l.scale_page_stride)});
        }
      }
    }
    page_bytes_ = 0;
    for (const Segment& s : segments_) page_bytes_ += s.bytes;
    const uint64_t expected = inner_info().bytes_per_page;
    if (page_bytes_ != expected) {
      sdk::fail(KVRT_ERR_UNSUPPORTED,
                "inner store '" + options_.inner + "' has a layout whose page blocks (" +
                    std::to_string(page_bytes_) + " bytes) are not its page size (" +
                    std::to_string(expected) + " bytes); it cannot be tiered");
    }
  }

  bool should_copy(uint64_t hash, kvrt_tier_reason reason) {
    switch (options_.policy) {
      case Policy::kWriteThrough:
        return reason != KVRT_TIER_EVICTING;
      case Policy::kWriteBack:
        return reason == KVRT_TIER_EVICTING;
      case Policy::kWriteThroughSelective: {
        if (reason == KVRT_TIER_EVICTING) return false;
        // Bounded: a flood of one-off pages resets the counts rather than growing forever.
        if (hit_counts_.size() > 4 * capacity_ + 1024) hit_counts_.clear();
        return ++hit_counts_[hash] >= options_.threshold;
      }
    }
    return false;
  }

  void touch(uint64_t slot) {
    HostSlot& s = slots_[slot];
    if (s.in_lru) lru_.erase(s.lru);
    s.lru = lru_.insert(lru_.end(), slot);
    s.in_lru = true;
  }

  void queue_copy(Job* job, uint64_t slot, int64_t device_page, bool to_host) {
    ++slots_[slot].pins;  // released by the copy thread once this copy is done
    job->copies.push_back({slot, device_page, to_host});
  }

  // A free host page, evicting the least recently used unpinned one if needed.
  bool take_slot(uint64_t* out) {
    if (!free_.empty()) {
      *out = free_.back();
      free_.pop_back();
    } else {
      auto victim = lru_.begin();
      while (victim != lru_.end() && slots_[*victim].pins > 0) ++victim;
      if (victim == lru_.end()) return false;
      *out = *victim;
      HostSlot& s = slots_[*out];
      index_.erase(s.hash);
      lru_.erase(victim);
      s.in_lru = false;
      ++stats_.evicted_pages;
    }
    slots_[*out].filled = false;
    touch(*out);
    return true;
  }

  // Forgets a slot whose save failed; it returns to the free list once no copy pins it.
  void drop_slot(uint64_t slot) {
    HostSlot& s = slots_[slot];
    if (auto it = index_.find(s.hash); it != index_.end() && it->second == slot) index_.erase(it);
    if (s.in_lru) lru_.erase(s.lru);
    s.in_lru = false;
    s.filled = false;
    s.orphaned = true;
  }

  // Queues the call's copies; returns its ticket. A call with nothing to copy still gets one,
  // so waiting on it also waits for everything queued before.
  uint64_t submit(Job job) {
    job.ticket = ++issued_;
    jobs_.push_back(std::move(job));
    work_ready_.notify_one();
    return issued_;
  }

  void copy_loop() {
    copy_stream_->bind_thread();
    std::unique_lock lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and everything queued is done
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      // A load can only copy a page whose save completed (jobs run in order, so it has run).
      std::vector<char> done(job.copies.size(), 0);
      for (size_t i = 0; i < job.copies.size(); ++i) {
        done[i] = job.copies[i].to_host || slots_[job.copies[i].slot].filled;
      }
      lock.unlock();
      copy_runs(job.copies, &done);
      lock.lock();
      std::string error;
      for (size_t i = 0; i < job.copies.size(); ++i) {
        const Copy& c = job.copies[i];
        HostSlot& slot = slots_[c.slot];
        --slot.pins;
        if (c.to_host && done[i]) {
          slot.filled = true;
        } else if (c.to_host) {
          error = "saving device page " + std::to_string(c.device_page) + " to the host failed";
          drop_slot(c.slot);
        } else if (!done[i]) {
          error = "loading into device page " + std::to_string(c.device_page) + " failed";
        }
        if (slot.orphaned && slot.pins == 0) {
          slot.orphaned = false;
          free_.push_back(c.slot);
        }
      }
      if (!error.empty()) failures_[job.ticket] = error;
      completed_ = job.ticket;
      done_.notify_all();
    }
  }

  // The job's copies, in runs: consecutive copies of one direction between consecutive device
  // pages and consecutive host slots move as one block per segment (the host pool keeps each
  // segment's slots side by side, as the device keeps its pages), so a save or load of many
  // pages is a few large transfers rather than a small one per page, layer and part. All are
  // queued on the copy stream, then waited for once (on the CPU each is done when it returns).
  // done[i] comes in true for the copies to make and goes out true for those made.
  void copy_runs(const std::vector<Copy>& copies, std::vector<char>* done) {
    const kvrt_host_api* h = host();
    const kvrt_memory_kind host_kind =
        device::on_cuda(geometry()) ? KVRT_MEMORY_PINNED_HOST : KVRT_MEMORY_HOST;
    const bool async = h->abi_minor >= 1 && h->copy_async != nullptr;  // 1.0: synchronous
    void* stream = copy_stream_->get();
    std::vector<size_t> queued;
    for (size_t i = 0; i < copies.size();) {
      if (!(*done)[i]) {
        ++i;
        continue;
      }
      const Copy& first = copies[i];
      size_t n = 1;
      while (i + n < copies.size() && (*done)[i + n] && copies[i + n].to_host == first.to_host &&
             copies[i + n].slot == first.slot + n &&
             copies[i + n].device_page == first.device_page + static_cast<int64_t>(n)) {
        ++n;
      }
      bool ok = true;
      uint64_t region = 0;  // the segment's place in the host pool
      for (const Segment& seg : segments_) {
        uint8_t* device = seg.base + first.device_page * seg.page_stride;
        uint8_t* pool = pool_.data() + region + first.slot * seg.bytes;
        region += capacity_ * seg.bytes;
        void* dst = first.to_host ? static_cast<void*>(pool) : device;
        const void* src = first.to_host ? static_cast<const void*>(device) : pool;
        const kvrt_memory_kind dst_kind = first.to_host ? host_kind : KVRT_MEMORY_DEVICE;
        const kvrt_memory_kind src_kind = first.to_host ? KVRT_MEMORY_DEVICE : host_kind;
        const uint64_t bytes = n * seg.bytes;
        const kvrt_status st = async ? h->copy_async(h, dst, dst_kind, src, src_kind, bytes, stream)
                                     : h->copy(h, dst, dst_kind, src, src_kind, bytes);
        if (st != KVRT_OK) {
          ok = false;
          break;
        }
      }
      for (size_t k = i; k < i + n; ++k) {
        (*done)[k] = ok;
        if (ok) queued.push_back(k);
      }
      i += n;
    }
    if (!copy_stream_->wait()) {
      for (size_t k : queued) (*done)[k] = 0;
    }
  }

  TierOptions options_;
  Inner inner_;
  kvrt_kv_store* store_ = nullptr;
  std::vector<Segment> segments_;
  uint64_t page_bytes_ = 0;
  uint64_t capacity_ = 0;
  sdk::HostBuffer pool_;
  std::unique_ptr<device::CopyStream> copy_stream_;

  mutable std::mutex mutex_;  // guards everything below
  std::vector<HostSlot> slots_;
  std::vector<uint64_t> free_;
  std::list<uint64_t> lru_;  // front = least recently used
  std::unordered_map<uint64_t, uint64_t> index_;
  std::unordered_map<uint64_t, int64_t> hit_counts_;
  std::deque<Job> jobs_;
  uint64_t issued_ = 0, completed_ = 0;
  std::map<uint64_t, std::string> failures_;  // by ticket, until a tier_wait reports them
  bool stopping_ = false;
  kvrt_tier_info stats_{};
  std::condition_variable work_ready_, done_;
  std::thread copier_;
};

const kvrt_option_desc kOptions[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_STRING, "inner", "kv_bf16_paged",
     "the device store to wrap (its own table is [kv.<inner>])"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_FLOAT, "host_pool_gib", "0",
     "host pool size in GiB; 0 = use host_pool_ratio"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_FLOAT, "host_pool_ratio", "2.0",
     "host pool size as a multiple of the device pool's pages"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_STRING, "policy", "write_through",
     "write_through | write_through_selective | write_back"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_INT, "write_through_threshold", "2",
     "write_through_selective: reports (insert + hits) before a page is copied"},
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_KV_STORE,
      "kv_host_tiered",
      "0.1.0",
      "an inner device store plus a host RAM tier of prefix pages (adds no decode capacity)",
      &sdk::kv_store_table<TieredStore>(),
      kOptions,
      5,
      KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16),
      nullptr};
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
