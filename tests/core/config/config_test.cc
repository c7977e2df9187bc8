#include "core/config/config.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvrt::config {
namespace {

// The source tree, for configs/*.toml and the fixtures; set by tests/core/config/CMakeLists.txt.
const std::string kSourceDir = KVRT_TEST_SOURCE_DIR;
const std::string kData = kSourceDir + "/tests/core/config/data/";

Config Load(std::string_view text, const std::vector<std::string>& overrides = {}) {
  Result<Config> c = load_string(text, "configs/x.toml", overrides);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : Config{};
}

// The message a user sees; every one must be a single line.
std::string Error(std::string_view text, const std::vector<std::string>& overrides = {}) {
  Result<Config> c = load_string(text, "configs/x.toml", overrides);
  EXPECT_FALSE(c.ok()) << "accepted:\n" << text;
  EXPECT_TRUE(c.status().IsConfigError());
  EXPECT_EQ(c.status().message().find('\n'), std::string::npos) << c.status().message();
  return c.status().message();
}

TEST(ConfigDefaults, EveryKeyHasItsDocumentedDefault) {
  Result<Config> r = defaults();
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Config& c = r.value();
  EXPECT_EQ(c.source, "<defaults>");
  EXPECT_EQ(c.model.preset, "synth-76m");
  EXPECT_EQ(c.model.path, "");
  EXPECT_EQ(c.model.dtype, "auto");
  EXPECT_EQ(c.device.kind, "cpu");
  EXPECT_EQ(c.device.ordinal, 0);
  EXPECT_EQ(c.device.memory, "2GiB");
  EXPECT_EQ(c.device.memory_bytes, uint64_t{2} << 30);
  EXPECT_EQ(c.tp.size, 1);
  EXPECT_EQ(c.kv.store, "kv_bf16_paged");
  EXPECT_EQ(c.attention.backend, "attn_cpu");
  EXPECT_DOUBLE_EQ(c.scheduler.mem_fraction_static, 0.88);
  EXPECT_EQ(c.scheduler.page_size, 16);
  EXPECT_EQ(c.scheduler.chunked_prefill_size, 2048);
  EXPECT_EQ(c.scheduler.max_running_requests, 256);
  EXPECT_EQ(c.scheduler.max_prefill_tokens, 16384);
  EXPECT_EQ(c.scheduler.num_continuous_decode_steps, 1);
  EXPECT_DOUBLE_EQ(c.scheduler.new_token_ratio, 0.7);
  EXPECT_DOUBLE_EQ(c.scheduler.new_token_ratio_decay, 0.001);
  EXPECT_DOUBLE_EQ(c.scheduler.min_new_token_ratio, 0.1);
  EXPECT_EQ(c.scheduler.max_new_tokens_clip, 4096);
  EXPECT_EQ(c.scheduler.schedule_policy, "fcfs");
  EXPECT_EQ(c.scheduler.log_interval, 40);
  EXPECT_EQ(c.scheduler.tier_min_load_pages, 1);
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.port, 30000);
  EXPECT_TRUE(c.plugin_paths.empty());
  // The effective table carries the defaults too, for whoever reads it rather than the fields.
  EXPECT_EQ(c.table()["scheduler"]["page_size"].value<int64_t>(), 16);
  EXPECT_EQ(c.table()["device"]["memory"].value<std::string>(), "2GiB");
  EXPECT_TRUE(c.table()["plugins"]["path"].is_array());
}

TEST(ConfigLoad, FileValuesReachTheTypedFieldsAndTheRestStayDefault) {
  Config c = Load(R"(
[model]
preset = "llama3-8b-shape"
dtype = "bf16"
[device]
kind = "cuda"
ordinal = 3
memory = "24GiB"
[tp]
size = 8
[scheduler]
mem_fraction_static = 0.9
page_size = 64
chunked_prefill_size = -1
schedule_policy = "lpm"
[server]
port = 8080
[plugins]
path = ["/opt/kvrt/plugins", "build/bin"]
)");
  EXPECT_EQ(c.source, "configs/x.toml");
  EXPECT_EQ(c.model.preset, "llama3-8b-shape");
  EXPECT_EQ(c.model.dtype, "bf16");
  EXPECT_EQ(c.device.kind, "cuda");
  EXPECT_EQ(c.device.ordinal, 3);
  EXPECT_EQ(c.device.memory_bytes, uint64_t{24} << 30);
  EXPECT_EQ(c.tp.size, 8);
  EXPECT_DOUBLE_EQ(c.scheduler.mem_fraction_static, 0.9);
  EXPECT_EQ(c.scheduler.page_size, 64);
  EXPECT_EQ(c.scheduler.chunked_prefill_size, -1);  // chunking off
  EXPECT_EQ(c.scheduler.schedule_policy, "lpm");
  EXPECT_EQ(c.scheduler.max_running_requests, 256);
  EXPECT_EQ(c.server.port, 8080);
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.plugin_paths, (std::vector<std::string>{"/opt/kvrt/plugins", "build/bin"}));
}

TEST(ConfigLoad, IntegerIsAcceptedWhereANumberIsExpected) {
  Config c = Load("[scheduler]\nnew_token_ratio = 1\n");
  EXPECT_DOUBLE_EQ(c.scheduler.new_token_ratio, 1.0);
  // table() agrees with the field: a float, so plugins reading it see one type.
  EXPECT_TRUE(c.table()["scheduler"]["new_token_ratio"].is_floating_point());
}

TEST(ConfigErrors, SyntaxErrorNamesFileLineAndColumn) {
  std::string e = Error("[tp]\nsize = \n");
  EXPECT_EQ(e.rfind("configs/x.toml:2:8: ", 0), 0u) << e;
  EXPECT_NE(e.find("expected value"), std::string::npos) << e;
}

TEST(ConfigErrors, UnknownSectionSuggestsTheCloseOne) {
  EXPECT_EQ(Error("[tp]\nsize = 2\n[schedular]\npage_size = 16\n"),
            "configs/x.toml:3:1: unknown key 'schedular' (did you mean 'scheduler'?)");
}

TEST(ConfigErrors, UnknownKeyInSectionSuggestsTheCloseOne) {
  EXPECT_EQ(Error("[scheduler]\npgae_size = 16\n"),
            "configs/x.toml:2:1: unknown key 'scheduler.pgae_size' (did you mean "
            "'scheduler.page_size'?)");
  EXPECT_EQ(Error("[kv]\nstor = \"kv_fp8_e4m3\"\n"),
            "configs/x.toml:2:1: unknown key 'kv.stor' (did you mean 'kv.store'?)");
}

TEST(ConfigErrors, KeyUnderTheWrongHeaderNamesWhereItBelongs) {
  EXPECT_EQ(Error("[scheduler]\nport = 8080\n"),
            "configs/x.toml:2:1: unknown key 'scheduler.port' (did you mean 'server.port'?)");
  // Above every header.
  EXPECT_EQ(Error("page_size = 16\n"),
            "configs/x.toml:1:1: unknown key 'page_size' (did you mean 'scheduler.page_size'?)");
}

TEST(ConfigErrors, UnknownKeyWithNothingCloseListsTheKnownOnes) {
  EXPECT_EQ(Error("[server]\nworkers = 4\n"),
            "configs/x.toml:2:1: unknown key 'server.workers' (known: host, port, "
            "network_threads, max_queued_requests, max_connections, max_body_bytes, "
            "request_timeout_s, stream_interval, header_timeout_s, body_timeout_s, "
            "idle_timeout_s, shutdown_grace_s, api_key, record_trace, chat_template, "
            "incremental_streaming_output, metric_names)");
  EXPECT_EQ(Error("[attention]\nthreads = 4\n"),
            "configs/x.toml:2:1: unknown key 'attention.threads' (known: backend, "
            "[attention.<plugin>])");
}

TEST(ConfigErrors, WrongTypeNamesKeyExpectedTypeAndFoundValue) {
  EXPECT_EQ(Error("[tp]\nsize = \"two\"\n"),
            "configs/x.toml:2:8: tp.size: expected an integer, found string \"two\"");
  // A float is not silently truncated into an integer key.
  EXPECT_EQ(Error("[scheduler]\npage_size = 16.0\n"),
            "configs/x.toml:2:13: scheduler.page_size: expected an integer, found float 16.0");
  EXPECT_EQ(Error("[kv]\nstore = 5\n"),
            "configs/x.toml:2:9: kv.store: expected a string, found integer 5");
  EXPECT_EQ(Error("tp = 2\n"), "configs/x.toml:1:1: tp: expected a table, found integer 2");
}

TEST(ConfigErrors, OutOfRangeValuesSayWhatIsAllowed) {
  EXPECT_EQ(Error("[scheduler]\npage_size = 48\n"),
            "configs/x.toml:2:13: scheduler.page_size: expected a power of two between 1 and "
            "1024, found 48");
  EXPECT_EQ(Error("[scheduler]\nmem_fraction_static = 1.2\n"),
            "configs/x.toml:2:23: scheduler.mem_fraction_static: expected a number in (0, 1), "
            "found 1.2");
  EXPECT_EQ(Error("[scheduler]\nmem_fraction_static = 0\n"),
            "configs/x.toml:2:23: scheduler.mem_fraction_static: expected a number in (0, 1), "
            "found 0");
  EXPECT_EQ(Error("[scheduler]\nnew_token_ratio = 1.5\n"),
            "configs/x.toml:2:19: scheduler.new_token_ratio: expected a number in (0, 1], "
            "found 1.5");
  EXPECT_EQ(Error("[tp]\nsize = 16\n"),
            "configs/x.toml:2:8: tp.size: expected an integer between 1 and 8, found 16");
  EXPECT_EQ(Error("[server]\nport = 70000\n"),
            "configs/x.toml:2:8: server.port: expected a port between 1 and 65535, or 0 for any "
            "free port, found 70000");
  EXPECT_EQ(Error("[scheduler]\nmax_running_requests = 0\n"),
            "configs/x.toml:2:24: scheduler.max_running_requests: expected an integer >= 1, "
            "found 0");
  EXPECT_EQ(Error("[scheduler]\nchunked_prefill_size = 0\n"),
            "configs/x.toml:2:24: scheduler.chunked_prefill_size: expected an integer >= 1, or "
            "-1 to disable chunking, found 0");
  EXPECT_EQ(Error("[model]\ndtype = \"fp16\"\n"),
            "configs/x.toml:2:9: model.dtype: expected one of \"bf16\", \"f32\", \"auto\", found "
            "\"fp16\"");
  EXPECT_EQ(Error("[scheduler]\nschedule_policy = \"lifo\"\n"),
            "configs/x.toml:2:19: scheduler.schedule_policy: expected one of \"fcfs\", \"lpm\", "
            "found \"lifo\"");
  EXPECT_EQ(Error("[kv]\nstore = \"\"\n"),
            "configs/x.toml:2:9: kv.store: expected a non-empty string, found \"\"");
}

TEST(ConfigErrors, MinRatioAboveStartingRatioIsRejected) {
  EXPECT_EQ(Error("[scheduler]\nnew_token_ratio = 0.5\nmin_new_token_ratio = 0.6\n"),
            "configs/x.toml:3:23: scheduler.min_new_token_ratio: expected a number <= "
            "scheduler.new_token_ratio (0.5), found 0.6");
}

TEST(ConfigErrors, PluginPathsMustBeStrings) {
  EXPECT_EQ(Error("[plugins]\npath = [\"a\", 3]\n"),
            "configs/x.toml:2:8: plugins.path: expected an array of strings, found integer 3 "
            "at index 1");
  EXPECT_EQ(Error("[plugins]\npath = \"a\"\n"),
            "configs/x.toml:2:8: plugins.path: expected an array of strings, found string "
            "\"a\"");
}

TEST(ConfigErrors, TheFirstErrorInFileOrderIsReported) {
  // [attention] sorts before [server] in the table, but the user reads top to bottom.
  EXPECT_EQ(Error("[server]\nport = -1\n[attention]\nbakend = \"x\"\n"),
            "configs/x.toml:2:8: server.port: expected a port between 1 and 65535, or 0 for any "
            "free port, found -1");
}

TEST(ConfigMemory, SizesWithUnits) {
  EXPECT_EQ(parse_size("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parse_size("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(parse_size("1.5GB"), uint64_t{1500000000});
  EXPECT_EQ(parse_size("800M"), uint64_t{800} << 20);  // bare M is 1024-based
  EXPECT_EQ(parse_size("800MB"), uint64_t{800000000});
  EXPECT_EQ(parse_size("4KiB"), uint64_t{4096});
  EXPECT_EQ(parse_size("4kb"), uint64_t{4000});  // units are case-insensitive
  EXPECT_EQ(parse_size("2 GiB"), uint64_t{2} << 30);
  EXPECT_EQ(parse_size("1TiB"), uint64_t{1} << 40);
  EXPECT_EQ(parse_size("4096"), uint64_t{4096});
  EXPECT_EQ(parse_size("100B"), uint64_t{100});
  EXPECT_EQ(parse_size("0.5KiB"), uint64_t{512});
  EXPECT_EQ(parse_size("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "GiB", "2XB", "two GiB", "-1GiB", "1.2.3G", ".", "1e9",
                          "18446744073709551616", "20000000000GiB"}) {
    EXPECT_EQ(parse_size(bad), std::nullopt) << bad;
  }
}

TEST(ConfigMemory, DeviceMemoryAcceptsSizesAndByteCounts) {
  EXPECT_EQ(Load("[device]\nmemory = \"1.5GB\"\n").device.memory_bytes, uint64_t{1500000000});
  EXPECT_EQ(Load("[device]\nmemory = \"512MiB\"\n").device.memory_bytes, uint64_t{512} << 20);
  Config bytes = Load("[device]\nmemory = 1073741824\n");
  EXPECT_EQ(bytes.device.memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(bytes.device.memory, "1073741824");
}

TEST(ConfigMemory, BadSizesAreErrors) {
  const std::string expected =
      "expected a size > 0 such as \"2GiB\", \"512MiB\", \"1.5GB\" or a number of bytes";
  EXPECT_EQ(Error("[device]\nmemory = \"2XB\"\n"),
            "configs/x.toml:2:10: device.memory: " + expected + ", found \"2XB\"");
  EXPECT_EQ(Error("[device]\nmemory = \"0GiB\"\n"),
            "configs/x.toml:2:10: device.memory: " + expected + ", found \"0GiB\"");
  EXPECT_EQ(Error("[device]\nmemory = -5\n"),
            "configs/x.toml:2:10: device.memory: " + expected + ", found -5");
  EXPECT_EQ(Error("[device]\nmemory = 2.5\n"),
            "configs/x.toml:2:10: device.memory: " + expected + ", found float 2.5");
}

TEST(ConfigOverrides, ValuesAreReadAsTomlOrAsBareStrings) {
  Config c = Load("[scheduler]\npage_size = 32\n",
                  {"scheduler.mem_fraction_static=0.9", "scheduler.page_size=64",
                   "kv.store=kv_fp8_e4m3", "device.memory=24GiB", "model.path=\"/m/x y\"",
                   "plugins.path=[\"a\", \"b\"]", " tp.size = 2 "});
  EXPECT_DOUBLE_EQ(c.scheduler.mem_fraction_static, 0.9);
  EXPECT_EQ(c.scheduler.page_size, 64);  // the override beats the file
  EXPECT_EQ(c.kv.store, "kv_fp8_e4m3");  // not TOML, so a bare string
  EXPECT_EQ(c.device.memory_bytes, uint64_t{24} << 30);
  EXPECT_EQ(c.model.path, "/m/x y");
  EXPECT_EQ(c.plugin_paths, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.tp.size, 2);
}

TEST(ConfigOverrides, DeepPluginKeysLandInThePluginTable) {
  Config c = Load("[kv.kv_fp8_e4m3]\ncalibrate = true\n",
                  {"kv.kv_fp8_e4m3.scale_mode=per_tensor", "attention.attn_cpu.threads=4"});
  const toml::table* fp8 = c.plugin_table("kv", "kv_fp8_e4m3");
  ASSERT_NE(fp8, nullptr);
  EXPECT_EQ((*fp8)["scale_mode"].value<std::string>(), "per_tensor");
  EXPECT_EQ((*fp8)["calibrate"].value<bool>(), true);  // the file's keys are kept
  const toml::table* attn = c.plugin_table("attention", "attn_cpu");
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ((*attn)["threads"].value<int64_t>(), 4);
}

TEST(ConfigOverrides, AnOverrideCanFixABadFileValue) {
  Config c = Load("[scheduler]\npage_size = 48\n", {"scheduler.page_size=32"});
  EXPECT_EQ(c.scheduler.page_size, 32);
}

TEST(ConfigOverrides, MalformedOverridesAreNamed) {
  EXPECT_EQ(Error("", {"kvstore"}), "--set kvstore: expected section.key=value");
  EXPECT_EQ(Error("", {"=3"}), "--set =3: expected section.key=value");
  std::string e = Error("", {"a..b=1"});
  EXPECT_EQ(e.rfind("--set a..b=1: bad key 'a..b': ", 0), 0u) << e;
  e = Error("", {"model.preset=\xff"});  // not UTF-8: the value, not the key, is at fault
  EXPECT_EQ(e.rfind("--set model.preset=\xff: ", 0), 0u) << e;
  EXPECT_EQ(e.find("bad key"), std::string::npos) << e;
}

TEST(ConfigOverrides, OverrideValuesAreValidatedLikeFileValues) {
  EXPECT_EQ(Error("", {"tp.size=two"}),
            "--set tp.size=two: tp.size: expected an integer, found string \"two\"");
  EXPECT_EQ(Error("", {"scheduler.page_size=48"}),
            "--set scheduler.page_size=48: scheduler.page_size: expected a power of two between "
            "1 and 1024, found 48");
  EXPECT_EQ(Error("", {"schedular.page_size=16"}),
            "--set schedular.page_size=16: unknown key 'schedular' (did you mean 'scheduler'?)");
  EXPECT_EQ(Error("[scheduler]\npage_size = 16\n", {"scheduler.page_sise=16"}),
            "--set scheduler.page_sise=16: unknown key 'scheduler.page_sise' (did you mean "
            "'scheduler.page_size'?)");
  EXPECT_EQ(Error("", {"kv.store="}),
            "--set kv.store=: kv.store: expected a non-empty string, found \"\"");
}

TEST(ConfigOverrides, FileErrorsComeFirstThenOverridesInTheOrderGiven) {
  EXPECT_EQ(Error("[tp]\nsize = 9\n", {"server.port=0"}),
            "configs/x.toml:2:8: tp.size: expected an integer between 1 and 8, found 9");
  EXPECT_EQ(Error("", {"tp.size=9", "attention.backend=1"}),
            "--set tp.size=9: tp.size: expected an integer between 1 and 8, found 9");
}

TEST(ConfigToToml, RoundTripGivesTheSameEffectiveValues) {
  Config c = Load(R"(
[device]
memory = "1.5GB"
[kv]
store = "kv_fp8_e4m3"
[kv.kv_fp8_e4m3]
scale_mode = "per_tensor"
margin = 0.1
[kv.kv_fp8_e4m3.calibration]
samples = 64
[attention.attn_cpu]
threads = 4
[scheduler]
new_token_ratio = 0.3
min_new_token_ratio = 0.05
[plugins]
path = ["a \"quoted\" dir"]
)",
                  {"server.host=0.0.0.0"});
  std::string text = to_toml(c);
  Result<Config> back = load_string(text, "roundtrip.toml", {});
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << text;
  const Config& b = back.value();
  EXPECT_EQ(b.device.memory, "1.5GB");
  EXPECT_EQ(b.device.memory_bytes, uint64_t{1500000000});
  EXPECT_EQ(b.kv.store, "kv_fp8_e4m3");
  EXPECT_DOUBLE_EQ(b.scheduler.new_token_ratio, 0.3);
  EXPECT_DOUBLE_EQ(b.scheduler.min_new_token_ratio, 0.05);
  EXPECT_EQ(b.server.host, "0.0.0.0");
  EXPECT_EQ(b.plugin_paths, c.plugin_paths);
  ASSERT_NE(b.plugin_table("kv", "kv_fp8_e4m3"), nullptr);
  EXPECT_EQ((*b.plugin_table("kv", "kv_fp8_e4m3"))["calibration"]["samples"].value<int64_t>(), 64);
  EXPECT_EQ((*b.plugin_table("attention", "attn_cpu"))["threads"].value<int64_t>(), 4);
  // Same text again, apart from the source line: nothing drifted.
  auto body = [](const std::string& s) { return s.substr(s.find('\n')); };
  EXPECT_EQ(body(to_toml(b)), body(text));
}

TEST(ConfigToToml, InlinePluginTablesReadBack) {
  Config c = Load("kv = { store = \"p\", p = { a = 1, n = { b = 2 } } }\n");
  Result<Config> back = load_string(to_toml(c), "roundtrip.toml", {});
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << to_toml(c);
  ASSERT_NE(back->plugin_table("kv", "p"), nullptr);
  EXPECT_EQ((*back->plugin_table("kv", "p"))["n"]["b"].value<int64_t>(), 2);
}

TEST(ConfigToToml, ShowsEveryKeyInSectionOrderWithShortNumbers) {
  std::string text = to_toml(defaults().value());
  EXPECT_NE(text.find("[model]\npreset = \"synth-76m\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("new_token_ratio = 0.7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("mem_fraction_static = 0.88\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[plugins]\npath = []\n"), std::string::npos) << text;
  EXPECT_LT(text.find("[model]"), text.find("[device]"));
  EXPECT_LT(text.find("[scheduler]"), text.find("[server]"));
}

TEST(ConfigPluginTable, GivesThePluginsOwnTableOrNull) {
  Config c = Load("[kv]\nstore = \"kv_fp8_e4m3\"\n[kv.kv_fp8_e4m3]\nscale_mode = \"x\"\n");
  ASSERT_NE(c.plugin_table("kv", "kv_fp8_e4m3"), nullptr);
  EXPECT_EQ(c.plugin_table("kv", "kv_bf16_paged"), nullptr);  // no table: plugin defaults
  EXPECT_EQ(c.plugin_table("kv", "store"), nullptr);          // a key, not a plugin
  EXPECT_EQ(c.plugin_table("nope", "x"), nullptr);
  EXPECT_EQ(Config{}.plugin_table("kv", "x"), nullptr);  // no table loaded at all
}

TEST(ConfigPluginTable, PositionsSurviveCopiesForLaterPluginErrors) {
  Result<Config> r = load_string("[kv]\nstore = \"p\"\n[kv.p]\nscale_mod = 1\n", "cfg.toml", {});
  ASSERT_TRUE(r.ok());
  Config copy = r.value();  // toml++ drops positions when it copies nodes; the table is shared
  const std::vector<KeySpec> keys = {{"scale_mode", KeySpec::Type::kString, "how"}};
  Status s = validate_keys(*copy.plugin_table("kv", "p"), keys, copy.source, "kv.p");
  EXPECT_EQ(s.message(),
            "cfg.toml:4:1: unknown key 'kv.p.scale_mod' (did you mean 'kv.p.scale_mode'?)");
}

TEST(ValidateKeys, ChecksNamesAndTypes) {
  const std::vector<KeySpec> keys = {
      {"mode", KeySpec::Type::kString, ""}, {"blocks", KeySpec::Type::kInt, ""},
      {"scale", KeySpec::Type::kFloat, ""}, {"pin", KeySpec::Type::kBool, ""},
      {"extra", KeySpec::Type::kTable, ""}, {"dirs", KeySpec::Type::kStringArray, ""}};
  auto check = [&](std::string_view text) {
    toml::table t = toml::parse(text, std::string_view("p.toml"));
    return validate_keys(t, keys, "p.toml", "kv.p").message();
  };
  EXPECT_EQ(check("mode = 'a'\nblocks = 2\nscale = 1\npin = true\nextra = {}\ndirs = ['x']\n"),
            "");  // an integer passes as a float
  EXPECT_EQ(check("blocks = 2\nmdoe = 'a'\n"),
            "p.toml:2:1: unknown key 'kv.p.mdoe' (did you mean 'kv.p.mode'?)");
  EXPECT_EQ(check("zzz = 1\n"),
            "p.toml:1:1: unknown key 'kv.p.zzz' (known: mode, blocks, scale, pin, extra, dirs)");
  EXPECT_EQ(check("blocks = 2.5\n"),
            "p.toml:1:10: kv.p.blocks: expected an integer, found float 2.5");
  EXPECT_EQ(check("scale = 'x'\n"),
            "p.toml:1:9: kv.p.scale: expected a number, found string \"x\"");
  EXPECT_EQ(check("pin = 1\n"), "p.toml:1:7: kv.p.pin: expected a boolean, found integer 1");
  EXPECT_EQ(check("extra = 1\n"), "p.toml:1:9: kv.p.extra: expected a table, found integer 1");
  EXPECT_EQ(check("dirs = ['a', false]\n"),
            "p.toml:1:8: kv.p.dirs: expected an array of strings, found boolean false at index 1");
  // Reported in file order, not key order.
  EXPECT_EQ(check("scale = 'x'\nblocks = 'y'\n"),
            "p.toml:1:9: kv.p.scale: expected a number, found string \"x\"");
  toml::table empty_plugin = toml::parse(std::string_view("a = 1\n"), std::string_view("q.toml"));
  EXPECT_EQ(validate_keys(empty_plugin, {}, "q.toml", "kv.q").message(),
            "q.toml:1:1: unknown key 'kv.q.a' (no keys are accepted here)");
}

TEST(ValidateKeys, PluginKeysFromOverridesNameTheOverride) {
  Config c = Load("", {"kv.p.scale_mod=per_tensor"});
  Status s = validate_keys(*c.plugin_table("kv", "p"), {{"scale_mode", KeySpec::Type::kString, ""}},
                           c.source, "kv.p");
  EXPECT_EQ(s.message(),
            "--set kv.p.scale_mod=per_tensor: unknown key 'kv.p.scale_mod' (did you mean "
            "'kv.p.scale_mode'?)");
}

TEST(Suggest, FindsCloseNamesOnly) {
  const std::vector<std::string> known = {"scheduler", "server", "tp", "kv"};
  EXPECT_EQ(suggest("schedular", known), "scheduler");
  EXPECT_EQ(suggest("sheduler", known), "scheduler");
  EXPECT_EQ(suggest("Scheduler", known), "scheduler");  // case does not count
  EXPECT_EQ(suggest("sevrer", known), "server");        // a swap is one edit
  EXPECT_EQ(suggest("tpp", known), "tp");
  EXPECT_EQ(suggest("xy", known), "");  // two edits from "tp" and "kv", but too short to guess
  EXPECT_EQ(suggest("database", known), "");
  EXPECT_EQ(suggest("x", {}), "");
}

TEST(ConfigFiles, MissingFileSaysSo) {
  Result<Config> r = load_file("nope.toml", {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsConfigError());
  EXPECT_EQ(r.status().message(),
            "nope.toml: cannot open the configuration file: No such file or directory");
  Result<Config> dir = load_file(kData, {});
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().message(), kData + ": cannot read the configuration file: Is a directory");
}

// An endless file (/dev/zero) is read only up to the configuration's limit, then refused with the
// limit named; nothing escapes as std::bad_alloc.
TEST(ConfigFiles, EndlessFileIsRefusedAtItsLimit) {
  Result<Config> r = load_file("/dev/zero", {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsConfigError());
  EXPECT_EQ(r.status().message(),
            "/dev/zero: the configuration file is larger than kvrt's limit of 4 MiB for it");
}

// [plugins] verify is a boolean key like the others, and to_toml writes it back.
TEST(ConfigFiles, PluginsVerifyIsABoolean) {
  Result<Config> on = load_string("[plugins]\nverify = true\n", "v.toml", {});
  ASSERT_TRUE(on.ok()) << on.status().message();
  EXPECT_TRUE(on->verify_plugins);
  EXPECT_NE(to_toml(*on).find("verify = true"), std::string::npos);
  Result<Config> bad = load_string("", "<defaults>", {"plugins.verify=1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("plugins.verify"), std::string::npos)
      << bad.status().message();
}

TEST(ConfigFiles, FixtureFilesLoadAndFailWithTheirPath) {
  Result<Config> ok = load_file(kData + "tp2_fp8.toml", {"tp.size=4"});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->source, kData + "tp2_fp8.toml");
  EXPECT_EQ(ok->tp.size, 4);
  EXPECT_EQ(ok->kv.store, "kv_fp8_e4m3");
  EXPECT_NE(ok->plugin_table("kv", "kv_fp8_e4m3"), nullptr);
  Result<Config> bad = load_file(kData + "bad_page_size.toml", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            kData +
                "bad_page_size.toml:5:13: scheduler.page_size: expected a power of two "
                "between 1 and 1024, found 48");
}

// configs/default.toml is what users copy: it must list every key at its real default.
TEST(ConfigFiles, DefaultTomlListsEveryKeyAtItsDefault) {
  Result<Config> file = load_file(kSourceDir + "/configs/default.toml", {});
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto body = [](const std::string& s) { return s.substr(s.find('\n')); };
  EXPECT_EQ(body(to_toml(file.value())), body(to_toml(defaults().value())));
  toml::table raw = toml::parse_file(kSourceDir + "/configs/default.toml");
  const Config all = defaults().value();
  for (auto&& [section, keys] : all.table()) {
    for (auto&& [key, value] : *keys.as_table()) {
      EXPECT_TRUE(raw[section.str()][key.str()]) << section.str() << "." << key.str();
    }
  }
}

TEST(ConfigFiles, CapacityDemoLoads) {
  Result<Config> demo = load_file(kSourceDir + "/configs/capacity-demo.toml", {});
  ASSERT_TRUE(demo.ok()) << demo.status().message();
  EXPECT_EQ(demo->device.memory_bytes, uint64_t{24} << 30);
  EXPECT_DOUBLE_EQ(demo->scheduler.mem_fraction_static, 0.88);
  EXPECT_EQ(demo->scheduler.page_size, 16);
  EXPECT_EQ(demo->model.preset, "llama3-8b-shape");
}

}  // namespace
}  // namespace kvrt::config
