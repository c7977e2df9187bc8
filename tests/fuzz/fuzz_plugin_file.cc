// The check a plugin file passes before dlopen (core/plugin/elf_check.h): any bytes, judged
// against their own ELF headers. The seeds are small real shared libraries.
#include <cstdint>
#include <span>

#include "core/plugin/elf_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)kvrt::plugin::elf_problem(std::span<const uint8_t>(data, size));
  return 0;
}
