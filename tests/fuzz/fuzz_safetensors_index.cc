// model.safetensors.index.json: the weight map, shard names (never outside the directory), and
// the agreement of the index with the shards it names. Two real shards sit in a scratch
// directory: model-00001.safetensors (tensor "a") and model-00002.safetensors (tensor "b").
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/model/safetensors.h"

namespace {

void write_shard(const std::filesystem::path& path, const std::string& tensor) {
  const std::string header = "{\"" + tensor + "\":{\"dtype\":\"F32\",\"shape\":[2],"
                             "\"data_offsets\":[0,8]}}";
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  const float values[2] = {1.0f, 2.0f};
  out.write(reinterpret_cast<const char*>(values), sizeof values);
}

std::filesystem::path scratch() {
  static const std::filesystem::path dir = [] {
    char name[] = "/tmp/kvrt-fuzz-index-XXXXXX";
    std::filesystem::path d = mkdtemp(name);
    write_shard(d / "model-00001.safetensors", "a");
    write_shard(d / "model-00002.safetensors", "b");
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path dir = scratch();
  {
    std::ofstream index(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    index.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  (void)kvrt::model::SafetensorsCheckpoint::open(dir.string());
  return 0;
}
