// Read-only access to Hugging Face safetensors checkpoints: one model.safetensors, or shards
// listed by model.safetensors.index.json. Files are memory-mapped; tensors are views into the
// mappings, valid while any copy of the checkpoint that produced them is alive.
//
// File format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section, which the offsets index (relative to its start).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::model {

inline constexpr util::FileKind kSafetensorsIndexFile{"safetensors index", 64 * util::kMiB};

namespace detail {
class MappedFile;  // an mmap of a whole file, unmapped when the last checkpoint copy goes
}  // namespace detail

// The element types a tensor may have to be loaded (others are reported, see get()). F8_E4M3
// holds the codes of a quantized weight (weight_format.h dequantizes them with their scales).
// I32 holds packed integer codes (compressed-tensors' weight_packed) and shapes (weight_shape).
enum class DType { kF32, kBF16, kF16, kF8E4M3, kI32 };

// "F32", "BF16", "F16", "F8_E4M3", "I32": the names safetensors uses.
std::string_view dtype_name(DType dtype);
size_t dtype_size(DType dtype);
// "[32, 64]", as messages show shapes.
std::string shape_string(std::span<const int64_t> shape);

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // little-endian elements, row-major; no alignment promised
  size_t bytes = 0;            // == numel() * dtype_size(dtype)
  std::string file;            // the .safetensors file holding it, for messages

  int64_t numel() const;
};

// IEEE binary16 bits to f32, exactly (every f16 value is an f32 value): +-0, subnormals, +-inf;
// a NaN keeps its sign and its payload (shifted into the top of the f32 mantissa).
float f16_to_f32(uint16_t bits);
// Widens the tensor's numel() elements to f32 into out (which holds at least that many); F8_E4M3
// codes to their values (OCP E4M3, unscaled); I32 to the nearest f32.
void to_f32(const TensorView& tensor, float* out);

class SafetensorsCheckpoint {
 public:
  // `path` is a model directory (model.safetensors.index.json, else model.safetensors) or a
  // .safetensors file. Headers are parsed and every tensor's byte range is checked against its
  // file and dtype here, so a truncated or inconsistent file fails now, naming file and tensor.
  static Result<SafetensorsCheckpoint> open(const std::string& path);
  // Whether the directory `dir` has a checkpoint open() would try: model.safetensors.index.json
  // or model.safetensors (a config.json alone is a model to plan, not to load).
  static bool present(const std::string& dir);

  // The tensor, or NotFound naming it; Unsupported naming it and its dtype if that is not F32,
  // BF16, F16, F8_E4M3 or I32.
  Result<TensorView> get(const std::string& name) const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // The mapped files, in the order they were opened.
  std::vector<std::string> files() const;

 private:
  struct Entry {
    std::string dtype;  // as written, so an unsupported one can be named when asked for
    std::vector<int64_t> shape;
    size_t file = 0;   // index into maps_
    size_t begin = 0;  // byte range in the file (not in the data section)
    size_t end = 0;
  };
  // Maps one .safetensors file and records all its tensors.
  Status add_file(const std::string& path);

  std::vector<std::shared_ptr<const detail::MappedFile>> maps_;
  std::map<std::string, Entry> entries_;
};

}  // namespace kvrt::model
