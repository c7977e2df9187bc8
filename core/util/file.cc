#include "core/util/file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvrt::util {

namespace {

std::string file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

Status too_large(const std::string& path, const FileKind& kind) {
  return Status::InvalidArgument(path + ": the " + kind.what + " is larger than kvrt's limit of " +
                                 format_bytes(kind.max_bytes) + " for it");
}

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string format_bytes(uint64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " bytes";
}

Result<std::string> read_file(const std::string& path, const FileKind& kind, int idle_seconds) {
  // Non-blocking, so that opening a FIFO nobody writes to does not wait forever.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) {
    return Status::NotFound(path + ": cannot open the " + kind.what + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(f.fd, &st) != 0) {
    return Status::NotFound(path + ": cannot stat the " + kind.what + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    return Status::NotFound(path + ": cannot read the " + kind.what + ": " + std::strerror(EISDIR));
  }
  const bool regular = S_ISREG(st.st_mode);
  if (regular && static_cast<uint64_t>(st.st_size) > kind.max_bytes) return too_large(path, kind);
  if (regular) {
    // A regular file never blocks; clear the flag so reads are plain.
    ::fcntl(f.fd, F_SETFL, ::fcntl(f.fd, F_GETFL) & ~O_NONBLOCK);
  }
  std::string text;
  if (regular) text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    if (!regular) {
      // A pipe or device: wait for data or for the writer to close, bounded. A FIFO that no
      // writer has opened yet reads as empty, so poll before every read rather than after.
      pollfd p{f.fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, idle_seconds * 1000);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        return Status::InvalidArgument(path + ": the " + kind.what + " (" +
                                       file_type(st.st_mode) + ") sent nothing for " +
                                       std::to_string(idle_seconds) +
                                       " s; is anything writing to it?");
      }
      if ((p.revents & POLLIN) == 0) return text;  // the writer closed: end of file
    }
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n > 0) {
      if (text.size() + static_cast<size_t>(n) > kind.max_bytes) return too_large(path, kind);
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return text;
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    return Status::NotFound(path + ": cannot read the " + kind.what + ": " + std::strerror(errno));
  }
}

Result<uint64_t> regular_file_size(const std::string& path, const FileKind& kind) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::NotFound(path + ": cannot open the " + kind.what + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(path + ": the " + kind.what + " is " + file_type(st.st_mode) +
                                   ", not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (kind.max_bytes != 0 && size > kind.max_bytes) return too_large(path, kind);
  return size;
}

}  // namespace kvrt::util
