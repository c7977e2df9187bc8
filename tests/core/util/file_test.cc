// Bounded reading of input files: a limit per kind of file, devices and pipes read only up to
// it, a silent pipe given up on, and every refusal naming the file, its kind and the limit.
#include "core/util/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

namespace kvrt::util {
namespace {

namespace fs = std::filesystem;

constexpr FileKind kTiny{"test file", 16};
// The configuration file's limit (config::kConfigFile), as a device is read up to it.
constexpr FileKind kConfigFile{"configuration file", 4 * kMiB};

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kvrt_file_test_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(FileTest, ReadsARegularFileWhole) {
  write("a.txt", "exactly 16 bytes");
  Result<std::string> r = read_file(path("a.txt"), kTiny);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "exactly 16 bytes");
}

TEST_F(FileTest, FileOverItsKindsLimitIsRefusedWithTheLimitNamed) {
  write("big.txt", "seventeen bytes!!");
  Result<std::string> r = read_file(path("big.txt"), kTiny);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            path("big.txt") + ": the test file is larger than kvrt's limit of 16 bytes for it");
}

TEST_F(FileTest, EndlessDeviceIsReadOnlyUpToTheLimit) {
  Result<std::string> r = read_file("/dev/zero", kConfigFile);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "/dev/zero: the configuration file is larger than kvrt's limit of 4 MiB for it");
}

TEST_F(FileTest, MissingFileAndDirectoryAreNamed) {
  Result<std::string> missing = read_file(path("nope"), kTiny);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_EQ(missing.status().message(),
            path("nope") + ": cannot open the test file: No such file or directory");
  Result<std::string> dir = read_file(dir_.string(), kTiny);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().message(), dir_.string() + ": cannot read the test file: Is a directory");
}

TEST_F(FileTest, FifoWithAWriterIsReadToItsEnd) {
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  std::thread writer([&] { std::ofstream(path("fifo")) << "from a pipe"; });
  Result<std::string> r = read_file(path("fifo"), kTiny);
  writer.join();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "from a pipe");
}

TEST_F(FileTest, FifoFedForeverStopsAtTheLimit) {
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream out(path("fifo"));
    // Writes until the reader goes away (then the stream fails on EPIPE).
    const std::string chunk(4096, 'x');
    signal(SIGPIPE, SIG_IGN);
    while (out << chunk << std::flush) {
    }
  });
  Result<std::string> r = read_file(path("fifo"), kTiny);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            path("fifo") + ": the test file is larger than kvrt's limit of 16 bytes for it");
  writer.join();
}

TEST_F(FileTest, FifoNobodyWritesToIsGivenUpOn) {
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  Result<std::string> r = read_file(path("fifo"), kTiny, /*idle_seconds=*/1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), path("fifo") +
                                      ": the test file (a FIFO) sent nothing for 1 s; is "
                                      "anything writing to it?");
}

TEST_F(FileTest, MappedFilesMustBeRegular) {
  write("a.bin", "1234");
  Result<uint64_t> size = regular_file_size(path("a.bin"), kTiny);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 4u);
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  Result<uint64_t> fifo = regular_file_size(path("fifo"), kTiny);
  ASSERT_FALSE(fifo.ok());
  EXPECT_EQ(fifo.status().message(), path("fifo") + ": the test file is a FIFO, not a regular file");
  Result<uint64_t> dev = regular_file_size("/dev/zero", kTiny);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().message(),
            "/dev/zero: the test file is a character device, not a regular file");
}

TEST(FormatBytes, NamesLimitsInTheirUnit) {
  EXPECT_EQ(format_bytes(4 * kMiB), "4 MiB");
  EXPECT_EQ(format_bytes(2048), "2 KiB");
  EXPECT_EQ(format_bytes(100), "100 bytes");
}

}  // namespace
}  // namespace kvrt::util
