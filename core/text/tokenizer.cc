#include "core/text/tokenizer.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <filesystem>
#include <tuple>

#include "core/text/tiktoken.h"
#include "core/text/tokenizer_json.h"
#include "core/util/file.h"

namespace kvrt::text {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
      : sp_(std::move(sp)), bos_id_(sp_->bos_id()), eos_id_(sp_->eos_id()) {}

  // tokenizer_config.json's choices (LlamaTokenizer's add_bos_token / add_eos_token, bos_token /
  // eos_token); path names the file in errors.
  Status configure(const TokenizerConfig& config, const std::string& path) {
    if (config.add_bos_token) add_bos_ = *config.add_bos_token;
    if (config.add_eos_token) add_eos_ = *config.add_eos_token;
    for (auto [token, key, id] : {std::tuple(&config.bos_token, "bos_token", &bos_id_),
                                  std::tuple(&config.eos_token, "eos_token", &eos_id_)}) {
      if (!token->has_value()) continue;  // absent or null: tokenizer.model's own
      const int found = sp_->PieceToId(token->value());
      if (found == sp_->unk_id() && sp_->IdToPiece(found) != token->value()) {
        return Status::ConfigError(path + ": " + key + " \"" + token->value() +
                                   "\" is not a piece of tokenizer.model");
      }
      *id = found;
    }
    return Status::Ok();
  }

  using Tokenizer::decode;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int> ids;
    // Encode fails only on an unloaded model, which load_sentencepiece never returns.
    (void)sp_->Encode(text, &ids);
    std::vector<int32_t> out;
    out.reserve(ids.size() + 2);
    if (add_special_tokens && add_bos_ && bos_id() >= 0) out.push_back(bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    if (add_special_tokens && add_eos_ && eos_id() >= 0) out.push_back(eos_id());
    return out;
  }

  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options) const override {
    // SentencePiece drops the first piece's leading space at the start of any id list. Our
    // contract drops it only right after BOS, so decode the runs between BOS ids separately and
    // put the space back on a run that does not follow a BOS.
    std::string out;
    std::vector<int> run;
    bool after_bos = false;
    auto flush = [&]() {
      if (!run.empty()) out += DecodeRun(run, after_bos);
      run.clear();
    };
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) continue;
      if (id == bos_id()) {
        flush();
        if (!options.skip_special_tokens) out += sp_->IdToPiece(id);
        after_bos = true;
        continue;
      }
      if (!options.skip_special_tokens && is_special(id)) {
        // SentencePiece decodes control pieces to nothing; keeping them means writing the piece.
        flush();
        out += sp_->IdToPiece(id);
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }

  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && (sp_->IsControl(id) || id == bos_id_ || id == eos_id_);
  }
  std::string piece(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? sp_->IdToPiece(id) : std::string();
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t vocab_size() const override { return sp_->GetPieceSize(); }

 private:
  std::string DecodeRun(const std::vector<int>& run, bool after_bos) const {
    std::string text;
    (void)sp_->Decode(run, &text);  // ids are in range, so this cannot fail
    if (after_bos) return text;
    // Find the first piece that produces text (control pieces such as EOS produce none) and
    // check whether SentencePiece stripped a leading space from it.
    for (int id : run) {
      if (sp_->IsControl(id)) continue;
      const std::string& p = sp_->IdToPiece(id);
      static const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
      if (p.compare(0, kSpace.size(), kSpace) == 0) {
        std::string alone;
        (void)sp_->Decode(std::vector<int>{id}, &alone);
        // In isolation the piece would read " " + rest; if decoding lost that space, restore it.
        std::string spelled = " " + p.substr(kSpace.size());
        if (alone.size() + 1 == spelled.size() && spelled.compare(1, alone.size(), alone) == 0) {
          text.insert(0, " ");
        }
      }
      break;
    }
    return text;
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int32_t bos_id_, eos_id_;
  bool add_bos_ = true, add_eos_ = false;  // LlamaTokenizer's defaults
};

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int32_t vocab_size) : vocab_size_(vocab_size) {}

  using Tokenizer::decode;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() + 1);
    if (add_special_tokens) out.push_back(kBos);
    for (char c : text) out.push_back(kFirstByte + static_cast<uint8_t>(c));
    return out;
  }

  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= kFirstByte && id < kFirstByte + 256) {
        out += static_cast<char>(id - kFirstByte);
      } else if (!options.skip_special_tokens && is_special(id)) {
        out += piece(id);
      }
    }
    return out;
  }

  bool is_special(int32_t id) const override { return id == kPad || id == kBos || id == kEos; }

  std::string piece(int32_t id) const override {
    if (id < 0 || id >= vocab_size_) return "";
    if (id == kPad) return "<pad>";
    if (id == kBos) return "<s>";
    if (id == kEos) return "</s>";
    if (id >= kFirstByte + 256) return "<unused" + std::to_string(id) + ">";
    const int b = id - kFirstByte;
    if (b > 0x20 && b < 0x7f) return std::string(1, static_cast<char>(b));
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    return buf;
  }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  int32_t vocab_size() const override { return vocab_size_; }

 private:
  static constexpr int32_t kPad = 0, kBos = 1, kEos = 2, kFirstByte = 3;
  int32_t vocab_size_;
};

}  // namespace

namespace {

Result<std::unique_ptr<SentencePieceTokenizer>> open_sentencepiece(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return Status::NotFound(path + ": no such SentencePiece model file");
  }
  // Read here, bounded, rather than by SentencePiece, which reads any file whole.
  Result<std::string> bytes = util::read_file(path, kTokenizerFile);
  if (!bytes.ok()) return bytes.status();
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(*bytes);
  if (!status.ok()) {
    return Status::InvalidArgument(path + ": not a SentencePiece model: " + status.ToString());
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(sp));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& path) {
  Result<std::unique_ptr<SentencePieceTokenizer>> sp = open_sentencepiece(path);
  if (!sp.ok()) return sp.status();
  return std::unique_ptr<Tokenizer>(std::move(*sp));
}

std::string model_tokenizer_path(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tiktoken.model"}) {
    if (fs::exists(fs::path(dir) / name, ec)) return (fs::path(dir) / name).string();
  }
  return (fs::path(dir) / "tokenizer.model").string();
}

Result<std::unique_ptr<Tokenizer>> load_model_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = model_tokenizer_path(dir);
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  const bool has_config = fs::exists(config_path, ec);
  if (fs::path(path).filename() == "tokenizer.json") {
    return load_hf_tokenizer(path, has_config ? config_path : "");
  }
  if (fs::path(path).filename() == "tiktoken.model") {
    return load_tiktoken(path, has_config ? config_path : "");
  }
  if (!fs::exists(path, ec)) {
    return Status::NotFound(dir +
                            ": no tokenizer.json, tiktoken.model or tokenizer.model in this "
                            "directory");
  }
  Result<std::unique_ptr<SentencePieceTokenizer>> sp = open_sentencepiece(path);
  if (!sp.ok()) return sp.status();
  if (has_config) {
    Result<TokenizerConfig> config = read_tokenizer_config(config_path);
    if (!config.ok()) return config.status();
    if (Status s = (*sp)->configure(*config, config_path); !s.ok()) return s;
  }
  return std::unique_ptr<Tokenizer>(std::move(*sp));
}

Result<std::unique_ptr<Tokenizer>> make_byte_tokenizer(int32_t vocab_size) {
  if (vocab_size < 259) {
    return Status::InvalidArgument("byte tokenizer: vocab_size " + std::to_string(vocab_size) +
                                   " is below the 259 ids it needs (3 specials + 256 bytes)");
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>(vocab_size));
}

}  // namespace kvrt::text
