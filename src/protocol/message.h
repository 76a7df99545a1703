// What the JSON messages between openshell's roles share: an object with a
// "type" and typed fields, read so that a missing, mistyped or unknown field
// is one error that names it:
//   exec stream: "start" message: missing field "argv"
// Each protocol's header defines its messages as structs with to_json and
// from_json; encode() and decode() add and dispatch on the "type".
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_text.h"

namespace openshell::protocol {

using nlohmann::json;

// A message the other side got wrong.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// Reads one message's fields; throws ProtocolError naming the field.
class FieldReader {
 public:
  FieldReader(const json& object, std::string_view type) : object_(object), type_(type) {
    if (!object_.is_object()) fail("not a JSON object");
  }

  template <class T>
  void required(const char* name, T* out) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end()) fail("missing field \"" + std::string(name) + "\"");
    *out = convert<T>(name, *it);
  }

  template <class T>
  void required(const char* name, std::optional<T>* out) {
    T value;
    required(name, &value);
    *out = std::move(value);
  }

  // Leaves *out as it is when the field is absent.
  template <class T>
  void optional(const char* name, T* out) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it != object_.end()) *out = convert<T>(name, *it);
  }

  template <class T>
  void optional(const char* name, std::optional<T>* out) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it != object_.end()) *out = convert<T>(name, *it);
  }

  // A field the caller reads itself (a list of objects): nullptr when absent.
  const json* raw(const char* name) {
    seen_.insert(name);
    auto it = object_.find(name);
    return it == object_.end() ? nullptr : &*it;
  }

  // Every field besides "type" must have been read.
  void no_others() const {
    for (auto it = object_.begin(); it != object_.end(); ++it)
      if (it.key() != "type" && !seen_.count(it.key())) fail("unknown field \"" + it.key() + "\"");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ProtocolError("\"" + type_ + "\" message: " + why);
  }

  template <class T>
  T convert(const char* name, const json& value) const {
    const std::string field = "field \"" + std::string(name) + "\" must be ";
    if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) fail(field + "true or false");
      return value.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      using limits = std::numeric_limits<T>;
      const std::string range = field + "an integer from " + std::to_string(limits::min()) +
                                " to " + std::to_string(limits::max());
      if (value.is_number_unsigned()) {
        if (value.get<uint64_t>() > static_cast<uint64_t>(limits::max())) fail(range);
        return static_cast<T>(value.get<uint64_t>());
      }
      if (!value.is_number_integer()) fail(range);
      int64_t v = value.get<int64_t>();
      if (v < static_cast<int64_t>(limits::min()) ||
          (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(limits::max())))
        fail(range);
      return static_cast<T>(v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!value.is_string()) fail(field + "a string");
      return value.get<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      if (!value.is_array()) fail(field + "a list of strings");
      std::vector<std::string> out;
      for (const auto& item : value) {
        if (!item.is_string()) fail(field + "a list of strings");
        out.push_back(item.get<std::string>());
      }
      return out;
    } else {
      static_assert(!sizeof(T), "no conversion for this field type");
    }
  }

  const json& object_;
  std::string type_;
  std::set<std::string> seen_;
};

// A message's text: its fields and its "type" (JSON; bytes that are not
// UTF-8 become U+FFFD rather than an exception).
template <class Message>
std::string encode(const Message& message) {
  json j = message;
  j["type"] = Message::kType;
  return json_text(j);
}

namespace detail {

template <class Variant, size_t I = 0>
Variant decode_as(const std::string& type, const json& j) {
  if constexpr (I == std::variant_size_v<Variant>) {
    throw ProtocolError("unknown message type \"" + type + "\"");
  } else {
    using Message = std::variant_alternative_t<I, Variant>;
    if (type == Message::kType) return Variant(std::in_place_index<I>, j.get<Message>());
    return decode_as<Variant, I + 1>(type, j);
  }
}

}  // namespace detail

// One of a protocol's messages from its text; throws ProtocolError,
// "PROTOCOL: why" (PROTOCOL names it, e.g. "exec stream").
template <class Variant>
Variant decode(std::string_view text, std::string_view protocol) {
  try {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw ProtocolError("a message is not a JSON object");
    auto type = j.find("type");
    if (type == j.end() || !type->is_string())
      throw ProtocolError("a message has no \"type\" string");
    return detail::decode_as<Variant>(type->get<std::string>(), j);
  } catch (const ProtocolError& e) {
    throw ProtocolError(std::string(protocol) + ": " + e.what());
  }
}

}  // namespace openshell::protocol
