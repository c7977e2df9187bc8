// The check a plugin file passes before it reaches the dynamic loader. dlopen maps a library's
// segments as its program headers describe them; a truncated file (a copy interrupted, a build
// killed mid-link) maps pages past its end, and the first touch of them kills the process with
// SIGBUS inside dlopen. So the file's headers are read first and every segment must lie inside
// the file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::plugin {

// Read through the ELF check's headers only, then mapped by the dynamic loader.
inline constexpr util::FileKind kPluginFile{"plugin library", 1024 * util::kMiB};

// "" when `image` (a whole file's bytes) is a shared library for this host that dlopen can map
// from the file alone: a 64-bit little-endian ELF of type ET_DYN for this machine whose program
// headers, segments, dynamic section and section headers all lie inside `image`. Otherwise the
// first problem, in words ("segment 3 (LOAD) ends at byte 81920, past the file's 3000 bytes").
std::string elf_problem(std::span<const uint8_t> image);

// elf_problem() on the file at `path` (mapped read-only, never executed); PluginError naming the
// file when it is missing, not a regular file, over kPluginFile's limit or not loadable.
Status check_elf_file(const std::string& path);

}  // namespace kvrt::plugin
