// The output text on the step thread: TextStream never hands out half a character and keeps
// the output's first space after the prompt; stop_safe_length holds back what may start a stop
// string; OutputText cuts at a completed stop string and its pieces add up to the final text.
#include "core/text/detokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace kvrt::text {
namespace {

// A streamed text never carries half a character: the bytes of "é" and "😀" arrive one token
// at a time, and each update is whole UTF-8 and a prefix of the final text.
TEST(TextStream, HoldsBackASplitCharacterUntilItIsWhole) {
  Result<std::unique_ptr<Tokenizer>> tok = make_byte_tokenizer();
  ASSERT_TRUE(tok.ok());
  const std::string want = "h\xC3\xA9llo \xF0\x9F\x98\x80!";
  std::vector<int32_t> ids;
  for (unsigned char c : want) ids.push_back(3 + c);
  TextStream stream(tok->get());
  std::vector<int32_t> so_far;
  std::vector<std::string> seen;
  for (int32_t id : ids) {
    so_far.push_back(id);
    const std::string& text = stream.update(so_far);
    EXPECT_EQ(want.compare(0, text.size(), text), 0) << text;
    seen.push_back(text);
  }
  EXPECT_EQ(seen[1], "h");              // the first byte of "é" is held back
  EXPECT_EQ(seen[2], "h\xC3\xA9");      // and sent with the second
  EXPECT_EQ(seen[8], "h\xC3\xA9llo ");  // three bytes of the emoji: nothing yet
  EXPECT_EQ(seen.back(), want);
  EXPECT_EQ(stream.finish(so_far), want);
  // A last token that leaves a character unfinished: finish() gives the bytes as decoded.
  so_far.push_back(3 + 0xE2);
  EXPECT_EQ(stream.update(so_far), want);
  EXPECT_EQ(stream.finish(so_far), want + "\xE2");
}

// A tokenizer.json whose decoder drops a sequence's first space (Mistral's Strip, like
// Metaspace): the output decoded after the prompt's last ids keeps its first space, streamed and
// finished alike.
TEST(TextStream, KeepsTheFirstSpaceOfTheOutputAfterThePrompt) {
  const std::string dir =
      std::string(std::getenv("KVRT_SOURCE_DIR") ? std::getenv("KVRT_SOURCE_DIR") : ".") +
      "/tests/data/tokenizers/mistral";
  Result<std::unique_ptr<Tokenizer>> tok = load_model_tokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const std::vector<int32_t> ids = (*tok)->encode("Once upon a time, there was", false);
  ASSERT_GT(ids.size(), 4u);
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 2);
  const std::vector<int32_t> output(ids.begin() + 2, ids.end());
  const std::string whole = (*tok)->decode(ids), head = (*tok)->decode(prompt);
  ASSERT_EQ(whole.rfind(head, 0), 0u);
  const std::string want = whole.substr(head.size());
  ASSERT_EQ(want[0], ' ') << want;
  EXPECT_NE((*tok)->decode(output), want);  // alone, the first space is gone
  TextStream stream(tok->get(), prompt);
  std::vector<int32_t> so_far;
  for (int32_t id : output) {
    so_far.push_back(id);
    const std::string& text = stream.update(so_far);
    EXPECT_EQ(want.compare(0, text.size(), text), 0) << text;
  }
  EXPECT_EQ(stream.text(), want);
  EXPECT_EQ(stream.finish(output), want);
}

TEST(StopSafeLength, HoldsBackTheLongestStartOfAStopString) {
  EXPECT_EQ(stop_safe_length("a little gir", {" girl"}), 8u);
  EXPECT_EQ(stop_safe_length("a littl", {" girl", "little girl"}), 2u);  // the longest wins
  EXPECT_EQ(stop_safe_length("a little", {" girl"}), 8u);
  EXPECT_EQ(stop_safe_length("a little ", {" girl"}), 8u);
  EXPECT_EQ(stop_safe_length("abc", {}), 3u);
  EXPECT_EQ(stop_safe_length("", {"x"}), 0u);
}

// Byte tokens (make_byte_tokenizer: id 3 + byte) of `text`.
std::vector<int32_t> byte_ids(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(3 + c);
  return ids;
}

TEST(OutputText, CutsAtACompletedStopStringAndItsPiecesAddUpToTheText) {
  Result<std::unique_ptr<Tokenizer>> tok = make_byte_tokenizer();
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> ids = byte_ids("a little girl who");
  OutputText text(tok->get(), {3 + 'x'}, {" girl", "zzz"});
  std::vector<int32_t> so_far;
  std::string sent;
  bool stopped = false;
  size_t at = 0;
  for (; at < ids.size() && !stopped; ++at) {
    so_far.push_back(ids[at]);
    stopped = text.update(so_far);
    sent += text.take();
    if (!stopped) {
      EXPECT_EQ(stop_safe_length(sent, {" girl"}), sent.size()) << sent;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(at, std::string("a little girl").size());  // stopped by the 'l' that completes it
  EXPECT_EQ(text.matched(), " girl");
  EXPECT_EQ(sent, "a little");
  EXPECT_EQ(text.take(), "");
}

TEST(OutputText, AnOutputThatEndsOtherwiseHandsOutWhatWasHeldBack) {
  Result<std::unique_ptr<Tokenizer>> tok = make_byte_tokenizer();
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> ids = byte_ids("a little gi");
  OutputText text(tok->get(), {}, {" girl"});
  EXPECT_FALSE(text.update(ids));
  EXPECT_EQ(text.take(), "a little");
  text.finish(ids);  // max_new_tokens reached: " gi" was not a stop string after all
  EXPECT_EQ(text.take(), " gi");
  EXPECT_EQ(text.matched(), "");
}

}  // namespace
}  // namespace kvrt::text
