// One small Status / Result type for the core: free when OK, built by factories, tested by
// predicates. Messages are one line a user can act on: they name the file, key, plugin or field.
// Declared in kvrt::util and used everywhere as kvrt::Status / kvrt::Result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>

namespace kvrt::util {

class Status {
 public:
  enum class Code {
    kOk,
    kInvalidArgument,
    kNotFound,
    kUnsupported,
    kOutOfRange,
    kNoMemory,
    kConfig,
    kPlugin,
    kInternal
  };

  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, m); }
  static Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
  static Status Unsupported(std::string m) { return Status(Code::kUnsupported, std::move(m)); }
  static Status OutOfRange(std::string m) { return Status(Code::kOutOfRange, std::move(m)); }
  static Status NoMemory(std::string m) { return Status(Code::kNoMemory, std::move(m)); }
  static Status ConfigError(std::string m) { return Status(Code::kConfig, std::move(m)); }
  static Status PluginError(std::string m) { return Status(Code::kPlugin, std::move(m)); }
  static Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
  // An invalid argument that one named field of a request or a file holds: message() reads
  // "<field>: <what>", and field() names it, for a caller that answers in its own field names
  // (the HTTP API's "sampling_params.top_p" for a core's "sampling.top_p").
  static Status BadField(std::string field, const std::string& what) {
    std::string message = field + ": " + what;
    return Status(Code::kInvalidArgument, std::move(message), std::move(field));
  }
  // A status rebuilt from its parts, e.g. one that crossed a rank boundary as bytes.
  static Status FromCode(Code code, std::string m) {
    return code == Code::kOk ? Status() : Status(code, std::move(m));
  }

  bool ok() const { return state_ == nullptr; }
  Code code() const { return ok() ? Code::kOk : state_->code; }
  bool IsNotFound() const { return code() == Code::kNotFound; }
  bool IsNoMemory() const { return code() == Code::kNoMemory; }
  bool IsConfigError() const { return code() == Code::kConfig; }
  const std::string& message() const {
    static const std::string kEmpty;
    return ok() ? kEmpty : state_->message;
  }
  // The field a BadField status names; "" for any other.
  const std::string& field() const {
    static const std::string kEmpty;
    return ok() ? kEmpty : state_->field;
  }
  // Same code, with context in front: "loading config.toml: <message>".
  Status WithContext(const std::string& context) const {
    return ok() ? *this : Status(state_->code, context + ": " + state_->message, state_->field);
  }

 private:
  struct State {
    Code code;
    std::string message;
    std::string field;
  };
  Status(Code code, std::string message, std::string field = "")
      : state_(std::make_shared<const State>(State{code, std::move(message), std::move(field)})) {}
  std::shared_ptr<const State> state_;
};

// A status as a fixed-size record (at least 2 bytes), for one that crosses a rank boundary as
// bytes: its code, then its message, truncated to fit and NUL-terminated.
inline void status_to_record(const Status& s, std::span<uint8_t> record) {
  std::fill(record.begin(), record.end(), uint8_t{0});
  record[0] = static_cast<uint8_t>(s.code());
  const std::string& message = s.message();
  std::memcpy(record.data() + 1, message.data(), std::min(message.size(), record.size() - 2));
}
// The inverse.
inline Status status_from_record(std::span<const uint8_t> record) {
  if (record[0] == 0) return Status::Ok();
  return Status::FromCode(static_cast<Status::Code>(record[0]),
                          std::string(reinterpret_cast<const char*>(record.data() + 1)));
}

// A value or the Status saying why there is none.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvrt::util

namespace kvrt {
using util::Result;
using util::Status;
using util::status_from_record;
using util::status_to_record;
}  // namespace kvrt
