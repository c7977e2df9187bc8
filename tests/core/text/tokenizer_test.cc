// Tests of the SentencePiece tokenizer (the real stories260k tokenizer.model) and the synthetic
// presets' byte-level tokenizer.
#include "core/text/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace kvrt::text {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The real tiny model, or "" when the checkout has no ../shared/models next to it.
std::string Stories260kDir() {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  if (root == nullptr) return "";
  fs::path dir = fs::path(root) / ".." / "shared" / "models" / "stories260k";
  return fs::exists(dir / "config.json") ? dir.string() : "";
}

#define REQUIRE_STORIES260K(dir)                                                               \
  const std::string dir = Stories260kDir();                                                    \
  if (dir.empty()) {                                                                           \
    GTEST_SKIP() << "stories260k not found: set KVRT_SOURCE_DIR to the repository root, with " \
                    "the model in ../shared/models/stories260k";                               \
  }

TEST(TokenizerTest, SentencePieceStories260k) {
  REQUIRE_STORIES260K(dir);
  auto tok = load_sentencepiece(dir + "/tokenizer.model");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.piece(403), "\xE2\x96\x81Once");
  EXPECT_EQ(t.piece(512), "");

  const std::string prompt = "Once upon a time";
  EXPECT_EQ(t.encode(prompt, false), (std::vector<int32_t>{403, 407, 261, 378}));
  const std::vector<int32_t> with_bos = t.encode(prompt, true);
  EXPECT_EQ(with_bos, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  // At the start of a sequence (after BOS) the dummy-prefix space is dropped; in a continuation
  // it is kept, so the continuation prints right after the prompt.
  EXPECT_EQ(t.decode(with_bos), prompt);
  EXPECT_EQ(t.decode(t.encode(prompt, false)), " " + prompt);

  const std::vector<int32_t> generated = {432, 383, 286, 261, 376, 298, 315, 421, 395,
                                          317, 426, 338, 401, 396, 267, 337, 410, 408,
                                          419, 292, 411, 322, 265, 282, 295, 433, 426};
  const std::string text =
      ", there was a little girl named Lily. She loved to play outside in the park.";
  EXPECT_EQ(t.decode(generated), text);
  std::vector<int32_t> all = with_bos;
  all.insert(all.end(), generated.begin(), generated.end());
  all.push_back(t.eos_id());
  EXPECT_EQ(t.decode(all), prompt + text);

  // Streaming: decoding in pieces concatenates to the whole, including chunks starting on a
  // word ("\xE2\x96\x81there") and ids out of range being ignored.
  std::string streamed = t.decode(with_bos);
  for (size_t i = 0; i < generated.size(); i += 2) {
    std::vector<int32_t> chunk(generated.begin() + i,
                               generated.begin() + std::min(i + 2, generated.size()));
    chunk.push_back(-5);
    streamed += t.decode(chunk);
  }
  EXPECT_EQ(streamed, prompt + text);

  auto missing = load_sentencepiece(dir + "/nope.model");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  auto not_sp = load_sentencepiece(dir + "/config.json");
  ASSERT_FALSE(not_sp.ok());
  EXPECT_THAT(not_sp.status().message(), HasSubstr("not a SentencePiece model"));
}

TEST(TokenizerTest, ByteRoundTrip) {
  auto tok = make_byte_tokenizer();
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);

  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte += static_cast<char>(b);
  const std::vector<int32_t> ids = t.encode(every_byte, true);
  ASSERT_EQ(ids.size(), 257u);
  EXPECT_EQ(ids[0], 1);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b + 1], 3 + b);
  EXPECT_EQ(t.decode(ids), every_byte);

  const std::string utf8 = "h\xC3\xA9llo, w\xE2\x82\xACrld";
  std::vector<int32_t> with_specials = t.encode(utf8, false);
  with_specials.insert(with_specials.begin() + 3, {0, 1, 2, 300, 511, -1, 512});
  EXPECT_EQ(t.decode(with_specials), utf8);
  EXPECT_EQ(t.encode("A", false), std::vector<int32_t>{3 + 'A'});
  EXPECT_EQ(t.piece(3 + 'A'), "A");
  EXPECT_EQ(t.piece(3 + '\n'), "<0x0A>");
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.piece(512), "");

  EXPECT_FALSE(make_byte_tokenizer(258).ok());
}

}  // namespace
}  // namespace kvrt::text
