// The loader refuses each kind of broken plugin with one line naming the file and the reason,
// and loads the shipped stores by name and by path.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>

#include "core/capacity/stores.h"
#include "core/plugin/elf_check.h"
#include "core/plugin/kv_store.h"
#include "core/plugin/registry.h"

namespace kvrt::plugin {
namespace {

std::string broken(const std::string& file) { return std::string(KVRT_BROKEN_DIR) + "/" + file; }

std::string load_error(const std::string& path) {
  Registry registry;
  Result<const LoadedPlugin*> plugin = registry.load(path);
  EXPECT_FALSE(plugin.ok()) << path << " loaded";
  return plugin.ok() ? "" : plugin.status().message();
}

void expect_error(const std::string& file, const std::string& reason) {
  std::string message = load_error(broken(file));
  EXPECT_NE(message.find(broken(file)), std::string::npos) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
}

TEST(Loader, MissingFileIsNamed) { expect_error("does_not_exist.so", "file not found"); }

TEST(Loader, NotASharedLibrary) {
  expect_error("not_a_library.so", "not a loadable shared library: not an ELF file");
  // Said once, without the dynamic loader's wrapping (a stray ')', an unrelated errno text).
  const std::string message = load_error(broken("not_a_library.so"));
  EXPECT_EQ(message.find(')'), std::string::npos) << message;
  EXPECT_EQ(message.find("Bad file descriptor"), std::string::npos) << message;
}

// A scratch folder, removed at the end.
struct ScratchDir {
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvrt_loader_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A library cut short (an interrupted copy) would kill the process with SIGBUS inside dlopen:
// its headers are checked first, at every cut, by path and by a folder scan.
TEST(Loader, TruncatedLibraryIsRefusedBeforeDlopen) {
  const std::string whole = read_bytes(std::string(KVRT_PLUGIN_DIR) + "/kv_bf16_paged.so");
  ASSERT_GT(whole.size(), 100000u);
  ScratchDir dir;
  for (size_t cut : {size_t{0}, size_t{3}, size_t{40}, size_t{64}, size_t{1000}, size_t{20000},
                     whole.size() / 2, whole.size() - 1}) {
    const std::filesystem::path file = dir.path / ("kv_cut_" + std::to_string(cut) + ".so");
    write_bytes(file, whole.substr(0, cut));
    const std::string message = load_error(file.string());
    EXPECT_NE(message.find(file.string() + ": not a loadable shared library: "), std::string::npos)
        << message;
  }
  setenv("KVRT_PLUGIN_PATH", dir.path.c_str(), 1);
  Registry registry;
  std::vector<LoadFailure> failures = registry.discover();
  unsetenv("KVRT_PLUGIN_PATH");
  EXPECT_EQ(failures.size(), 8u);
}

// A FIFO named like a plugin would block dlopen's open() forever; a scan refuses it at once.
TEST(Loader, FifoInThePluginFolderIsRefusedWithoutBlocking) {
  ScratchDir dir;
  const std::filesystem::path fifo = dir.path / "kv_fifo.so";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(load_error(fifo.string()),
            fifo.string() + ": the plugin library is a FIFO, not a regular file");
}

// The ELF check on its own: each header field that would mislead the loader, by name.
TEST(ElfCheck, NamesWhatIsWrongWithTheHeaders) {
  const std::string whole = read_bytes(std::string(KVRT_PLUGIN_DIR) + "/kv_bf16_paged.so");
  auto problem = [](std::string bytes) {
    return elf_problem(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  };
  EXPECT_EQ(problem(whole), "");
  std::string other = whole;
  other[18] = 40;  // e_machine: ARM
  EXPECT_NE(problem(other).find("built for another machine"), std::string::npos);
  std::string exec = whole;
  exec[16] = 2;  // e_type: ET_EXEC
  EXPECT_EQ(problem(exec), "an executable, not a shared library");
  std::string far = whole;
  far[32 + 7] = 0x7f;  // e_phoff near 2^63
  EXPECT_NE(problem(far).find("the program headers at byte"), std::string::npos);
  std::string narrow = whole;
  narrow[4] = 1;  // ELFCLASS32
  EXPECT_EQ(problem(narrow), "not a 64-bit ELF file");
}

TEST(Loader, MissingEntrySymbol) {
  expect_error("broken_no_entry.so", "entry symbol 'kvrt_plugin_query' not found");
}

TEST(Loader, AbiMajorMismatch) {
  expect_error("broken_abi_major.so", "ABI major mismatch: plugin built for 99, host is 1");
}

TEST(Loader, TableTooSmall) {
  expect_error("broken_table_too_small.so", "KV store table too small: struct_size 40");
}

TEST(Loader, RequiredCallbackMissing) {
  expect_error("broken_missing_callback.so", "required callback 'write' is missing");
}

TEST(Loader, TierCallbacksAllOrNone) {
  expect_error("broken_unpaired_tier.so",
               "tier callbacks must all be present or all absent: 'tier_lookup' is missing");
}

TEST(Loader, PluginDeclinesDevice) {
  expect_error("broken_declines_device.so",
               "declines device cpu:0: needs a CUDA device with compute capability 9.0");
}

TEST(Loader, PluginInitErrorCarriesItsMessage) {
  expect_error("broken_init_error.so",
               "plugin init failed (CONFIG): license file /etc/kv_vendor.lic not found");
}

TEST(Loader, NameNotFoundListsTheSearchPath) {
  setenv("KVRT_PLUGIN_PATH", KVRT_BROKEN_DIR, 1);
  Registry registry;
  Result<const LoadedPlugin*> plugin = registry.load("kv_nonexistent");
  unsetenv("KVRT_PLUGIN_PATH");
  ASSERT_FALSE(plugin.ok());
  EXPECT_NE(plugin.status().message().find("plugin 'kv_nonexistent' not found; searched: " +
                                           std::string(KVRT_BROKEN_DIR)),
            std::string::npos)
      << plugin.status().message();
}

TEST(Loader, LoadsShippedStoresByNameFromThePluginPath) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  Registry registry;
  for (const char* name : {"kv_bf16_paged", "kv_fp8_e4m3", "kv_host_tiered"}) {
    Result<const LoadedPlugin*> plugin = registry.load_kv_store(name);
    ASSERT_TRUE(plugin.ok()) << plugin.status().message();
    EXPECT_EQ((*plugin)->name, name);
    EXPECT_EQ((*plugin)->kind(), KVRT_PLUGIN_KV_STORE);
    // Loading again, by name or by path, gives the same plugin.
    EXPECT_EQ(*registry.load(name), *plugin);
    EXPECT_EQ(*registry.load((*plugin)->path.string()), *plugin);
  }
  unsetenv("KVRT_PLUGIN_PATH");
  const LoadedPlugin* tiered = *registry.load("kv_host_tiered");
  EXPECT_EQ(tiered->capabilities(), "layout,gather,tier,format");
  EXPECT_EQ((*registry.load("kv_bf16_paged"))->capabilities(), "layout,gather,format");
  EXPECT_EQ(tiered->input_dtype_names(), "f32,bf16");
}

// One layer of one KV head of `dim`, pages of 16.
kvrt_kv_geometry one_layer(uint32_t dim) {
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = g.num_kv_heads = g.total_kv_heads = g.tp_size = 1;
  g.k_head_dim = g.v_head_dim = dim;
  g.page_size = 16;
  g.input_dtype = KVRT_DTYPE_F32;
  return g;
}

// A store built against ABI 1.0 (minor 0, a table ending at tier_wait) loads into a 1.1 host;
// the 1.1 slot it lacks reads as NULL, and the tier it has is reported with an unknown size
// rather than a size the core would have to guess.
TEST(Loader, AnAbi10PluginStillLoads) {
  Registry registry;
  Result<const LoadedPlugin*> old = registry.load(broken("broken_abi_1_0.so"));
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ((*old)->desc.abi_minor, 0u);
  EXPECT_NE((*old)->kv.tier_wait, nullptr);
  EXPECT_EQ((*old)->kv.tier_pages, nullptr);
  // An older table has no ABI 1.3 part, and says so to whoever is handed it.
  EXPECT_EQ((*old)->kv_1_3.format, nullptr);
  EXPECT_EQ(kvrt_kv_store_api_1_3_of(&(*old)->kv), nullptr);
  const kvrt_kv_geometry g = one_layer(8);
  Result<uint64_t> pages = tier_pages(**old, g, nullptr, 100);
  ASSERT_FALSE(pages.ok());
  EXPECT_TRUE(pages.status().IsNotFound()) << pages.status().message();
  // An MLA-like V (the latent's first 32 of 40 values) cannot be said to a 1.0 store.
  kvrt_kv_geometry mla = one_layer(40);
  mla.v_head_dim = 0;
  mla.v_width = 32;
  Result<std::unique_ptr<KvStore>> refused = KvStore::create(**old, mla, 4, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(
      refused.status().message().find("built against ABI 1.0, which cannot hold V of width 32"),
      std::string::npos)
      << refused.status().message();
  capacity::Budget budget;
  budget.device_memory = 1 << 20;
  capacity::StoreCapacity c = capacity::store_capacity(**old, nullptr, g, budget);
  ASSERT_TRUE(c.error.ok()) << c.error.message();
  EXPECT_TRUE(c.host_tier);
  EXPECT_FALSE(c.host_tier_sized);
  EXPECT_NE(capacity::format_report(c, budget).find("host tier tokens       unknown"),
            std::string::npos)
      << capacity::format_report(c, budget);
}

// The 1.1 store sizes its own tier (tier_pages), and the capacity report takes its word.
TEST(Loader, ATierSizesItselfThroughTierPages) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  Registry registry;
  Result<const LoadedPlugin*> tiered = registry.load("kv_host_tiered");
  unsetenv("KVRT_PLUGIN_PATH");
  ASSERT_TRUE(tiered.ok()) << tiered.status().message();
  ASSERT_NE((*tiered)->kv.tier_pages, nullptr);
  const kvrt_kv_geometry g = one_layer(64);
  Result<uint64_t> pages = tier_pages(**tiered, g, nullptr, 100);
  ASSERT_TRUE(pages.ok()) << pages.status().message();
  EXPECT_EQ(*pages, 200u);  // host_pool_ratio's default of 2 times the device pages
}

TEST(Loader, DiscoverReportsBrokenPluginsWithoutStopping) {
  setenv("KVRT_PLUGIN_PATH", KVRT_BROKEN_DIR, 1);
  Registry registry;
  std::vector<LoadFailure> failures = registry.discover();
  unsetenv("KVRT_PLUGIN_PATH");
  EXPECT_GE(failures.size(), 8u);   // every broken_* plus not_a_library
  bool found_wrong_stride = false;  // a plugin that loads fine (its bug is in its data)
  for (const LoadedPlugin* p : registry.loaded())
    found_wrong_stride |= p->name == "kv_wrong_stride";
  EXPECT_TRUE(found_wrong_stride);
}

}  // namespace
}  // namespace kvrt::plugin
