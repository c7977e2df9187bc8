// Safetensors files written by tests: checkpoints of a format no shared model has, and hostile
// ones. Header-only; the tensors' bytes are given as they are to be stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace kvrt::testdata {

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Raw little-endian bytes of a vector (F32, I32, and BF16 / F16 given as their 16-bit words).
template <typename T>
std::string RawBytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}
inline std::string F32Bytes(const std::vector<float>& v) { return RawBytes(v); }
inline std::string U16Bytes(const std::vector<uint16_t>& v) { return RawBytes(v); }

// The header with its 8-byte little-endian length in front.
inline std::string Framed(const std::string& header) {
  std::string file(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return file + header;
}

// Writes a safetensors file. header_pad spaces pad the JSON (the format allows trailing
// whitespace), which lets a test put the data section at an odd address.
inline void WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors,
                             size_t header_pad = 0) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const RawTensor& t : tensors) {
    header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      header += (i ? "," : "") + std::to_string(t.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + t.bytes.size()) + "]}";
    data += t.bytes;
  }
  header += "}" + std::string(header_pad, ' ');
  WriteFile(path, Framed(header) + data);
}

}  // namespace kvrt::testdata
