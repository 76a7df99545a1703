#include "policy/yaml.h"

#include <yaml.h>

#include <cerrno>
#include <cstdlib>
#include <memory>

#include "base/error.h"

namespace openshell::policy {

namespace {

// Bounds for a document whose aliases could repeat a subtree many times.
constexpr size_t kMaxNodes = 100000;
constexpr int kMaxDepth = 64;

struct Document {
  yaml_document_t doc;
  bool loaded = false;
  ~Document() {
    if (loaded) yaml_document_delete(&doc);
  }
};

struct Parser {
  yaml_parser_t parser;
  Parser() { yaml_parser_initialize(&parser); }
  ~Parser() { yaml_parser_delete(&parser); }
};

class Converter {
 public:
  Converter(yaml_document_t* doc, const std::string& source, YamlLines* lines)
      : doc_(doc), source_(source), lines_(lines) {}

  [[noreturn]] void fail(const yaml_node_t* node, const std::string& message) const {
    throw Error(source_ + ":" + std::to_string(node->start_mark.line + 1) + ": " + message);
  }

  std::string scalar_text(const yaml_node_t* node) const {
    return std::string(reinterpret_cast<const char*>(node->data.scalar.value),
                       node->data.scalar.length);
  }

  // Stores the node's line for the one it became.
  void mark(const toml::node* made, const yaml_node_t* node) {
    (*lines_)[made] = node->start_mark.line + 1;
  }

  // Where a converted node goes: a key of a table, or the end of an array.
  struct Sink {
    toml::table* table = nullptr;
    std::string key;
    toml::array* array = nullptr;
    template <typename V>
    toml::node* put(V&& value) const {
      if (table) {
        auto [it, inserted] = table->insert(key, std::forward<V>(value));
        return &it->second;
      }
      array->push_back(std::forward<V>(value));
      return &array->back();
    }
  };

  // The pairs of a mapping into `table`.
  void pairs(yaml_node_t* node, int depth, toml::table* table) {
    for (yaml_node_pair_t* pair = node->data.mapping.pairs.start;
         pair < node->data.mapping.pairs.top; ++pair) {
      yaml_node_t* key = yaml_document_get_node(doc_, pair->key);
      yaml_node_t* value = yaml_document_get_node(doc_, pair->value);
      if (key->type != YAML_SCALAR_NODE) fail(key, "a key must be a string");
      std::string name = scalar_text(key);
      if (table->contains(name)) fail(key, name + ": the key is given twice");
      convert(value, depth + 1, Sink{table, name, nullptr});
    }
  }

  void convert(yaml_node_t* node, int depth, const Sink& sink) {
    if (++count_ > kMaxNodes) fail(node, "the YAML document is too large");
    if (depth > kMaxDepth) fail(node, "the YAML document is nested too deep");
    switch (node->type) {
      case YAML_SCALAR_NODE: {
        std::string text = scalar_text(node);
        if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
          mark(sink.put(toml::value<std::string>(text)), node);
          return;
        }
        if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL")
          fail(node, "a value is missing (null)");
        if (text == "true" || text == "True" || text == "TRUE") {
          mark(sink.put(toml::value<bool>(true)), node);
          return;
        }
        if (text == "false" || text == "False" || text == "FALSE") {
          mark(sink.put(toml::value<bool>(false)), node);
          return;
        }
        size_t digits = text[0] == '-' || text[0] == '+' ? 1 : 0;
        bool integer = text.size() > digits && text.size() - digits <= 18 &&
                       text.find_first_not_of("0123456789", digits) == std::string::npos;
        if (integer) {
          mark(sink.put(toml::value<int64_t>(std::strtoll(text.c_str(), nullptr, 10))), node);
          return;
        }
        mark(sink.put(toml::value<std::string>(text)), node);
        return;
      }
      case YAML_SEQUENCE_NODE: {
        toml::array* array = sink.put(toml::array{})->as_array();
        mark(array, node);
        for (yaml_node_item_t* item = node->data.sequence.items.start;
             item < node->data.sequence.items.top; ++item)
          convert(yaml_document_get_node(doc_, *item), depth + 1, Sink{nullptr, "", array});
        return;
      }
      case YAML_MAPPING_NODE: {
        toml::table* table = sink.put(toml::table{})->as_table();
        mark(table, node);
        pairs(node, depth, table);
        return;
      }
      default:
        fail(node, "an empty YAML node");
    }
  }

 private:
  yaml_document_t* doc_;
  const std::string& source_;
  YamlLines* lines_;
  size_t count_ = 0;
};

}  // namespace

toml::table yaml_to_table(std::string_view text, const std::string& source, YamlLines* lines) {
  Parser p;
  yaml_parser_set_input_string(&p.parser, reinterpret_cast<const unsigned char*>(text.data()),
                               text.size());
  Document first;
  if (!yaml_parser_load(&p.parser, &first.doc))
    throw Error(source + ":" + std::to_string(p.parser.problem_mark.line + 1) + ": " +
                (p.parser.problem ? p.parser.problem : "not valid YAML"));
  first.loaded = true;
  yaml_node_t* root = yaml_document_get_root_node(&first.doc);
  if (!root) throw Error(source + ": the YAML document is empty");
  if (root->type != YAML_MAPPING_NODE)
    throw Error(source + ":" + std::to_string(root->start_mark.line + 1) +
                ": a policy is a mapping (version: 1, network_policies: ...)");
  Document second;
  if (!yaml_parser_load(&p.parser, &second.doc))
    throw Error(source + ":" + std::to_string(p.parser.problem_mark.line + 1) + ": " +
                (p.parser.problem ? p.parser.problem : "not valid YAML"));
  second.loaded = true;
  if (yaml_document_get_root_node(&second.doc))
    throw Error(source + ": more than one YAML document (one policy a file)");

  toml::table out;
  Converter converter(&first.doc, source, lines);
  converter.pairs(root, 0, &out);
  return out;
}

}  // namespace openshell::policy
