#include "core/model/weight_format.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <regex>

#include "core/model/safetensors.h"
#include "kernels/cpu/quant_gemm.h"

namespace kvrt::model {

using nlohmann::json;

namespace {

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// "x.weight" -> "x" (the module a weight belongs to); other names stay.
std::string module_of(const std::string& name) {
  return name.size() > 7 && name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
}

// Whether `module` is one the format leaves dense (an exact name, or "re:" + a pattern matched
// from the start, as Python's re.match; an unparsable pattern matches nothing, parse() having
// refused it).
bool not_converted(const WeightFormat& f, const std::string& module, std::string* which) {
  for (const std::string& entry : f.not_converted) {
    bool hit = false;
    if (entry.rfind("re:", 0) == 0) {
      try {
        hit = std::regex_search(module, std::regex(entry.substr(3)),
                                std::regex_constants::match_continuous);
      } catch (const std::regex_error&) {
      }
    } else {
      hit = entry == module;
    }
    if (hit) {
      *which = entry;
      return true;
    }
  }
  return false;
}

using Bad = std::function<Status(const std::string&, const std::string&)>;

// The names of the modules left dense, from `key` (a list of strings; "re:" patterns checked).
Status read_not_converted(const json& q, const char* key, const Bad& bad, WeightFormat* f) {
  auto list = q.find(key);
  if (list == q.end() || list->is_null()) return Status::Ok();
  if (!list->is_array()) return bad(key, "expected a list of module names");
  for (const json& name : *list) {
    if (!name.is_string()) return bad(key, "expected a list of module names, found " + name.dump());
    const std::string entry = name.get<std::string>();
    if (entry.rfind("re:", 0) == 0) {
      try {
        std::regex check(entry.substr(3));
      } catch (const std::regex_error& e) {
        return bad(key, in_quotes(entry) + " is not a regular expression kvrt can read: " + e.what());
      }
    }
    f->not_converted.push_back(entry);
  }
  return Status::Ok();
}

// compressed-tensors: one config group of weight quantization, pack-quantized int or
// float-quantized fp8.
Status parse_compressed_tensors(const json& q, const Bad& bad, WeightFormat* f) {
  auto format = q.find("format");
  const std::string fmt = format != q.end() && format->is_string() ? format->get<std::string>() : "";
  if (fmt != "pack-quantized" && fmt != "float-quantized") {
    return bad("format", (format == q.end() ? std::string("missing") : format->dump()) +
                             ": kvrt reads \"pack-quantized\" and \"float-quantized\"");
  }
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->size() != 1) {
    return bad("config_groups", "expected one group (kvrt reads one weight scheme)");
  }
  const std::string group = groups->begin().key();
  const json& g = groups->begin().value();
  const std::string at = "config_groups." + group;
  if (!g.is_object()) return bad(at, "expected an object");
  for (const char* act : {"input_activations", "output_activations"}) {
    if (auto a = g.find(act); a != g.end() && !a->is_null()) {
      return bad(at + "." + act, "activation quantization is not served (weights only)");
    }
  }
  auto targets = g.find("targets");
  if (targets == g.end() || *targets != json::array({"Linear"})) {
    return bad(at + ".targets", "expected [\"Linear\"]");
  }
  auto w = g.find("weights");
  if (w == g.end() || !w->is_object()) return bad(at + ".weights", "missing");
  auto field = [&](const char* key) -> const json* {
    auto it = w->find(key);
    return it == w->end() ? nullptr : &*it;
  };
  const json* type = field("type");
  const json* bits = field("num_bits");
  const json* symmetric = field("symmetric");
  const json* strategy = field("strategy");
  const json* group_size = field("group_size");
  const std::string wat = at + ".weights";
  if (symmetric == nullptr || !symmetric->is_boolean()) {
    return bad(wat + ".symmetric", "missing, or not a boolean");
  }
  if (!symmetric->get<bool>() && fmt != "pack-quantized") {
    return bad(wat + ".symmetric", "false is served for pack-quantized int codes only");
  }
  f->symmetric = symmetric->get<bool>();
  if (const json* dynamic = field("dynamic"); dynamic != nullptr && *dynamic != false) {
    return bad(wat + ".dynamic", dynamic->dump() + " is not served");
  }
  const std::string strat = strategy != nullptr && strategy->is_string() ? strategy->get<std::string>() : "";
  if (fmt == "pack-quantized") {
    if (type == nullptr || *type != "int") return bad(wat + ".type", "expected \"int\"");
    if (bits == nullptr || (*bits != 4 && *bits != 8)) {
      return bad(wat + ".num_bits", (bits ? bits->dump() : std::string("missing")) +
                                        " is not served (4 or 8)");
    }
    f->kind = WeightFormat::Kind::kPackedInt;
    f->bits = bits->get<int>();
    if (strat == "group") {
      if (group_size == nullptr || !group_size->is_number_integer() ||
          group_size->get<int64_t>() < 1 || group_size->get<int64_t>() > (1 << 20)) {
        return bad(wat + ".group_size", "expected a positive integer with strategy \"group\"");
      }
      f->group_size = group_size->get<int64_t>();
    } else if (strat != "channel") {
      return bad(wat + ".strategy", (strategy ? strategy->dump() : std::string("missing")) +
                                        " is not served (\"group\" or \"channel\")");
    }
  } else {
    if (type == nullptr || *type != "float" || bits == nullptr || *bits != 8) {
      return bad(wat, "float-quantized weights are read as 8-bit floats (type \"float\", "
                      "num_bits 8)");
    }
    if (strat != "channel" && strat != "tensor") {
      return bad(wat + ".strategy", (strategy ? strategy->dump() : std::string("missing")) +
                                        " is not served (\"channel\" or \"tensor\")");
    }
    f->kind = WeightFormat::Kind::kChannelFp8;
    f->per_tensor = strat == "tensor";
  }
  return read_not_converted(q, "ignore", bad, f);
}

// A tensor's raw little-endian int32 element i.
int32_t int32_at(const TensorView& t, int64_t i) {
  int32_t x;
  std::memcpy(&x, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
  return x;
}

Status refuse(const TensorView& t, const std::string& name, const std::string& why) {
  return Status::InvalidArgument(t.file + ": tensor " + in_quotes(name) + ": " + why);
}

// A scale tensor `name` of `shape` (F32, BF16 or F16) as f32.
Result<std::vector<float>> read_scales(const SafetensorsCheckpoint& ck, const TensorView& weight,
                                       const std::string& weight_name, const std::string& name,
                                       const std::vector<int64_t>& shape, const std::string& what) {
  if (!ck.contains(name)) {
    return refuse(weight, weight_name, "its scale " + in_quotes(name) + " (" + shape_string(shape) +
                                           ") is missing");
  }
  Result<TensorView> s = ck.get(name);
  if (!s.ok()) return s.status();
  if (s->shape != shape || s->dtype == DType::kF8E4M3 || s->dtype == DType::kI32) {
    return refuse(*s, name, "expected an F32 or BF16 scale of " + shape_string(shape) + " (" +
                                what + "), found " + std::string(dtype_name(s->dtype)) + " " +
                                shape_string(s->shape));
  }
  std::vector<float> scales(static_cast<size_t>(s->numel()));
  to_f32(*s, scales.data());
  return scales;
}

// Columns `cols` of row r of the F8_E4M3 weight `w`, into *from; a NaN code among them is refused
// by its place.
Status e4m3_row(const TensorView& w, const std::string& name, const std::vector<int64_t>& shape,
                int64_t r, parallel::Range cols, const uint8_t** from) {
  *from = static_cast<const uint8_t*>(w.data) + r * shape[1] + cols.begin;
  for (int64_t c = 0; c < cols.size(); ++c) {
    if (((*from)[c] & 0x7F) == 0x7F) {
      return refuse(w, name, "element [" + std::to_string(r) + ", " +
                                 std::to_string(cols.begin + c) + "] is an E4M3 NaN");
    }
  }
  return Status::Ok();
}

// Rows `rows` and columns `cols` of the F8_E4M3 weight `w` as f32 into out, each code's value
// times scale(r, c) at its global row and column (exact in f32 for a bf16 scale: the codes carry
// 4 significant bits); a NaN code is refused by its place.
template <class Scale>
Status dequantize_fp8(const TensorView& w, const std::string& name,
                      const std::vector<int64_t>& shape, parallel::Range rows,
                      parallel::Range cols, std::vector<float>& out, Scale scale) {
  out.resize(static_cast<size_t>(rows.size() * cols.size()));
  TensorView row = w;
  row.shape = {cols.size()};
  row.bytes = static_cast<size_t>(cols.size());
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const uint8_t* from = nullptr;
    if (Status s = e4m3_row(w, name, shape, r, cols, &from); !s.ok()) return s;
    row.data = from;
    float* o = out.data() + (r - rows.begin) * cols.size();
    to_f32(row, o);
    for (int64_t c = 0; c < cols.size(); ++c) o[c] *= scale(r, cols.begin + c);
  }
  return Status::Ok();
}

// A block of `rows` x `cols` kept as stored, its codes to fill.
backend::QuantizedMatrix as_stored(backend::QuantizedMatrix::Kind kind, parallel::Range rows,
                                   parallel::Range cols, int64_t group) {
  backend::QuantizedMatrix q;
  q.kind = kind;
  q.rows = rows.size();
  q.cols = cols.size();
  q.group = group;
  q.codes.resize(static_cast<size_t>(q.rows * q.cols));
  return q;
}

Status load_fp8_blocks(const SafetensorsCheckpoint& ck, const WeightFormat& f, const TensorView& w,
                       const std::string& name, const std::vector<int64_t>& shape,
                       parallel::Range rows, parallel::Range cols, std::vector<float>& out,
                       backend::QuantizedMatrix* packed) {
  const int64_t br = f.block_rows, bc = f.block_cols;
  const std::vector<int64_t> scale_shape = {(shape[0] + br - 1) / br, (shape[1] + bc - 1) / bc};
  Result<std::vector<float>> scales =
      read_scales(ck, w, name, name + "_scale_inv", scale_shape,
                  std::to_string(br) + " x " + std::to_string(bc) + " blocks of " +
                      shape_string(shape));
  if (!scales.ok()) return scales.status();
  const float* s = scales->data();
  if (packed != nullptr && keeps_as_stored(f, shape[1], cols)) {
    // As stored: the codes (no NaN), each row's scales of its blocks.
    backend::QuantizedMatrix q = as_stored(backend::QuantizedMatrix::Kind::kFp8, rows, cols, bc);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const uint8_t* from = nullptr;
      if (Status bad = e4m3_row(w, name, shape, r, cols, &from); !bad.ok()) return bad;
      std::copy(from, from + cols.size(), q.codes.begin() + (r - rows.begin) * q.cols);
      for (int64_t g = 0; g < q.groups(); ++g) {
        q.scales.push_back(s[(r / br) * scale_shape[1] + cols.begin / bc + g]);
      }
    }
    *packed = std::move(q);
    out.clear();
    return Status::Ok();
  }
  return dequantize_fp8(w, name, shape, rows, cols, out, [&](int64_t r, int64_t c) {
    return s[(r / br) * scale_shape[1] + c / bc];
  });
}

Status load_channel_fp8(const SafetensorsCheckpoint& ck, const WeightFormat& f,
                        const TensorView& w, const std::string& name,
                        const std::vector<int64_t>& shape, parallel::Range rows,
                        parallel::Range cols, std::vector<float>& out) {
  const std::string module = module_of(name);
  Result<std::vector<float>> scales = read_scales(
      ck, w, name, module + ".weight_scale",
      f.per_tensor ? std::vector<int64_t>{1} : std::vector<int64_t>{shape[0], 1},
      f.per_tensor ? "one for the tensor" : "one per output row");
  if (!scales.ok()) return scales.status();
  const float* s = scales->data();
  return dequantize_fp8(w, name, shape, rows, cols, out,
                        [&](int64_t r, int64_t) { return s[f.per_tensor ? 0 : r]; });
}

// compressed-tensors' pack-quantized: codes q + 2^(bits-1), 32 / bits to an int32 word along the
// row, lowest bits first; scale per group of group_size columns (or per row).
Status load_packed(const SafetensorsCheckpoint& ck, const WeightFormat& f,
                   const std::string& module, const std::vector<int64_t>& shape,
                   parallel::Range rows, parallel::Range cols, std::vector<float>& out,
                   backend::QuantizedMatrix* packed_out) {
  const std::string packed_name = module + ".weight_packed";
  Result<TensorView> packed = ck.get(packed_name);
  if (!packed.ok()) return packed.status();
  const int64_t per_word = 32 / f.bits, in = shape[1];
  const int64_t words = (in + per_word - 1) / per_word;
  if (packed->dtype != DType::kI32 || packed->shape.size() != 2 ||
      packed->shape[0] != shape[0] || packed->shape[1] != words) {
    return refuse(*packed, packed_name,
                  "expected I32 " + shape_string(std::vector<int64_t>{shape[0], words}) + " (" +
                      std::to_string(per_word) + " codes of " + std::to_string(f.bits) +
                      " bits a word for " + shape_string(shape) + "), found " +
                      std::string(dtype_name(packed->dtype)) + " " +
                      shape_string(packed->shape));
  }
  // Its logical shape, as written beside it.
  const std::string shape_name = module + ".weight_shape";
  if (ck.contains(shape_name)) {
    Result<TensorView> s = ck.get(shape_name);
    if (!s.ok()) return s.status();
    if (s->dtype != DType::kI32 || s->numel() != 2 || int32_at(*s, 0) != shape[0] ||
        int32_at(*s, 1) != shape[1]) {
      std::string held = s->dtype == DType::kI32 && s->numel() == 2
                             ? "[" + std::to_string(int32_at(*s, 0)) + ", " +
                                   std::to_string(int32_at(*s, 1)) + "]"
                             : std::string(dtype_name(s->dtype)) + " " + shape_string(s->shape);
      return refuse(*s, shape_name, "says " + held + ", the model's weight is " +
                                         shape_string(shape));
    }
  }
  const int64_t group = f.group_of(in);
  const int64_t groups = (in + group - 1) / group;
  // A part must hold whole groups and whole words (both are cut only at their edges).
  auto whole = [&](int64_t c) { return c == in || (c % group == 0 && c % per_word == 0); };
  if (!whole(cols.begin) || !whole(cols.end)) {
    return refuse(*packed, packed_name,
                  "columns [" + std::to_string(cols.begin) + ", " + std::to_string(cols.end) +
                      ") of a TP rank cut a group of " + std::to_string(group) +
                      " or a word of " + std::to_string(per_word) +
                      " codes (choose a TP size that splits the input dimension at them)");
  }
  Result<std::vector<float>> scales =
      read_scales(ck, *packed, packed_name, module + ".weight_scale",
                  std::vector<int64_t>{shape[0], groups},
                  "groups of " + std::to_string(group) + " of " + shape_string(shape));
  if (!scales.ok()) return scales.status();
  const uint32_t mask = (1u << f.bits) - 1;
  const auto offset = static_cast<int32_t>(1u << (f.bits - 1));
  // The i-th code of a word, as the signed value it was packed from.
  auto unpack = [&](uint32_t word, int64_t i) {
    return static_cast<int32_t>((word >> (f.bits * i)) & mask) - offset;
  };
  // Asymmetric: zero points packed down the rows, [ceil(out / per_word)][groups].
  Result<TensorView> zeros = Status::NotFound("symmetric");
  if (!f.symmetric) {
    const std::string zero_name = module + ".weight_zero_point";
    const std::vector<int64_t> zero_shape = {(shape[0] + per_word - 1) / per_word, groups};
    if (!ck.contains(zero_name)) {
      return refuse(*packed, packed_name,
                    "its zero points " + in_quotes(zero_name) + " (I32 " +
                        shape_string(zero_shape) + ") are missing, and the config is asymmetric");
    }
    // A part must hold whole words of zero points too (rows are cut only at their edges).
    auto whole_rows = [&](int64_t r) { return r == shape[0] || r % per_word == 0; };
    if (!whole_rows(rows.begin) || !whole_rows(rows.end)) {
      return refuse(*packed, zero_name,
                    "rows [" + std::to_string(rows.begin) + ", " + std::to_string(rows.end) +
                        ") of a TP rank cut a word of " + std::to_string(per_word) +
                        " zero points (choose a TP size that splits the output dimension at them)");
    }
    zeros = ck.get(zero_name);
    if (!zeros.ok()) return zeros.status();
    if (zeros->dtype != DType::kI32 || zeros->shape != zero_shape) {
      return refuse(*zeros, zero_name,
                    "expected I32 " + shape_string(zero_shape) + " (" + std::to_string(per_word) +
                        " zero points a word down the rows of " + shape_string(shape) +
                        "), found " + std::string(dtype_name(zeros->dtype)) + " " +
                        shape_string(zeros->shape));
    }
  }
  if (packed_out != nullptr && keeps_as_stored(f, in, cols)) {
    // As stored: the unsigned codes u (q + 8), each row's scales of its groups, and with zero
    // points their unsigned codes (q - z = u - z_u).
    backend::QuantizedMatrix q =
        as_stored(backend::QuantizedMatrix::Kind::kInt4, rows, cols, group);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      for (int64_t c = cols.begin; c < cols.end; ++c) {
        const auto word = static_cast<uint32_t>(int32_at(*packed, r * words + c / per_word));
        q.codes[static_cast<size_t>((r - rows.begin) * q.cols + (c - cols.begin))] =
            static_cast<uint8_t>((word >> (f.bits * (c % per_word))) & mask);
      }
      for (int64_t g = 0; g < q.groups(); ++g) {
        q.scales.push_back((*scales)[static_cast<size_t>(r * groups + cols.begin / group + g)]);
        if (zeros.ok()) {
          const auto zword = static_cast<uint32_t>(
              int32_at(*zeros, (r / per_word) * groups + cols.begin / group + g));
          q.zeros.push_back(static_cast<uint8_t>((zword >> (f.bits * (r % per_word))) & mask));
        }
      }
    }
    *packed_out = std::move(q);
    out.clear();
    return Status::Ok();
  }
  out.resize(static_cast<size_t>(rows.size() * cols.size()));
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    float* o = out.data() + (r - rows.begin) * cols.size();
    const float* row_scales = scales->data() + r * groups;
    for (int64_t c = cols.begin; c < cols.end; ++c) {
      const auto word = static_cast<uint32_t>(int32_at(*packed, r * words + c / per_word));
      int32_t q = unpack(word, c % per_word);
      if (zeros.ok()) {
        q -= unpack(static_cast<uint32_t>(int32_at(*zeros, (r / per_word) * groups + c / group)),
                    r % per_word);
      }
      // (q - z) x scale: exact in f32 for a bf16 scale and |q - z| <= 256.
      o[c - cols.begin] = static_cast<float>(q) * row_scales[c / group];
    }
  }
  return Status::Ok();
}

}  // namespace

std::string WeightFormat::describe() const {
  switch (kind) {
    case Kind::kDense:
      return "dense";
    case Kind::kFp8Block:
      return "fp8 e4m3, " + std::to_string(block_rows) + " x " + std::to_string(block_cols) +
             " blocks";
    case Kind::kPackedInt:
      return "compressed-tensors int" + std::to_string(bits) + ", " +
             (group_size > 0 ? "groups of " + std::to_string(group_size) : std::string("per row")) +
             (symmetric ? ", symmetric" : ", zero points");
    case Kind::kChannelFp8:
      return std::string("compressed-tensors fp8 e4m3, ") +
             (per_tensor ? "one scale" : "a scale per row");
  }
  return "?";
}

Result<WeightFormat> WeightFormat::parse(const json* q, const std::string& source) {
  WeightFormat f;
  if (q == nullptr || q->is_null()) return f;
  const std::string at = source + ": quantization_config";
  const Bad bad = [&](const std::string& key, const std::string& why) {
    return Status::ConfigError(at + (key.empty() ? "" : "." + key) + ": " + why);
  };
  if (!q->is_object()) return bad("", "expected an object, found " + q->dump());
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string()) {
    return bad("quant_method", "missing, or not a string");
  }
  const std::string m = method->get<std::string>();
  if (m == "compressed-tensors") {
    if (Status s = parse_compressed_tensors(*q, bad, &f); !s.ok()) return s;
    return f;
  }
  if (m != "fp8") {
    return bad("quant_method",
               in_quotes(m) + " is not served (kvrt reads \"fp8\" block weights and "
                           "\"compressed-tensors\"; GPTQ, AWQ, bitsandbytes and other formats "
                           "are refused)");
  }
  // DeepSeek-V3's form: {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
  // "weight_block_size": [128, 128]}.
  if (auto fmt = q->find("fmt"); fmt != q->end()) {
    if (!fmt->is_string() || fmt->get<std::string>() != "e4m3") {
      return bad("fmt", fmt->dump() + " is not served (only \"e4m3\")");
    }
  }
  if (auto scheme = q->find("activation_scheme"); scheme != q->end()) {
    if (!scheme->is_string() || scheme->get<std::string>() != "dynamic") {
      return bad("activation_scheme",
                 scheme->dump() + " is not served (only \"dynamic\": the weights are "
                                  "dequantized at load and activations are not quantized)");
    }
  }
  auto block = q->find("weight_block_size");
  if (block == q->end() || block->is_null()) {
    return bad("weight_block_size", "missing: per-tensor fp8 weights are not served yet");
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() < 1 ||
      (*block)[1].get<int64_t>() < 1 || (*block)[0].get<int64_t>() > (1 << 20) ||
      (*block)[1].get<int64_t>() > (1 << 20)) {
    return bad("weight_block_size", "expected [rows, cols] of positive integers, found " +
                                        block->dump());
  }
  f.kind = Kind::kFp8Block;
  f.block_rows = (*block)[0].get<int64_t>();
  f.block_cols = (*block)[1].get<int64_t>();
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    if (Status s = read_not_converted(*q, key, bad, &f); !s.ok()) return s;
  }
  return f;
}

Result<uint64_t> stored_quantized_bytes(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                                        const std::string& name, const std::vector<int64_t>& shape,
                                        parallel::Range rows, parallel::Range cols,
                                        std::set<std::string>* counted) {
  if (!format.quantized() || shape.size() != 2) {
    return Status::NotFound(name + " is not stored quantized");
  }
  const std::string module = module_of(name);
  std::vector<std::string> shared;  // split with the block's share
  std::string whole;                // counted whole
  if (format.kind == WeightFormat::Kind::kPackedInt && ck.contains(module + ".weight_packed")) {
    shared = {module + ".weight_packed", module + ".weight_scale", module + ".weight_zero_point"};
    whole = module + ".weight_shape";
  } else {
    if (!ck.contains(name)) return Status::NotFound(name + " is not stored");
    Result<TensorView> w = ck.get(name);
    if (!w.ok()) return w.status();
    if (w->dtype != DType::kF8E4M3) return Status::NotFound(name + " is stored dense");
    shared = {name, format.kind == WeightFormat::Kind::kFp8Block ? name + "_scale_inv"
                                                                 : module + ".weight_scale"};
  }
  const double share = static_cast<double>(rows.size()) * static_cast<double>(cols.size()) /
                       (static_cast<double>(shape[0]) * static_cast<double>(shape[1]));
  double bytes = 0;
  // A tensor not stored is a zero point the format has none of (a missing scale is the
  // loader's refusal, not the count's).
  auto add = [&](const std::string& n, double part) -> Status {
    if (!ck.contains(n)) return Status::Ok();
    Result<TensorView> t = ck.get(n);
    if (!t.ok()) return t.status();
    bytes += static_cast<double>(t->bytes) * part;
    if (counted != nullptr) counted->insert(n);
    return Status::Ok();
  };
  for (const std::string& n : shared) {
    if (Status s = add(n, share); !s.ok()) return s;
  }
  if (!whole.empty()) {
    if (Status s = add(whole, 1); !s.ok()) return s;
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

bool keeps_as_stored(const WeightFormat& format, int64_t in, parallel::Range cols) {
  switch (format.kind) {
    case WeightFormat::Kind::kPackedInt:
      return format.bits == 4 && format.group_of(in) % 8 == 0;
    case WeightFormat::Kind::kFp8Block:
      return format.block_cols % 4 == 0 && cols.begin % format.block_cols == 0;
    default:
      return false;
  }
}

Result<uint64_t> packed_quantized_bytes(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                                        const std::string& name, const std::vector<int64_t>& shape,
                                        parallel::Range rows, parallel::Range cols) {
  if (!format.quantized() || shape.size() != 2 || !keeps_as_stored(format, shape[1], cols)) {
    return Status::NotFound(name + " is not kept as stored");
  }
  const auto n = static_cast<size_t>(rows.size()), k = static_cast<size_t>(cols.size());
  if (format.kind == WeightFormat::Kind::kFp8Block) {
    return kernels::packed_fp8_bytes(n, k, {1, static_cast<size_t>(format.block_cols)});
  }
  const std::string module = module_of(name);
  Result<TensorView> scale = ck.get(module + ".weight_scale");
  if (!scale.ok()) return scale.status();
  const kernels::Int4Format f{static_cast<size_t>(format.group_of(shape[1])),
                              scale->dtype == DType::kBF16, !format.symmetric};
  return kernels::packed_int4_bytes(n, k, f);
}

std::string stored_tensor_name(const SafetensorsCheckpoint& ck, const std::string& name) {
  auto stored = [&](const std::string& n) {
    return ck.contains(n) || ck.contains(module_of(n) + ".weight_packed");
  };
  if (stored(name)) return name;
  const std::string prefixed = "language_model." + name;
  return stored(prefixed) ? prefixed : name;
}

Status load_quantized_block(const SafetensorsCheckpoint& ck, const WeightFormat& format,
                            const std::string& name, const std::vector<int64_t>& shape,
                            parallel::Range rows, parallel::Range cols, std::vector<float>& out,
                            backend::QuantizedMatrix* packed) {
  if (!format.quantized() || shape.size() != 2) {
    return Status::NotFound(name + " is not stored quantized");
  }
  const std::string module = module_of(name);
  std::string listed;
  const bool dense = not_converted(format, module, &listed);
  if (format.kind == WeightFormat::Kind::kPackedInt && ck.contains(module + ".weight_packed")) {
    if (dense) {
      return Status::InvalidArgument(
          "tensor " + in_quotes(module + ".weight_packed") +
          " is packed, but quantization_config lists " + in_quotes(listed) + " as left dense");
    }
    return load_packed(ck, format, module, shape, rows, cols, out, packed);
  }
  if (!ck.contains(name)) return Status::NotFound(name + " is not stored");
  Result<TensorView> w = ck.get(name);
  if (!w.ok()) return w.status();
  if (w->dtype != DType::kF8E4M3) return Status::NotFound(name + " is stored dense");
  if (format.kind == WeightFormat::Kind::kPackedInt) {
    return refuse(*w, name, "is F8_E4M3, but quantization_config packs int codes");
  }
  if (w->shape != shape) {
    return refuse(*w, name, "expected shape " + shape_string(shape) + ", found " +
                                shape_string(w->shape));
  }
  if (dense) {
    return refuse(*w, name, "is F8_E4M3, but quantization_config lists " + in_quotes(listed) +
                                " as not converted");
  }
  return format.kind == WeightFormat::Kind::kFp8Block
             ? load_fp8_blocks(ck, format, *w, name, shape, rows, cols, out, packed)
             : load_channel_fp8(ck, format, *w, name, shape, rows, cols, out);
}

}  // namespace kvrt::model
