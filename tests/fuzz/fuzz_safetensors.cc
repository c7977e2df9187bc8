// A safetensors file: the header length, the JSON header and every tensor's byte range,
// dtype, shape and overlap checks; then every tensor the loader can convert is read.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A real file (the loader maps files), held in memory.
  static const int fd = memfd_create("fuzz.safetensors", 0);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  kvrt::Result<kvrt::model::SafetensorsCheckpoint> ck =
      kvrt::model::SafetensorsCheckpoint::open(path);
  if (!ck.ok()) return 0;
  for (const std::string& name : ck->names()) {
    kvrt::Result<kvrt::model::TensorView> t = ck->get(name);
    if (!t.ok() || t->numel() > (1 << 20)) continue;
    std::vector<float> out(static_cast<size_t>(t->numel()));
    kvrt::model::to_f32(*t, out.data());
  }
  return 0;
}
