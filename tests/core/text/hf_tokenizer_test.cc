// tokenizer.json: every id and every decoded text equal to the references in
// tests/data/tokenizers (Hugging Face's tokenizers, as Python transformers runs them, checked
// against transformers.js; see generate.mjs there), on three released byte-level tokenizers, a
// SentencePiece-derived one and synthetic variants of the constructs they lack. Also what is
// refused, and how a directory's tokenizer is chosen.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/text/tokenizer.h"
#include "core/text/tokenizer_json.h"
#include "core/util/file.h"
#include "tests/core/text/tokenizer_test_files.h"

namespace kvrt::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test_support::shorten;
using test_support::source_dir;
using test_support::TempDir;
using ::testing::HasSubstr;

// A test data file's bytes (util::read_file, bounded as any file kvrt reads).
std::string read_text(const fs::path& path) {
  return util::read_file(path.string(), kTokenizerFile).value();
}

// One fixture of tests/data/tokenizers: its tokenizer.json (with the fixture's overrides
// applied), loaded once, and the reference cases.
struct Reference {
  std::unique_ptr<Tokenizer> tokenizer;
  json fixture;
  std::string skip;  // why the test cannot run, or ""
};

Reference load_reference(const std::string& name) {
  Reference r;
  if (source_dir().empty()) {
    r.skip = "KVRT_SOURCE_DIR is not set";
    return r;
  }
  const fs::path data = fs::path(source_dir()) / "tests" / "data" / "tokenizers";
  r.fixture = json::parse(read_text(data / (name + ".json")));
  const std::string files = r.fixture["tokenizer_files"].get<std::string>();
  const fs::path dir = fs::path(source_dir()) / files;
  if (!fs::exists(dir / "tokenizer.json")) {
    r.skip = (dir / "tokenizer.json").string() + " is absent (the shared tokenizers sit in " +
             "../shared/tokenizers beside the repository)";
    return r;
  }
  const std::string json_path = (dir / "tokenizer.json").string();
  const std::string config_path = (dir / "tokenizer_config.json").string();
  Result<std::unique_ptr<Tokenizer>> tok = Status::Internal("not loaded");
  if (r.fixture["overrides"].empty()) {
    tok = load_hf_tokenizer(json_path, config_path);
  } else {
    json tokenizer_json = json::parse(read_text(json_path));
    for (const auto& [key, value] : r.fixture["overrides"].items()) tokenizer_json[key] = value;
    Result<TokenizerConfig> config = read_tokenizer_config(config_path);
    if (!config.ok()) {
      ADD_FAILURE() << config.status().message();
      return r;
    }
    tok = parse_hf_tokenizer(tokenizer_json.dump(), *config, json_path);
  }
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (tok.ok()) r.tokenizer = std::move(*tok);
  return r;
}

// Every encode and decode case of the fixture; threads > 1 runs the encodes from that many
// threads at once (the tokenizer's cache is shared).
void check_reference(const Reference& r, int threads = 1) {
  const Tokenizer& t = *r.tokenizer;
  const std::string name = r.fixture["tokenizer"].get<std::string>();
  const json& encode = r.fixture["encode"];
  ASSERT_GE(encode.size(), 40u);
  // gtest's assertions may be used from several threads.
  auto run_encodes = [&] {
    for (const json& c : encode) {
      const std::string text = c["text"].get<std::string>();
      EXPECT_EQ(t.encode(text, false), c["ids"].get<std::vector<int32_t>>())
          << name << ": \"" << shorten(text) << "\"";
      EXPECT_EQ(t.encode(text, true), c["ids_with_special"].get<std::vector<int32_t>>())
          << name << " with special tokens: \"" << shorten(text) << "\"";
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(run_encodes);
  run_encodes();
  for (std::thread& th : pool) th.join();
  const json& decode = r.fixture["decode"];
  ASSERT_GE(decode.size(), 40u);
  int replacement = 0;
  for (const json& c : decode) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    DecodeOptions options;
    options.skip_special_tokens = c["skip_special_tokens"].get<bool>();
    const std::string want = c["text"].get<std::string>();
    EXPECT_EQ(t.decode(ids, options), want) << name << ": " << c["ids"].dump();
    if (options.skip_special_tokens) {
      EXPECT_EQ(t.decode(ids), want);
    }
    replacement += want.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(replacement, 0) << "no case decodes a split character";
}

// Loads the fixture's tokenizer into r, or skips the test saying why.
#define LOAD_REFERENCE(r, name)                \
  const Reference r = load_reference(name);    \
  if (!r.skip.empty()) GTEST_SKIP() << r.skip; \
  ASSERT_NE(r.tokenizer, nullptr)

TEST(HfTokenizerReference, Qwen3) {
  LOAD_REFERENCE(r, "qwen3");
  check_reference(r, /*threads=*/4);
  // Text that is not UTF-8 reads as U+FFFD, as the reference's Unicode strings would hold it.
  const Tokenizer& t = *r.tokenizer;
  EXPECT_EQ(t.encode("a\xFF"
                     "b",
                     false),
            t.encode("a\xEF\xBF\xBD"
                     "b",
                     false));
  EXPECT_EQ(t.decode(t.encode("a\xC3"
                              "b",
                              false)),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(t.bos_id(), -1);      // bos_token null
  EXPECT_EQ(t.eos_id(), 151645);  // <|im_end|>
}

TEST(HfTokenizerReference, Llama31) {
  LOAD_REFERENCE(r, "llama-3.1");
  check_reference(r);
  EXPECT_EQ(r.tokenizer->bos_id(), 128000);
  EXPECT_EQ(r.tokenizer->eos_id(), 128009);  // <|eot_id|>
}

TEST(HfTokenizerReference, DeepSeekV3) {
  LOAD_REFERENCE(r, "deepseek-v3");
  check_reference(r);
  const Tokenizer& t = *r.tokenizer;
  EXPECT_EQ(t.bos_id(), 0);  // <｜begin▁of▁sentence｜>, from tokenizer_config.json's object
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_FALSE(t.is_special(100));
  EXPECT_EQ(t.vocab_size(), 128815);
  EXPECT_EQ(t.piece(0), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(t.piece(128815), "");
}

TEST(HfTokenizerReference, MistralSentencePieceDerived) {
  LOAD_REFERENCE(r, "mistral");
  check_reference(r);
  EXPECT_EQ(r.tokenizer->piece(13), "<0x0A>");
}

TEST(HfTokenizerReference, MistralMetaspacePreTokenizer) {
  LOAD_REFERENCE(r, "mistral-metaspace");
  check_reference(r);
}

// Small variants of one synthetic BPE model, each exercising constructs the released files do
// not use; the references come from Hugging Face's tokenizers.
TEST(HfTokenizerReference, SyntheticVariants) {
  if (source_dir().empty()) GTEST_SKIP() << "KVRT_SOURCE_DIR is not set";
  const json fixture = json::parse(
      read_text(fs::path(source_dir()) / "tests" / "data" / "tokenizers" / "synthetic.json"));
  ASSERT_GE(fixture["variants"].size(), 20u);
  for (const json& variant : fixture["variants"]) {
    const std::string name = variant["name"].get<std::string>();
    json tokenizer_json = fixture["base"];
    for (const auto& [key, value] : variant["overrides"].items()) tokenizer_json[key] = value;
    Result<std::unique_ptr<Tokenizer>> tok =
        parse_hf_tokenizer(tokenizer_json.dump(), TokenizerConfig{}, name);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    for (const json& c : variant["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ((*tok)->encode(text, false), ids) << name << ": \"" << text << "\"";
      EXPECT_EQ((*tok)->decode(ids, DecodeOptions{false}), c["decoded"].get<std::string>())
          << name << ": \"" << text << "\"";
      EXPECT_EQ((*tok)->decode(ids), c["decoded_skipping_special"].get<std::string>())
          << name << ": \"" << text << "\"";
    }
  }
}

// ---- Refusals ----

// A minimal valid tokenizer.json to break one part of.
json minimal_tokenizer() {
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr},
              {"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                {"merges", json::array({"a b"})}}}};
}

Status parse_error(const json& j) {
  Result<std::unique_ptr<Tokenizer>> tok = parse_hf_tokenizer(j.dump(), {}, "x/tokenizer.json");
  return tok.ok() ? Status::Ok() : tok.status();
}

TEST(HfTokenizerRefusal, MinimalLoadsAndMerges) {
  Result<std::unique_ptr<Tokenizer>> tok =
      parse_hf_tokenizer(minimal_tokenizer().dump(), {}, "minimal");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->encode("abba", false), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ((*tok)->decode(std::vector<int32_t>{2, 1}), "ab b");  // no decoder: joined by spaces
}

TEST(HfTokenizerRefusal, UnknownModelTypeNamesTheKey) {
  json j = minimal_tokenizer();
  j["model"]["type"] = "WordPiece";
  const Status s = parse_error(j);
  EXPECT_EQ(s.code(), Status::Code::kUnsupported);
  EXPECT_THAT(s.message(), HasSubstr("x/tokenizer.json: model.type \"WordPiece\""));
}

TEST(HfTokenizerRefusal, UnknownComponentsNameTheirKey) {
  struct Case {
    const char* key;
    json value;
    const char* expected;
  };
  const Case cases[] = {
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Digits"}}, {{"type", "BertPreTokenizer"}}})}},
       "pre_tokenizer.pretokenizers[1].type \"BertPreTokenizer\""},
      {"normalizer", {{"type", "BertNormalizer"}}, "normalizer.type \"BertNormalizer\""},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", json::array({{{"type", "WordPiece"}}})}},
       "decoder.decoders[0].type \"WordPiece\""},
      {"post_processor", {{"type", "ClsProcessing"}}, "post_processor.type \"ClsProcessing\""},
  };
  for (const Case& c : cases) {
    json j = minimal_tokenizer();
    j[c.key] = c.value;
    const Status s = parse_error(j);
    EXPECT_EQ(s.code(), Status::Code::kUnsupported) << c.key;
    EXPECT_THAT(s.message(), HasSubstr(c.expected));
  }
}

TEST(HfTokenizerRefusal, MalformedPartsNameTheirKey) {
  json bad_regex = minimal_tokenizer();
  bad_regex["pre_tokenizer"] = {{"type", "Split"},
                                {"pattern", {{"Regex", "(unclosed"}}},
                                {"behavior", "Isolated"},
                                {"invert", false}};
  EXPECT_THAT(parse_error(bad_regex).message(), HasSubstr("pre_tokenizer.pattern.Regex"));
  json bad_behavior = bad_regex;
  bad_behavior["pre_tokenizer"]["pattern"] = {{"String", " "}};
  bad_behavior["pre_tokenizer"]["behavior"] = "Sideways";
  EXPECT_THAT(parse_error(bad_behavior).message(), HasSubstr("pre_tokenizer.behavior"));
  json bad_merge = minimal_tokenizer();
  bad_merge["model"]["merges"] = json::array({"a c"});
  EXPECT_THAT(parse_error(bad_merge).message(), HasSubstr("model.merges[0]"));
  json dropout = minimal_tokenizer();
  dropout["model"]["dropout"] = 0.1;
  EXPECT_THAT(parse_error(dropout).message(), HasSubstr("model.dropout"));
  EXPECT_THAT(parse_error(json::array()).message(), HasSubstr("x/tokenizer.json"));
  EXPECT_THAT(parse_hf_tokenizer("{", {}, "y/tokenizer.json").status().message(),
              HasSubstr("y/tokenizer.json: not valid JSON"));
}

TEST(HfTokenizerRefusal, ConfigTokenMustExist) {
  TokenizerConfig config;
  config.bos_token = "<nope>";
  Result<std::unique_ptr<Tokenizer>> tok =
      parse_hf_tokenizer(minimal_tokenizer().dump(), config, "x/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(), HasSubstr("bos_token \"<nope>\""));
}

TEST(HfTokenizerConfig, ReadsStringsObjectsAndNulls) {
  Result<TokenizerConfig> c = parse_tokenizer_config(
      R"({"add_bos_token": true, "bos_token": {"__type": "AddedToken", "content": "<s>"},
          "eos_token": "</s>", "tokenizer_class": "LlamaTokenizerFast",
          "clean_up_tokenization_spaces": false, "chat_template": "{{ x }}"})",
      "tokenizer_config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->add_bos_token, true);
  EXPECT_FALSE(c->add_eos_token.has_value());
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  EXPECT_EQ(c->tokenizer_class, "LlamaTokenizerFast");
  Result<TokenizerConfig> null_bos = parse_tokenizer_config(R"({"bos_token": null})", "c");
  ASSERT_TRUE(null_bos.ok());
  EXPECT_FALSE(null_bos->bos_token.has_value());
  EXPECT_THAT(parse_tokenizer_config(R"({"add_bos_token": "yes"})", "c.json").status().message(),
              HasSubstr("c.json: add_bos_token is not a boolean"));
}

// LlamaTokenizerFast rebuilds the post-processor from add_bos_token / add_eos_token.
TEST(HfTokenizerConfig, LlamaClassAddsBosAndEosAsConfigured) {
  json j = minimal_tokenizer();
  j["added_tokens"] = json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 4}, {"content", "</s>"}, {"special", true}}});
  TokenizerConfig config;
  config.tokenizer_class = "LlamaTokenizerFast";
  config.bos_token = "<s>";
  config.eos_token = "</s>";
  config.add_eos_token = true;
  Result<std::unique_ptr<Tokenizer>> tok = parse_hf_tokenizer(j.dump(), config, "llama");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->encode("ab", true), (std::vector<int32_t>{3, 2, 4}));
  EXPECT_EQ((*tok)->encode("ab<s>", false), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ((*tok)->decode(std::vector<int32_t>{3, 2, 4}, DecodeOptions{false}), "<s> ab </s>");
  config.add_bos_token = false;
  config.add_eos_token = false;
  tok = parse_hf_tokenizer(j.dump(), config, "llama");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->encode("ab", true), (std::vector<int32_t>{2}));
}

// ---- load_model_tokenizer ----

TEST(LoadModelTokenizer, NamesTheDirectoryAndTheFilesWhenNoneExists) {
  TempDir dir;
  Result<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_TRUE(tok.status().IsNotFound());
  EXPECT_THAT(tok.status().message(), HasSubstr(dir.path()));
  EXPECT_THAT(tok.status().message(), HasSubstr("tokenizer.json"));
  EXPECT_THAT(tok.status().message(), HasSubstr("tiktoken.model"));
  EXPECT_THAT(tok.status().message(), HasSubstr("tokenizer.model"));
  EXPECT_EQ(model_tokenizer_path(dir.path()), dir.path() + "/tokenizer.model");
}

TEST(LoadModelTokenizer, PrefersTokenizerJsonAndReadsTheConfig) {
  TempDir dir;
  json j = minimal_tokenizer();
  j["added_tokens"] = json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}}});
  dir.write("tokenizer.json", j.dump());
  dir.write("tokenizer.model", "not a SentencePiece model");
  dir.write("tokenizer_config.json",
            R"({"bos_token": "<s>", "add_bos_token": true, "tokenizer_class": "LlamaTokenizer"})");
  Result<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->bos_id(), 3);
  EXPECT_EQ((*tok)->encode("ab", true), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(model_tokenizer_path(dir.path()), dir.path() + "/tokenizer.json");

  dir.write("tokenizer.json", "{\"model\": {\"type\": \"Unigram\"}}");
  tok = load_model_tokenizer(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status().message(),
              HasSubstr(dir.path() + "/tokenizer.json: model.type \"Unigram\""));
}

TEST(LoadModelTokenizer, SentencePieceWithConfig) {
  if (source_dir().empty()) GTEST_SKIP() << "KVRT_SOURCE_DIR is not set";
  const fs::path model =
      fs::path(source_dir()) / ".." / "shared" / "models" / "stories260k" / "tokenizer.model";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  TempDir dir;
  fs::copy_file(model, fs::path(dir.path()) / "tokenizer.model");
  Result<std::unique_ptr<Tokenizer>> plain = load_model_tokenizer(dir.path());
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const std::vector<int32_t> ids = (*plain)->encode("Once upon a time", false);
  EXPECT_EQ((*plain)->encode("Once upon a time", true).front(), 1);
  EXPECT_EQ((*plain)->decode(std::vector<int32_t>{1, ids[0]}, DecodeOptions{false}), "<s>Once");

  dir.write("tokenizer_config.json", R"({"add_bos_token": false, "add_eos_token": true})");
  Result<std::unique_ptr<Tokenizer>> configured = load_model_tokenizer(dir.path());
  ASSERT_TRUE(configured.ok()) << configured.status().message();
  std::vector<int32_t> want = ids;
  want.push_back(2);
  EXPECT_EQ((*configured)->encode("Once upon a time", true), want);
  dir.write("tokenizer_config.json", R"({"bos_token": "<nope>"})");
  EXPECT_THAT(load_model_tokenizer(dir.path()).status().message(),
              HasSubstr("bos_token \"<nope>\""));
}

}  // namespace
}  // namespace kvrt::text
