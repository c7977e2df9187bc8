#include "core/backend/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "kernels/cuda/ops.h"
#include "kernels/shared/rope.h"

namespace kvrt::backend {

// Shared by a backend and each of its allocations, so that one freed after the backend is gone
// still finds its count.
struct CudaMemoryLedger {
  int ordinal = 0;
  std::atomic<uint64_t> bytes{0};
  // Where frees are queued; null once the backend is gone (guarded by the registry's mutex).
  cudaStream_t stream = nullptr;
};

namespace {

// cuBLAS's recommended workspace on Hopper and later (4 MiB suffices before).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// The most the bf16 products' scratch (activation terms and their products) may hold: a prefill
// is taken in bands of rows that fit.
constexpr size_t kBf16ScratchBytes = size_t{64} << 20;
// bf16 weights are rounded on the device from f32 chunks of this many floats.
constexpr size_t kUploadChunkFloats = size_t{4} << 20;

// Buffer's release is a plain function pointer: a freed pointer finds its ledger and size here.
struct Allocation {
  std::shared_ptr<CudaMemoryLedger> ledger;
  size_t bytes = 0;
};
struct Registry {
  std::mutex mutex;
  std::unordered_map<void*, Allocation> allocations;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: buffers may go during static destruction
  return *r;
}

// Makes `ordinal` the calling thread's device for a scope, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == ordinal ||
        cudaSetDevice(ordinal) != cudaSuccess) {
      previous_ = -1;
    }
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// Queued on the owner's stream, the free waits for the ops before it that may still read the
// memory; without a stream the owner's destructor has already waited for them. Errors are
// dropped: this runs in destructors, and a failed free leaves nothing to retry.
void free_device(void* data) {
  if (data == nullptr) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.allocations.find(data);
  if (it == r.allocations.end()) return;
  const Allocation allocation = std::move(it->second);
  r.allocations.erase(it);
  allocation.ledger->bytes -= allocation.bytes;
  DeviceScope scope(allocation.ledger->ordinal);
  if (allocation.ledger->stream != nullptr) {
    cudaFreeAsync(data, allocation.ledger->stream);
  } else {
    cudaFree(data);
  }
}

void release_buffer(float* data, size_t) { free_device(data); }

struct DeviceFree {
  void operator()(void* data) const { free_device(data); }
};
using DeviceMemory = std::unique_ptr<void, DeviceFree>;

// A weight matrix in device memory, [rows][cols] f32 or bf16 bits.
struct CudaMatrix : Matrix {
  DeviceMemory data;
  bool bf16 = false;
};

// cuBLAS takes int sizes and leading dimensions.
int as_int(int64_t value, const char* what) {
  if (value < 0 || value > std::numeric_limits<int>::max()) {
    throw std::runtime_error(std::string("CUDA backend: matmul: ") + what + " " +
                             std::to_string(value) + " is out of cuBLAS's int range");
  }
  return static_cast<int>(value);
}

constexpr size_t aligned(size_t bytes) { return (bytes + 15) / 16 * 16; }

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int ordinal, bool bf16_weights) {
  const std::string name = "CUDA device " + std::to_string(ordinal);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return Status::NotFound(name + ": no usable CUDA device on this machine (" +
                            cudaGetErrorString(e) + ")");
  }
  if (ordinal < 0 || ordinal >= count) {
    return Status::NotFound(name + ": no such device (this machine has " + std::to_string(count) +
                            " CUDA device" + (count == 1 ? "" : "s") + ")");
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(ordinal, bf16_weights));
  const auto fail = [&](const std::string& what, const char* why) {
    return Status::Internal(name + ": " + what + ": " + why);
  };
  if (const cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    return fail("cannot be made current", cudaGetErrorString(e));
  }
  if (const cudaError_t e = cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return fail("cannot create a stream", cudaGetErrorString(e));
  }
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    backend->ledger_->stream = backend->stream_;
  }
  if (const cublasStatus_t s = cublasCreate(&backend->cublas_); s != CUBLAS_STATUS_SUCCESS) {
    backend->cublas_ = nullptr;
    return fail("cuBLAS cannot start", cublasGetStatusString(s));
  }
  // Setting the stream resets the workspace to cuBLAS's own pool, so the workspace comes after.
  // The default math mode keeps f32 products in f32 (no TF32).
  cublasStatus_t s = cublasSetStream(backend->cublas_, backend->stream_);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(backend->cublas_, CUBLAS_DEFAULT_MATH);
  if (s != CUBLAS_STATUS_SUCCESS)
    return fail("cuBLAS cannot be configured", cublasGetStatusString(s));
  try {
    void* workspace = backend->reserve(&backend->cublas_workspace_, kCublasWorkspaceBytes);
    s = cublasSetWorkspace(backend->cublas_, workspace, kCublasWorkspaceBytes);
  } catch (const std::bad_alloc&) {
    return Status::NoMemory(name + ": no room for cuBLAS's workspace");
  } catch (const std::runtime_error& e) {
    return Status::Internal(e.what());
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    return fail("cuBLAS refuses its workspace", cublasGetStatusString(s));
  }
  return backend;
}

CudaBackend::CudaBackend(int ordinal, bool bf16_weights)
    : ordinal_(ordinal),
      bf16_weights_(bf16_weights),
      ledger_(std::make_shared<CudaMemoryLedger>()) {
  ledger_->ordinal = ordinal;
}

CudaBackend::~CudaBackend() {
  DeviceScope scope(ordinal_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  for (Scratch* scratch : {&cublas_workspace_, &staging_, &slots_, &split_, &products_}) {
    free_device(scratch->data);
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    ledger_->stream = nullptr;
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaBackend::begin_step() { check(cudaSetDevice(ordinal_), "begin_step"); }

void CudaBackend::end_step() { check(cudaStreamSynchronize(stream_), "end_step"); }

uint64_t CudaBackend::device_bytes() const { return ledger_->bytes.load(); }

void CudaBackend::check(cudaError_t e, const char* op) const {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // a launch error is not sticky: the next op may still run
  if (e == cudaErrorMemoryAllocation) throw std::bad_alloc();
  throw std::runtime_error("CUDA device " + std::to_string(ordinal_) + ": " + op + ": " +
                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

void CudaBackend::check(cublasStatus_t s, const char* op) const {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  if (s == CUBLAS_STATUS_ALLOC_FAILED) throw std::bad_alloc();
  throw std::runtime_error("CUDA device " + std::to_string(ordinal_) + ": " + op +
                           ": cuBLAS: " + cublasGetStatusString(s));
}

// Stream-ordered allocations, so that a staging or scratch area can be replaced while ops
// queued before still read the old one.
void* CudaBackend::allocate_bytes(size_t bytes) {
  bytes = std::max(bytes, sizeof(float));
  void* data = nullptr;
  check(cudaMallocAsync(&data, bytes, stream_), "allocating device memory");
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().allocations[data] = {ledger_, bytes};
  }
  ledger_->bytes += bytes;
  return data;
}

void* CudaBackend::reserve(Scratch* scratch, size_t bytes) {
  if (scratch->bytes >= bytes) return scratch->data;
  const size_t grown = std::max(bytes, scratch->bytes + scratch->bytes / 2);
  void* data = allocate_bytes(grown);
  free_device(scratch->data);
  scratch->data = data;
  scratch->bytes = grown;
  return data;
}

// One staging area serves every op: each op's copy into it is queued on the stream after the
// kernels of the ops before, so it never overwrites what one of them still reads. The host
// side may be reused as soon as the copy returns, since a copy from pageable memory returns
// once it has taken the bytes.
template <class... T>
std::tuple<const T*...> CudaBackend::stage(std::span<const T>... host) {
  const size_t total = (aligned(host.size_bytes()) + ...);
  auto* device = static_cast<std::byte*>(reserve(&staging_, total));
  staging_host_.resize(total);
  size_t offset = 0;
  const auto place = [&]<class U>(std::span<const U> array) {
    if (!array.empty())
      std::memcpy(staging_host_.data() + offset, array.data(), array.size_bytes());
    const auto* at = reinterpret_cast<const U*>(device + offset);
    offset += aligned(array.size_bytes());
    return at;
  };
  // Braced initialisation places the arrays in order.
  std::tuple<const T*...> placed{place(host)...};
  if (total > 0) {
    check(cudaMemcpyAsync(device, staging_host_.data(), total, cudaMemcpyHostToDevice, stream_),
          "copying host arrays to the device");
  }
  return placed;
}

Buffer CudaBackend::allocate(size_t n) {
  DeviceScope scope(ordinal_);
  Buffer buffer(static_cast<float*>(allocate_bytes(n * sizeof(float))), n, release_buffer);
  check(cudaMemsetAsync(buffer.data(), 0, std::max<size_t>(n, 1) * sizeof(float), stream_),
        "allocate");
  return buffer;
}

Buffer CudaBackend::upload(std::span<const float> host) {
  DeviceScope scope(ordinal_);
  Buffer buffer(static_cast<float*>(allocate_bytes(host.size_bytes())), host.size(),
                release_buffer);
  if (!host.empty()) {
    check(cudaMemcpyAsync(buffer.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice,
                          stream_),
          "upload");
  }
  return buffer;
}

// bf16 weights are rounded on the device, chunk by chunk, so that the f32 matrix never sits
// whole in device memory; each chunk's copy waits in stream order for the previous rounding.
std::unique_ptr<Matrix> CudaBackend::upload_matrix(std::vector<float> data, int64_t rows,
                                                   int64_t cols) {
  DeviceScope scope(ordinal_);
  auto matrix = std::make_unique<CudaMatrix>();
  matrix->rows = rows;
  matrix->cols = cols;
  matrix->bf16 = bf16_weights_;
  const size_t n = data.size();
  if (!bf16_weights_) {
    matrix->data.reset(allocate_bytes(n * sizeof(float)));
    if (n > 0) {
      check(cudaMemcpyAsync(matrix->data.get(), data.data(), n * sizeof(float),
                            cudaMemcpyHostToDevice, stream_),
            "upload_matrix");
    }
    return matrix;
  }
  matrix->data.reset(allocate_bytes(n * sizeof(uint16_t)));
  if (n == 0) return matrix;
  const size_t chunk = std::min(n, kUploadChunkFloats);
  DeviceMemory floats(allocate_bytes(chunk * sizeof(float)));
  auto* bf16 = static_cast<uint16_t*>(matrix->data.get());
  for (size_t begin = 0; begin < n; begin += chunk) {
    const size_t count = std::min(chunk, n - begin);
    check(cudaMemcpyAsync(floats.get(), data.data() + begin, count * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          "upload_matrix");
    check(cuda::f32_to_bf16(static_cast<const float*>(floats.get()), bf16 + begin, count, stream_),
          "upload_matrix: rounding to bf16");
  }
  return matrix;
}

void CudaBackend::download(const float* device, size_t n, float* host) {
  if (n > 0) {
    check(cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "download");
  }
  check(cudaStreamSynchronize(stream_), "download");
}

const int64_t* CudaBackend::stage_slots(std::span<const int64_t> host) {
  auto* device =
      static_cast<int64_t*>(reserve(&slots_, std::max(host.size_bytes(), sizeof(int64_t))));
  if (!host.empty()) {
    check(cudaMemcpyAsync(device, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_),
          "stage_slots");
  }
  return device;
}

void CudaBackend::fill_zero(float* x, size_t n) {
  check(cuda::fill_zero(x, n, stream_), "fill_zero");
}

void CudaBackend::embed(const Buffer& table, int64_t first_row, std::span<const int32_t> ids,
                        int64_t width, float* out) {
  if (ids.empty() || width <= 0) return;
  const int64_t table_rows = static_cast<int64_t>(table.size()) / width;
  const auto [device_ids] = stage(ids);
  check(cuda::embed(table.data(), table_rows, first_row, device_ids,
                    static_cast<int64_t>(ids.size()), width, out, stream_),
        "embed");
}

void CudaBackend::gather_rows(const float* src, std::span<const int64_t> rows, int64_t width,
                              float* out) {
  if (rows.empty() || width <= 0) return;
  const auto [device_rows] = stage(rows);
  check(cuda::gather_rows(src, device_rows, static_cast<int64_t>(rows.size()), width, out, stream_),
        "gather_rows");
}

void CudaBackend::matmul(const float* x, int64_t m, const Matrix& w, float* y) {
  matmul_strided(x, m, w.cols, w, y, w.rows);
}

void CudaBackend::matmul_strided(const float* x, int64_t m, int64_t x_stride, const Matrix& w,
                                 float* y, int64_t y_stride) {
  if (m <= 0 || w.rows <= 0) return;
  // A single row's stride is never stepped over; cuBLAS still wants it at least a row wide.
  if (m == 1) {
    x_stride = w.cols;
    y_stride = w.rows;
  }
  if (w.cols == 0) {
    check(cudaMemset2DAsync(y, y_stride * sizeof(float), 0, w.rows * sizeof(float), m, stream_),
          "matmul");
    return;
  }
  if (static_cast<const CudaMatrix&>(w).bf16) {
    gemm_bf16(x, m, x_stride, w, y, y_stride);
  } else {
    gemm_f32(x, m, x_stride, w, y, y_stride);
  }
}

// Row-major y[m][n] = x[m][k] w[n][k]^T is, column-major, y^T = w^T x^T: w is op(A) transposed
// with lda = k, x is B untransposed with ldb = x_stride, y is C with ldc = y_stride.
void CudaBackend::gemm_f32(const float* x, int64_t m, int64_t x_stride, const Matrix& w, float* y,
                           int64_t y_stride) {
  const float one = 1.0f, zero = 0.0f;
  const auto& matrix = static_cast<const CudaMatrix&>(w);
  const int k = as_int(w.cols, "cols");
  check(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, as_int(w.rows, "rows"), as_int(m, "m"), k,
                    &one, static_cast<const float*>(matrix.data.get()), k, x,
                    as_int(x_stride, "x_stride"), &zero, y, as_int(y_stride, "y_stride")),
        "matmul");
}

// The CPU multiplies f32 activations by the bf16 weights widened to f32. Here each band of rows
// is split into three bf16 terms (ops.h: split_bf16x3) stacked as 3 * rows columns of one bf16
// product with f32 accumulation, which reads the weights once per band; the three partial
// products then sum to the f32 product to within f32 rounding. Plain bf16 activations would
// cost about 2^-9 relative per element against the CPU.
void CudaBackend::gemm_bf16(const float* x, int64_t m, int64_t x_stride, const Matrix& w, float* y,
                            int64_t y_stride) {
  const auto& matrix = static_cast<const CudaMatrix&>(w);
  const int64_t n = w.rows, k = w.cols;
  const size_t row_bytes =
      3 * (static_cast<size_t>(k) * sizeof(uint16_t) + static_cast<size_t>(n) * sizeof(float));
  const int64_t band = std::min<int64_t>(
      m, std::max<int64_t>(1, static_cast<int64_t>(kBf16ScratchBytes / row_bytes)));
  auto* split = static_cast<uint16_t*>(
      reserve(&split_, 3 * static_cast<size_t>(band * k) * sizeof(uint16_t)));
  auto* products =
      static_cast<float*>(reserve(&products_, 3 * static_cast<size_t>(band * n) * sizeof(float)));
  const float one = 1.0f, zero = 0.0f;
  for (int64_t first = 0; first < m; first += band) {
    const int64_t rows = std::min(band, m - first);
    check(cuda::split_bf16x3(x + first * x_stride, rows, k, x_stride, split, stream_),
          "matmul: splitting activations");
    check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, as_int(n, "rows"),
                       as_int(3 * rows, "3 * m"), as_int(k, "cols"), &one, matrix.data.get(),
                       CUDA_R_16BF, static_cast<int>(k), split, CUDA_R_16BF, static_cast<int>(k),
                       &zero, products, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT),
          "matmul");
    check(cuda::combine_bf16x3(products, rows, n, y + first * y_stride, y_stride, stream_),
          "matmul: summing the terms");
  }
}

void CudaBackend::copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                            int64_t rows, int64_t width) {
  check(cuda::copy_rows(src, src_stride, dst, dst_stride, rows, width, stream_), "copy_rows");
}

// The sources are grouped by destination row on the host (ordered by (row, i), so each group
// keeps the CPU's order), which lets a row that repeats be summed by one thread per column.
void CudaBackend::scatter_add_rows(const float* src, std::span<const int64_t> rows,
                                   std::span<const float> weights, int64_t width, float* dst) {
  if (rows.empty() || width <= 0) return;
  scatter_order_.resize(rows.size());
  std::iota(scatter_order_.begin(), scatter_order_.end(), int64_t{0});
  std::sort(scatter_order_.begin(), scatter_order_.end(),
            [&](int64_t a, int64_t b) { return rows[a] != rows[b] ? rows[a] < rows[b] : a < b; });
  scatter_begin_.clear();
  scatter_row_.clear();
  for (size_t p = 0; p < scatter_order_.size(); ++p) {
    const int64_t row = rows[scatter_order_[p]];
    if (p == 0 || row != scatter_row_.back()) {
      scatter_begin_.push_back(static_cast<int64_t>(p));
      scatter_row_.push_back(row);
    }
  }
  scatter_begin_.push_back(static_cast<int64_t>(scatter_order_.size()));
  const auto [order, begin, group_row, device_weights] =
      stage(std::span<const int64_t>(scatter_order_), std::span<const int64_t>(scatter_begin_),
            std::span<const int64_t>(scatter_row_), weights);
  const cuda::ScatterGroups groups{order, begin, group_row,
                                   static_cast<int64_t>(scatter_row_.size())};
  check(cuda::scatter_add_rows(src, device_weights, groups, width, dst, stream_),
        "scatter_add_rows");
}

void CudaBackend::add_bias(float* x, int64_t rows, int64_t row_stride, const Buffer& bias) {
  check(
      cuda::add_bias(x, rows, row_stride, bias.data(), static_cast<int64_t>(bias.size()), stream_),
      "add_bias");
}

void CudaBackend::add(float* x, const float* y, size_t n) {
  check(cuda::add(x, y, n, stream_), "add");
}

void CudaBackend::rms_norm(const float* x, const Buffer& weight, float* out, int64_t rows,
                           int64_t dim, float eps) {
  rms_norm_strided(x, dim, weight, out, dim, rows, dim, eps);
}

void CudaBackend::rms_norm_strided(const float* x, int64_t x_stride, const Buffer& weight,
                                   float* out, int64_t out_stride, int64_t rows, int64_t dim,
                                   float eps) {
  check(cuda::rms_norm(x, x_stride, weight.data(), out, out_stride, rows, dim, eps, stream_),
        "rms_norm");
}

void CudaBackend::silu_mul(const float* x, int64_t rows, int64_t n, float* out) {
  check(cuda::silu_mul(x, rows, n, out, stream_), "silu_mul");
}

void CudaBackend::rope_tables(std::span<const int32_t> positions, int64_t head_dim, float theta,
                              float* cos, float* sin) {
  inv_freq_.resize(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    inv_freq_[i] =
        kernels::shared::rope_inverse_frequency(static_cast<int64_t>(i), head_dim, theta);
  }
  rope_tables_from(positions, inv_freq_, 1.0f, cos, sin);
}

void CudaBackend::apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                             int64_t row_stride, const float* cos, const float* sin) {
  check(cuda::apply_rope(x, tokens, heads, head_dim, row_stride, cos, sin, stream_), "apply_rope");
}

void CudaBackend::rope_tables_from(std::span<const int32_t> positions,
                                   std::span<const float> inv_freq, float scale, float* cos,
                                   float* sin) {
  if (positions.empty() || inv_freq.empty()) return;
  const auto [device_positions, device_inv_freq] = stage(positions, inv_freq);
  check(cuda::rope_tables(device_positions, static_cast<int64_t>(positions.size()), device_inv_freq,
                          static_cast<int64_t>(inv_freq.size()), scale, cos, sin, stream_),
        "rope_tables");
}

void CudaBackend::apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                                         int64_t row_stride, const float* cos, const float* sin) {
  check(cuda::apply_rope_interleaved(x, tokens, heads, head_dim, row_stride, cos, sin, stream_),
        "apply_rope_interleaved");
}

}  // namespace kvrt::backend
