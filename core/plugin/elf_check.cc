#include "core/plugin/elf_check.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/util/file.h"

namespace kvrt::plugin {

namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
constexpr const char* kHostMachineName = "x86-64";
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
constexpr const char* kHostMachineName = "AArch64";
#else
#error "kvrt's plugin check knows x86-64 and AArch64 hosts"
#endif

std::string segment_type(uint32_t type) {
  switch (type) {
    case PT_LOAD:
      return "LOAD";
    case PT_DYNAMIC:
      return "DYNAMIC";
    case PT_INTERP:
      return "INTERP";
    case PT_NOTE:
      return "NOTE";
    case PT_TLS:
      return "TLS";
    case PT_GNU_EH_FRAME:
      return "GNU_EH_FRAME";
    case PT_GNU_RELRO:
      return "GNU_RELRO";
    default:
      return "type " + std::to_string(type);
  }
}

// offset + count * size <= limit, without overflow.
bool fits(uint64_t offset, uint64_t count, uint64_t size, uint64_t limit) {
  uint64_t bytes = 0, end = 0;
  return !__builtin_mul_overflow(count, size, &bytes) &&
         !__builtin_add_overflow(offset, bytes, &end) && end <= limit;
}

}  // namespace

std::string elf_problem(std::span<const uint8_t> image) {
  const uint64_t size = image.size();
  const std::string file_bytes = "the file's " + std::to_string(size) + " bytes";
  if (size < SELFMAG || std::memcmp(image.data(), ELFMAG, SELFMAG) != 0) {
    return "not an ELF file: it does not start with the ELF magic bytes";
  }
  if (size < sizeof(Elf64_Ehdr)) {
    return "truncated: " + file_bytes + " do not hold the " + std::to_string(sizeof(Elf64_Ehdr)) +
           "-byte ELF header";
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return "not a 64-bit ELF file";
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB) return "not a little-endian ELF file";
  if (eh.e_type != ET_DYN) {
    return eh.e_type == ET_EXEC ? "an executable, not a shared library"
                                : eh.e_type == ET_REL ? "an object file (.o), not a shared library"
                                                      : "not a shared library (ELF type " +
                                                            std::to_string(eh.e_type) + ")";
  }
  if (eh.e_machine != kHostMachine) {
    return "built for another machine (ELF machine " + std::to_string(eh.e_machine) +
           "), this host is " + kHostMachineName;
  }
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0) {
    return "corrupt ELF header: " + std::to_string(eh.e_phnum) + " program headers of " +
           std::to_string(eh.e_phentsize) + " bytes";
  }
  if (!fits(eh.e_phoff, eh.e_phnum, sizeof(Elf64_Phdr), size)) {
    return "truncated: the program headers at byte " + std::to_string(eh.e_phoff) +
           " reach past " + file_bytes;
  }
  bool has_load = false, has_dynamic = false;
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, image.data() + eh.e_phoff + uint64_t{i} * sizeof(Elf64_Phdr), sizeof ph);
    if (ph.p_type == PT_LOAD) {
      has_load = true;
      if (ph.p_filesz > ph.p_memsz) {
        return "corrupt: segment " + std::to_string(i) + " (LOAD) has more file bytes (" +
               std::to_string(ph.p_filesz) + ") than memory bytes (" +
               std::to_string(ph.p_memsz) + ")";
      }
    }
    if (ph.p_type == PT_DYNAMIC) has_dynamic = true;
    // Only the segments the loader reads from the file matter; GNU_STACK and the like are
    // empty.
    if (ph.p_filesz == 0) continue;
    if (!fits(ph.p_offset, 1, ph.p_filesz, size)) {
      uint64_t end = 0;
      const bool overflow = __builtin_add_overflow(ph.p_offset, ph.p_filesz, &end);
      return "truncated: segment " + std::to_string(i) + " (" + segment_type(ph.p_type) +
             ") ends at byte " + (overflow ? std::string("beyond 2^64") : std::to_string(end)) +
             ", past " + file_bytes;
    }
  }
  if (!has_load) return "corrupt: no loadable segment";
  if (!has_dynamic) return "not a shared library: no dynamic section";
  if (eh.e_shnum != 0 &&
      (eh.e_shentsize != sizeof(Elf64_Shdr) ||
       !fits(eh.e_shoff, eh.e_shnum, sizeof(Elf64_Shdr), size))) {
    return "truncated: the section headers at byte " + std::to_string(eh.e_shoff) +
           " reach past " + file_bytes;
  }
  return "";
}

Status check_elf_file(const std::string& path) {
  Result<uint64_t> size = util::regular_file_size(path, kPluginFile);
  if (!size.ok()) return Status::PluginError(size.status().message());
  auto refuse = [&](const std::string& why) {
    return Status::PluginError(path + ": not a loadable shared library: " + why);
  };
  if (*size == 0) return refuse("the file is empty");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return refuse(std::string("cannot open: ") + std::strerror(errno));
  void* p = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return refuse(std::string("cannot map: ") + std::strerror(err));
  const std::string problem =
      elf_problem(std::span<const uint8_t>(static_cast<const uint8_t*>(p), *size));
  ::munmap(p, *size);
  return problem.empty() ? Status::Ok() : refuse(problem);
}

}  // namespace kvrt::plugin
