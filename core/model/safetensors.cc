#include "core/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "core/util/file.h"
#include "kernels/cpu/convert.h"

// safetensors data is little-endian and to_f32 reads it in place.
static_assert(std::endian::native == std::endian::little, "big-endian hosts need byte swapping");

namespace kvrt::model {

using nlohmann::json;

// Mapped, not read: any size the machine can map; its header has the format's own limit.
constexpr util::FileKind kSafetensorsFile{"safetensors file", 0};

namespace detail {

class MappedFile {
 public:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  ~MappedFile() { munmap(const_cast<uint8_t*>(data_), size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path) {
    // A FIFO would block open() and a device cannot be mapped: only regular files.
    if (Result<uint64_t> size = util::regular_file_size(path, kSafetensorsFile); !size.ok()) {
      return size.status();
    }
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      std::string why = std::strerror(errno);
      ::close(fd);
      return Status::Internal(path + ": cannot stat: " + why);
    }
    const size_t size = static_cast<size_t>(st.st_size);
    // Too short for the length prefix: refuse before mmap, which rejects length 0 anyway.
    if (size < 8) {
      ::close(fd);
      return Status::InvalidArgument(path + ": not a safetensors file: " + std::to_string(size) +
                                     " bytes, shorter than the 8-byte header length");
    }
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    std::string why = p == MAP_FAILED ? std::strerror(errno) : "";
    ::close(fd);  // the mapping keeps the file referenced
    if (p == MAP_FAILED) return Status::NoMemory(path + ": cannot mmap: " + why);
    return std::make_shared<const MappedFile>(path, static_cast<const uint8_t*>(p), size);
  }

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace detail

namespace {

// Bytes per element of every safetensors dtype, so that byte ranges are checked even for tensors
// this loader cannot convert; 0 for a name it does not know (then only the range is checked).
size_t ElementSize(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

std::optional<DType> ParseDType(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  if (s == "I32") return DType::kI32;
  return std::nullopt;
}

// A non-negative integer that fits size_t, or nullopt.
std::optional<uint64_t> Unsigned(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return std::nullopt;
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// The safetensors format's own bound on the JSON header (its reference implementation refuses
// larger ones).
constexpr uint64_t kMaxHeaderBytes = 100 * util::kMiB;

// A shard name from an index: a relative path inside the model directory, never one that
// climbs out of it ("../../etc/passwd") or starts elsewhere ("/etc/passwd"). Symbolic links
// inside the directory are followed as usual (the Hugging Face cache links shards to blobs).
std::string shard_name_problem(const std::string& name) {
  namespace fs = std::filesystem;
  if (name.empty()) return "an empty file name";
  if (name.find('\0') != std::string::npos) return "a file name with a NUL byte";
  const fs::path p(name);
  if (p.is_absolute()) return "an absolute path, outside the model directory";
  for (const fs::path& part : p) {
    if (part == "..") return "a path that leaves the model directory ('..')";
  }
  return "";
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI32:
      return "I32";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kI32 ? 4 : dtype == DType::kF8E4M3 ? 1 : 2;
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    // inf (mant == 0) or NaN: the f32 exponent is all ones too; the payload moves up 13 bits,
    // which keeps the quiet bit in place (top mantissa bit).
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    // Zero or subnormal, mant * 2^-24: mant < 2^10 converts exactly and scaling by a power of two
    // is exact (the result, >= 2^-24, is a normal f32), so this is exact without bit juggling.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  } else {
    // Normal: rebias the exponent from 15 to 127, widen the mantissa from 10 to 23 bits.
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

void to_f32(const TensorView& t, float* out) {
  const size_t n = static_cast<size_t>(t.numel());
  if (n == 0) return;  // `out` may then be null (an empty vector's data()), as memcpy forbids
  const auto* src = static_cast<const uint8_t*>(t.data);
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out, src, n * sizeof(float));
      return;
    case DType::kF8E4M3:
      kernels::e4m3_to_f32(src, out, n, 1.0f);
      return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) {
        int32_t x;
        std::memcpy(&x, src + 4 * i, 4);
        out[i] = static_cast<float>(x);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);  // the mapping promises no alignment
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::kBF16:
      if (reinterpret_cast<uintptr_t>(src) % alignof(uint16_t) == 0) {
        kernels::bf16_to_f32(reinterpret_cast<const uint16_t*>(src), out, n);
      } else {
        // A misaligned uint16_t pointer is undefined behaviour even if the kernel copes, so go
        // through an aligned bounce buffer (only headers of odd length cause this).
        uint16_t buf[4096];
        for (size_t i = 0; i < n; i += std::size(buf)) {
          const size_t m = std::min(std::size(buf), n - i);
          std::memcpy(buf, src + 2 * i, 2 * m);
          kernels::bf16_to_f32(buf, out + i, m);
        }
      }
      return;
  }
}

Status SafetensorsCheckpoint::add_file(const std::string& path) {
  auto mapped = detail::MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  const detail::MappedFile& m = **mapped;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | m.data()[i];
  if (header_len > kMaxHeaderBytes) {
    return Status::InvalidArgument(path + ": header length " + std::to_string(header_len) +
                                   " is over the format's limit of " +
                                   util::format_bytes(kMaxHeaderBytes));
  }
  if (header_len > m.size() - 8) {
    return Status::InvalidArgument(path + ": header length " + std::to_string(header_len) +
                                   " exceeds the file's " + std::to_string(m.size() - 8) +
                                   " remaining bytes (truncated or not safetensors)");
  }
  const char* hbegin = reinterpret_cast<const char*>(m.data() + 8);
  json header = json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Status::InvalidArgument(path + ": header is not a JSON object");
  }
  const size_t data_start = 8 + header_len;
  const size_t data_size = m.size() - data_start;
  const size_t file_index = maps_.size();
  struct Range {
    size_t begin, end;
    std::string name;
    bool operator<(const Range& o) const { return std::tie(begin, end) < std::tie(o.begin, o.end); }
  };
  std::vector<Range> ranges;

  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string& tensor = name;  // a structured binding cannot be captured (clang 14)
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(path + ": tensor " + Quoted(tensor) + ": " + why);
    };
    if (!t.is_object()) return bad("header entry is not an object");
    auto dt = t.find("dtype");
    auto sh = t.find("shape");
    auto off = t.find("data_offsets");
    if (dt == t.end() || !dt->is_string()) return bad("missing or non-string 'dtype'");
    if (sh == t.end() || !sh->is_array()) return bad("missing or non-list 'shape'");
    if (off == t.end() || !off->is_array() || off->size() != 2) {
      return bad("'data_offsets' is not a [begin, end] pair");
    }
    Entry e;
    e.dtype = dt->get<std::string>();
    e.file = file_index;
    uint64_t numel = 1;
    for (const json& d : *sh) {
      auto v = Unsigned(d);
      if (!v || *v > uint64_t{1} << 62 || __builtin_mul_overflow(numel, *v, &numel)) {
        return bad("invalid shape " + sh->dump());
      }
      e.shape.push_back(static_cast<int64_t>(*v));
    }
    auto begin = Unsigned((*off)[0]);
    auto end = Unsigned((*off)[1]);
    if (!begin || !end || *begin > *end) return bad("invalid data_offsets " + off->dump());
    if (*end > data_size) {
      return Status::OutOfRange(path + ": truncated: tensor " + Quoted(name) +
                                " ends at data byte " + std::to_string(*end) +
                                " but the file's data section holds " + std::to_string(data_size) +
                                " bytes");
    }
    const size_t esize = ElementSize(e.dtype);
    if (esize != 0 && *begin % esize != 0) {
      return bad("data_offsets begin " + std::to_string(*begin) + " is not a multiple of " +
                 e.dtype + "'s " + std::to_string(esize) + "-byte element");
    }
    uint64_t want = 0;
    if (esize != 0 && (__builtin_mul_overflow(numel, esize, &want) || want != *end - *begin)) {
      return bad(std::to_string(*end - *begin) + " bytes for shape " + shape_string(e.shape) +
                 " of " + e.dtype + " (expected " + std::to_string(numel) + " x " +
                 std::to_string(esize) + ")");
    }
    e.begin = data_start + *begin;
    e.end = data_start + *end;
    ranges.push_back({e.begin, e.end, name});
    auto [it, inserted] = entries_.emplace(name, e);
    if (!inserted) {
      return Status::InvalidArgument("tensor " + Quoted(name) + " is stored twice: in " +
                                     maps_[it->second.file]->path() + " and " + path);
    }
  }
  // Two tensors sharing bytes would alias each other's weights.
  std::sort(ranges.begin(), ranges.end());
  const Range* reach = nullptr;  // the non-empty range ending last so far
  for (const Range& b : ranges) {
    if (b.begin == b.end) continue;
    if (reach != nullptr && b.begin < reach->end) {
      const Range& a = *reach;
      return Status::InvalidArgument(
          path + ": tensors " + Quoted(a.name) + " and " + Quoted(b.name) +
          " overlap: data bytes [" + std::to_string(a.begin - data_start) + ", " +
          std::to_string(a.end - data_start) + ") and [" + std::to_string(b.begin - data_start) +
          ", " + std::to_string(b.end - data_start) + ")");
    }
    if (reach == nullptr || b.end > reach->end) reach = &b;
  }
  maps_.push_back(std::move(mapped.value()));
  return Status::Ok();
}

bool SafetensorsCheckpoint::present(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path d(dir);
  return std::filesystem::exists(d / "model.safetensors.index.json", ec) ||
         std::filesystem::exists(d / "model.safetensors", ec);
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  SafetensorsCheckpoint ck;
  // A file, or something in place of one (a FIFO, a device: refused by name in add_file).
  if (fs::exists(path, ec) && !fs::is_directory(path, ec)) {
    Status s = ck.add_file(path);
    if (!s.ok()) return s;
    return ck;
  }
  if (!fs::is_directory(path, ec)) {
    return Status::NotFound(path + ": no such model directory or safetensors file");
  }
  const fs::path dir(path);
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!fs::exists(index_path, ec)) {
    const fs::path single = dir / "model.safetensors";
    if (!fs::exists(single, ec)) {
      return Status::NotFound(path + ": has neither model.safetensors nor " +
                              "model.safetensors.index.json");
    }
    Status s = ck.add_file(single.string());
    if (!s.ok()) return s;
    return ck;
  }

  // Sharded: the index maps each tensor to the shard holding it.
  const std::string ipath = index_path.string();
  Result<std::string> text = util::read_file(ipath, kSafetensorsIndexFile);
  if (!text.ok()) return text.status();
  json index = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return Status::InvalidArgument(ipath + ": not a JSON object");
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object() || wm->empty()) {
    return Status::InvalidArgument(ipath + ": weight_map: missing, or not a non-empty object");
  }
  std::vector<std::string> shards;  // in first-mention order, so files() is predictable
  std::map<std::string, size_t> shard_index;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) {
      return Status::InvalidArgument(ipath + ": weight_map: " + Quoted(name) +
                                     ": expected a file name, found " + file.dump());
    }
    const std::string f = file.get<std::string>();
    if (std::string why = shard_name_problem(f); !why.empty()) {
      return Status::InvalidArgument(ipath + ": weight_map: " + Quoted(name) + ": shard " +
                                     Quoted(f) + " is " + why);
    }
    if (shard_index.emplace(f, shards.size()).second) shards.push_back(f);
  }
  for (const std::string& f : shards) {
    Status s = ck.add_file((dir / f).string());
    if (!s.ok()) return s.WithContext(ipath);
  }
  for (const auto& [name, file] : wm->items()) {
    const size_t want = shard_index[file.get<std::string>()];
    auto it = ck.entries_.find(name);
    if (it == ck.entries_.end() || it->second.file != want) {
      return Status::InvalidArgument(ipath + ": weight_map puts tensor " + Quoted(name) + " in " +
                                     file.get<std::string>() + ", which does not hold it");
    }
  }
  return ck;
}

Result<TensorView> SafetensorsCheckpoint::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string where;
    for (const auto& m : maps_) where += (where.empty() ? "" : ", ") + m->path();
    return Status::NotFound("tensor " + Quoted(name) + " not found in " + where);
  }
  const Entry& e = it->second;
  const detail::MappedFile& m = *maps_[e.file];
  auto dtype = ParseDType(e.dtype);
  if (!dtype) {
    return Status::Unsupported(m.path() + ": tensor " + Quoted(name) + " has dtype " + e.dtype +
                               " (supported: F32, BF16, F16, and the codes of quantized weights: "
                               "F8_E4M3, I32)");
  }
  TensorView v;
  v.dtype = *dtype;
  v.shape = e.shape;
  v.data = m.data() + e.begin;
  v.bytes = e.end - e.begin;
  v.file = m.path();
  return v;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::vector<std::string> SafetensorsCheckpoint::files() const {
  std::vector<std::string> out;
  for (const auto& m : maps_) out.push_back(m->path());
  return out;
}

}  // namespace kvrt::model
