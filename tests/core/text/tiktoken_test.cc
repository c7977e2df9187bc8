// tiktoken.model (Kimi's tokenizer): every id and decoded text equal to OpenAI tiktoken's with
// Kimi's split pattern and specials (tests/data/tokenizers/kimi-tiktoken.json, see
// generate_tiktoken.mjs there), on tiny-kimi-k25's files (the cl100k_base ranks) and on a small
// vocabulary that shows the pattern's Han rules. Also what a malformed tiktoken.model or
// tokenizer_config.json is refused with, and how a directory's tokenizer is chosen.
#include "core/text/tiktoken.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/text/tokenizer.h"
#include "core/util/file.h"
#include "tests/core/text/tokenizer_test_files.h"

namespace kvrt::text {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;
using test_support::shorten;
using test_support::source_dir;
using test_support::TempDir;

const json& fixture() {
  static const json j = [] {
    const fs::path path =
        fs::path(source_dir()) / "tests" / "data" / "tokenizers" / "kimi-tiktoken.json";
    return json::parse(util::read_file(path.string(), kTokenizerFile).value());
  }();
  return j;
}

// A case's text: "text", or "text_repeats" ([string, count] pairs) for the long ones.
std::string text_of(const json& c) {
  if (c.contains("text")) return c["text"].get<std::string>();
  std::string text;
  for (const json& r : c["text_repeats"]) {
    for (int i = 0; i < r[1].get<int>(); ++i) text += r[0].get<std::string>();
  }
  return text;
}

// tiny-kimi-k25 (../shared/models beside the repository), loaded once for the suite.
class KimiTiktoken : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (source_dir().empty()) {
      skip_ = "KVRT_SOURCE_DIR is not set";
      return;
    }
    dir_ = (fs::path(source_dir()) / ".." / "shared" / "models" / "tiny-kimi-k25").string();
    if (!fs::exists(fs::path(dir_) / "tiktoken.model")) {
      skip_ = dir_ +
              "/tiktoken.model is absent (the shared models sit in ../shared/models "
              "beside the repository)";
      return;
    }
    Result<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(dir_);
    if (!tok.ok()) {
      skip_ = "";
      error_ = tok.status().message();
      return;
    }
    tokenizer_ = std::move(*tok);
  }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_NE(tokenizer_, nullptr) << error_;
  }

  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline std::string dir_, skip_, error_;
};

TEST_F(KimiTiktoken, EveryTextEncodesAsTiktokenDoes) {
  const Tokenizer& t = *tokenizer_;
  const json& encode = fixture()["encode"];
  ASSERT_GE(encode.size(), 70u);
  // gtest's assertions may be used from several threads; the piece cache is shared.
  auto run_encodes = [&] {
    for (const json& c : encode) {
      const std::string text = text_of(c);
      EXPECT_EQ(t.encode(text, false), c["ids"].get<std::vector<int32_t>>())
          << "\"" << shorten(text) << "\"";
      EXPECT_EQ(t.encode(text, true), c["ids_with_special"].get<std::vector<int32_t>>())
          << "with special tokens: \"" << shorten(text) << "\"";
    }
  };
  std::thread other(run_encodes);
  run_encodes();
  other.join();
}

TEST_F(KimiTiktoken, DecodesAsTiktokenDoesAndRoundTrips) {
  const Tokenizer& t = *tokenizer_;
  int replacement = 0;
  for (const json& c : fixture()["decode"]) {
    const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    DecodeOptions options;
    options.skip_special_tokens = c["skip_special_tokens"].get<bool>();
    const std::string want = c["text"].get<std::string>();
    EXPECT_EQ(t.decode(ids, options), want) << c["ids"].dump();
    replacement += want.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(replacement, 0) << "no case decodes a split character";
  for (const json& c : fixture()["encode"]) {
    const std::string text = text_of(c);
    EXPECT_EQ(t.decode(t.encode(text, false), DecodeOptions{false}), text) << shorten(text);
  }
}

TEST_F(KimiTiktoken, SpecialTokens) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.vocab_size(), 100512);
  EXPECT_EQ(t.bos_id(), 100256);
  EXPECT_EQ(t.eos_id(), 100257);
  EXPECT_FALSE(t.is_special(100255));
  EXPECT_TRUE(t.is_special(100256));
  EXPECT_TRUE(t.is_special(100300));  // reserved, unnamed
  EXPECT_TRUE(t.is_special(100511));  // [PAD]
  EXPECT_FALSE(t.is_special(100512));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_EQ(t.piece(100258), "<|im_end|>");
  EXPECT_EQ(t.piece(100300), "<|reserved_token_100300|>");
  EXPECT_EQ(t.piece(100255),
            "\xC4\xA0"
            "Conveyor");  // " Conveyor" in GPT-2's byte characters
  EXPECT_EQ(t.piece(100512), "");
  // Kimi's tokenizer adds no BOS around a text.
  EXPECT_EQ(t.encode("Hi", true), t.encode("Hi", false));
  const std::vector<int32_t> ids = {100256, 13347, 100258, 100512};
  EXPECT_EQ(t.decode(ids, DecodeOptions{false}), "[BOS]Hi<|im_end|>");
  EXPECT_EQ(t.decode(ids), "Hi");
  // Text that is not UTF-8 reads as U+FFFD, as a Python str would hold it.
  const std::string invalid = "a\xFF", replaced = "a\xEF\xBF\xBD";
  EXPECT_EQ(t.encode(invalid + "b", false), t.encode(replaced + "b", false));
}

TEST_F(KimiTiktoken, LoadModelTokenizerPicksTiktokenModel) {
  EXPECT_EQ(model_tokenizer_path(dir_), dir_ + "/tiktoken.model");
}

// ---- The small vocabulary: the split pattern's Han rules, and loading without a config ----

std::string synthetic_model() {
  return fixture()["synthetic"]["tiktoken_model"].get<std::string>();
}

TEST(Tiktoken, HanRulesOnASmallVocabulary) {
  if (source_dir().empty()) GTEST_SKIP() << "KVRT_SOURCE_DIR is not set";
  TempDir dir;
  dir.write("tiktoken.model", synthetic_model());
  dir.write("tokenizer.model", "not a SentencePiece model");  // tiktoken.model is preferred
  Result<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const Tokenizer& t = **tok;
  const int32_t ranks = 264;
  EXPECT_EQ(t.vocab_size(), ranks + 256);
  EXPECT_EQ(t.bos_id(), -1);  // no tokenizer_config.json, so no [BOS] among the specials
  EXPECT_EQ(t.piece(ranks), "<|reserved_token_264|>");
  for (const json& c : fixture()["synthetic"]["encode"]) {
    EXPECT_EQ(t.encode(c["text"].get<std::string>(), false), c["ids"].get<std::vector<int32_t>>())
        << c["text"];
  }
  EXPECT_EQ(t.encode("x<|reserved_token_300|>y", false), (std::vector<int32_t>{120, 300, 121}));

  // CRLF line ends read the same.
  std::string crlf;
  for (char c : synthetic_model()) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  dir.write("tiktoken.model", crlf);
  Result<std::unique_ptr<Tokenizer>> again = load_model_tokenizer(dir.path());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*again)->encode("xa中我、y", false), t.encode("xa中我、y", false));
}

TEST(Tiktoken, ConfigNamesSpecialsAndWhatEncodeAdds) {
  if (source_dir().empty()) GTEST_SKIP() << "KVRT_SOURCE_DIR is not set";
  TempDir dir;
  dir.write("tiktoken.model", synthetic_model());
  dir.write("tokenizer_config.json", R"({"added_tokens_decoder": {
      "264": {"content": "[BOS]", "special": true}, "265": {"content": "[EOS]"},
      "266": {"content": "<|im_end|>"}}, "add_bos_token": true, "add_eos_token": true})");
  Result<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->bos_id(), 264);
  EXPECT_EQ((*tok)->eos_id(), 265);
  EXPECT_EQ((*tok)->encode("x<|im_end|>", true), (std::vector<int32_t>{264, 120, 266, 265}));
  EXPECT_EQ((*tok)->encode("x<|im_end|>", false), (std::vector<int32_t>{120, 266}));

  const std::string config = (fs::path(dir.path()) / "tokenizer_config.json").string();
  const std::pair<const char*, const char*> refused[] = {
      {R"({"added_tokens_decoder": {"12": {"content": "<x>"}}})",
       "added_tokens_decoder[\"12\"] (\"<x>\") is not one of the 256 special ids"},
      {R"({"added_tokens_decoder": {"264": {"content": "<x>"}, "265": {"content": "<x>"}}})",
       "names \"<x>\" for both 264 and 265"},
      {R"({"added_tokens_decoder": {"a": {"content": "<x>"}}})",
       "added_tokens_decoder[\"a\"] is not a token id"},
      {R"({"bos_token": "<s>"})", "bos_token \"<s>\" is not a special token"},
      {R"({"add_eos_token": true})", "add_eos_token is true, but the tiktoken model has no such"},
  };
  for (const auto& [text, message] : refused) {
    dir.write("tokenizer_config.json", text);
    Result<std::unique_ptr<Tokenizer>> bad = load_model_tokenizer(dir.path());
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_THAT(bad.status().message(), HasSubstr(config + ": ")) << text;
    EXPECT_THAT(bad.status().message(), HasSubstr(message)) << text;
  }
}

// ---- A malformed tiktoken.model is refused, naming the file and the line ----

TEST(Tiktoken, RefusesMalformedModels) {
  if (source_dir().empty()) GTEST_SKIP() << "KVRT_SOURCE_DIR is not set";
  const std::string good = synthetic_model();  // 264 lines, ranks 0..263
  // The line of rank r is line r + 1; "YQ==" is "a" (rank 97), "Yg==" "b" (rank 98).
  const auto replace_line = [&](int rank, const std::string& line) {
    size_t begin = 0;
    for (int i = 0; i < rank; ++i) begin = good.find('\n', begin) + 1;
    return good.substr(0, begin) + line + good.substr(good.find('\n', begin));
  };
  const std::pair<std::string, std::string> refused[] = {
      {replace_line(97, "Y!== 97"), "line 98: token \"Y!==\" is not base64"},
      {replace_line(97, "YQ= 97"), "line 98: token \"YQ=\" is not base64"},
      {replace_line(97, "YR== 97"), "line 98: token \"YR==\" is not base64"},  // stray bits
      {replace_line(97, "YQ=="), "line 98: is not \"<base64 token> <rank>\""},
      {replace_line(97, "YQ== 97 1"), "line 98: is not \"<base64 token> <rank>\""},
      {replace_line(97, "YQ== -97"), "line 98: rank \"-97\" is not a number"},
      {replace_line(98, "Yg== 97"), "line 99: rank 97 is already given on line 98"},
      {replace_line(98, "YQ== 98"), "line 99: the token is already given on line 98"},
      {replace_line(98, "Yg== 264"), "line 99: rank 264, but the file has 264 tokens"},
      {replace_line(98, "YWI= 98"), "no token for the byte 98"},
      {"", "no tokens"},
      {"\n\n", "no tokens"},
  };
  TempDir dir;
  for (const auto& [model, message] : refused) {
    const std::string path = dir.write("tiktoken.model", model);
    Result<std::unique_ptr<Tokenizer>> bad = load_model_tokenizer(dir.path());
    ASSERT_FALSE(bad.ok()) << message;
    EXPECT_THAT(bad.status().message(), HasSubstr(path + ": " + message));
    Result<std::unique_ptr<Tokenizer>> direct = load_tiktoken(path, "");
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(direct.status().message(), bad.status().message());
  }
}

}  // namespace
}  // namespace kvrt::text
