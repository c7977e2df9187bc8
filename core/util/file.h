// Reading the files kvrt is given, bounded: every kind of file has a size limit that fits it, a
// FIFO or a device (/dev/zero) is read only up to that limit, and a pipe that stays silent is
// given up on, so no input file can exhaust memory or hang a command. Messages name the file,
// its kind and the limit.
#pragma once

#include <cstdint>
#include <string>

#include "core/util/status.h"

namespace kvrt::util {

// What a file is (for messages) and the most bytes kvrt accepts of one.
struct FileKind {
  const char* what;
  uint64_t max_bytes;
};

inline constexpr uint64_t kMiB = uint64_t{1} << 20;

// Each reader owns the limit of the files it reads, declared beside it (config::kConfigFile,
// model::kModelConfigFile, text::kTokenizerFile, ...): far above any real file of its kind (a
// Hugging Face config.json is a few KiB, Kimi-K2's safetensors index about 10 MiB, a
// SentencePiece model a few MiB) and far below what would strain the machine.

// How long a pipe may stay silent before reading it is given up (a FIFO nobody writes to).
inline constexpr int kPipeIdleSeconds = 10;

// "4 MiB", "512 bytes": a limit as messages show it.
std::string format_bytes(uint64_t bytes);

// The whole file. NotFound when it cannot be opened ("<path>: cannot open the <kind>: <errno
// text>"), InvalidArgument when it is larger than the kind's limit ("<path>: the <kind> is
// larger than kvrt's limit of N MiB for it") or a pipe stays silent, with the reason.
// `idle_seconds` is how long a pipe may stay silent.
Result<std::string> read_file(const std::string& path, const FileKind& kind,
                              int idle_seconds = kPipeIdleSeconds);

// For files that are mapped rather than read (safetensors shards, plugin libraries): the size of
// a regular file, or an error naming the file when it is missing, not a regular file (a FIFO, a
// device, a directory) or over `kind`'s limit. max_bytes 0 means no limit beyond the file's.
Result<uint64_t> regular_file_size(const std::string& path, const FileKind& kind);

}  // namespace kvrt::util
