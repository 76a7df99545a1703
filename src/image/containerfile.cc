#include "image/containerfile.h"

#include <nlohmann/json.hpp>

#include "base/text.h"

namespace openshell::image {

namespace {

const char* const kSupported[] = {"FROM", "RUN", "COPY",  "ADD",        "ENV",    "ARG",  "WORKDIR",
                                  "USER", "CMD", "LABEL", "ENTRYPOINT", "EXPOSE", "SHELL"};

// Docker's other instructions, each with why it is not taken.
struct Refused {
  const char* name;
  const char* why;
};
const Refused kRefused[] = {
    {"HEALTHCHECK", "not supported (sandboxes have no health checks)"},
    {"ONBUILD", "not supported (no triggers are kept in images built here)"},
    {"VOLUME", "not supported (a sandbox's storage is its own: see sandbox create --bind)"},
    {"STOPSIGNAL", "not supported"},
    {"MAINTAINER", "not supported (deprecated: use LABEL maintainer=...)"},
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string_view trim_left(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}

std::string_view trim_right(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_space(s[n - 1])) --n;
  return s.substr(0, n);
}

[[noreturn]] void refuse(const std::string& file, int line, const std::string& name,
                         const std::string& why) {
  throw ContainerfileError(file + ":" + std::to_string(line) + ": " +
                           (name.empty() ? "" : name + ": ") + why);
}

// A directive line: "# key=value" (key a word), nullopt otherwise.
std::optional<std::pair<std::string, std::string>> directive(std::string_view line) {
  line = trim_left(line);
  if (line.empty() || line[0] != '#') return std::nullopt;
  line = text::trim(line.substr(1));
  size_t eq = line.find('=');
  if (eq == std::string_view::npos) return std::nullopt;
  std::string key = text::lower(text::trim(line.substr(0, eq)));
  if (key.empty() || key.find_first_of(" \t") != std::string::npos) return std::nullopt;
  return std::make_pair(key, std::string(text::trim(line.substr(eq + 1))));
}

// A JSON array of strings, as the exec form is written; nullopt when the
// text is not one (then it is the shell form).
std::optional<std::vector<std::string>> json_strings(std::string_view args) {
  args = text::trim(args);
  if (args.empty() || args[0] != '[') return std::nullopt;
  nlohmann::json parsed = nlohmann::json::parse(args, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_array()) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& item : parsed) {
    if (!item.is_string()) return std::nullopt;
    out.push_back(item.get<std::string>());
  }
  return out;
}

bool takes_exec_form(const std::string& name) {
  return name == "RUN" || name == "CMD" || name == "ENTRYPOINT" || name == "SHELL" ||
         name == "COPY" || name == "ADD";
}

// Leading --name=value flags of COPY and ADD (and RUN's, which are refused).
void take_flags(Instruction* in, const std::string& file) {
  std::string_view rest = trim_left(in->args);
  while (rest.starts_with("--")) {
    size_t end = 0;
    while (end < rest.size() && !is_space(rest[end])) ++end;
    std::string flag(rest.substr(2, end - 2));
    rest = trim_left(rest.substr(end));
    size_t eq = flag.find('=');
    std::string key = flag.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : flag.substr(eq + 1);
    const bool copy = in->name == "COPY" || in->name == "ADD";
    if (copy && key == "from")
      refuse(file, in->line, in->name,
             "--from is not supported (multi-stage builds are not supported: copy from the "
             "build context)");
    if (copy && (key == "chown" || key == "chmod")) {
      if (value.empty()) refuse(file, in->line, in->name, "--" + key + " needs a value");
      in->flags[key] = value;
      continue;
    }
    refuse(file, in->line, in->name, "--" + key + ": unknown or unsupported option");
  }
  in->args = std::string(rest);
}

void finish(Instruction* in, const std::string& file) {
  const std::string& n = in->name;
  if (n == "COPY" || n == "ADD" || n == "RUN") take_flags(in, file);
  if (takes_exec_form(n)) {
    if (auto strings = json_strings(in->args)) {
      in->exec_form = true;
      in->exec_args = *strings;
    }
  }
  if (n == "SHELL" && (!in->exec_form || in->exec_args.empty()))
    refuse(file, in->line, n, "expects a JSON array, like [\"/bin/sh\", \"-c\"]");
  if (text::trim(in->args).empty() && n != "CMD" && n != "ENTRYPOINT")
    refuse(file, in->line, n, "needs arguments");
  if (n == "RUN" && in->exec_form && in->exec_args.empty())
    refuse(file, in->line, n, "needs a command (an empty JSON array)");
  if ((n == "COPY" || n == "ADD") && in->exec_form && in->exec_args.size() < 2)
    refuse(file, in->line, n, "needs a source and a destination");
}

}  // namespace

std::string Instruction::text() const {
  std::string out = name;
  for (const auto& [key, value] : flags) out += " --" + key + "=" + value;
  if (!args.empty()) out += " " + args;
  return out;
}

Containerfile parse_containerfile(std::string_view text, const std::string& file) {
  Containerfile out;
  out.file = file;

  std::vector<std::string_view> lines;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }

  // Parser directives: only before anything else (a blank line, a comment
  // or an instruction ends them), each at most once.
  size_t i = 0;
  std::map<std::string, bool> seen;
  for (; i < lines.size(); ++i) {
    auto d = directive(lines[i]);
    if (!d) break;
    const int line = static_cast<int>(i + 1);
    if (seen[d->first]) refuse(file, line, "", "parser directive '" + d->first + "' given twice");
    seen[d->first] = true;
    if (d->first == "escape") {
      if (d->second != "\\" && d->second != "`")
        refuse(file, line, "", "escape must be '\\' or '`', not '" + d->second + "'");
      out.escape = d->second[0];
    }
    // "syntax" names a frontend image; this builder is its own and reads
    // the file the same way whatever it names. Others are ignored as Docker
    // ignores unknown directives.
  }

  bool from_seen = false;
  while (i < lines.size()) {
    std::string_view raw = trim_right(lines[i]);
    std::string_view stripped = trim_left(raw);
    if (stripped.empty() || stripped[0] == '#') {
      ++i;
      continue;
    }
    Instruction in;
    in.line = static_cast<int>(i + 1);
    // Joins continuations: a line ending with the escape character goes on
    // with the next one; comment lines and blank lines inside are skipped.
    std::string joined;
    std::string_view current = stripped;
    ++i;
    while (!current.empty() && current.back() == out.escape) {
      joined += std::string(current.substr(0, current.size() - 1));
      bool more = false;
      while (i < lines.size()) {
        std::string_view next = trim_right(lines[i]);
        std::string_view next_stripped = trim_left(next);
        ++i;
        if (next_stripped.empty() || next_stripped[0] == '#') continue;
        current = next;
        more = true;
        break;
      }
      if (!more) {
        current = {};
        break;
      }
    }
    joined += std::string(current);

    std::string_view body = trim_left(joined);
    size_t end = 0;
    while (end < body.size() && !is_space(body[end])) ++end;
    in.name = text::upper(body.substr(0, end));
    in.args = std::string(text::trim(body.substr(end)));

    bool supported = false;
    for (const char* s : kSupported) supported = supported || in.name == s;
    if (!supported) {
      for (const auto& r : kRefused)
        if (in.name == r.name) refuse(file, in.line, in.name, r.why);
      refuse(file, in.line, in.name, "unknown instruction");
    }
    finish(&in, file);

    if (in.name == "FROM") {
      if (from_seen)
        refuse(file, in.line, in.name,
               "a second FROM: multi-stage builds are not supported (one FROM per file)");
      from_seen = true;
      out.instructions.push_back(std::move(in));
    } else if (!from_seen) {
      if (in.name != "ARG") refuse(file, in.line, in.name, "comes before FROM (only ARG may)");
      out.global_args.push_back(std::move(in));
    } else {
      out.instructions.push_back(std::move(in));
    }
  }
  if (!from_seen) refuse(file, static_cast<int>(lines.size()), "", "no FROM instruction");
  return out;
}

namespace {

bool is_name_char(char c, bool first) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (!first && c >= '0' && c <= '9');
}

std::string lookup(const std::map<std::string, std::string>& vars, const std::string& name) {
  auto it = vars.find(name);
  return it == vars.end() ? "" : it->second;
}

// Reads a variable reference at text[*i] (just after '$'); appends its value.
void substitute(std::string_view text, size_t* i, const std::map<std::string, std::string>& vars,
                char escape, std::string* out) {
  size_t p = *i;
  if (p < text.size() && text[p] == '{') {
    size_t close = p + 1;
    int depth = 1;
    for (; close < text.size(); ++close) {
      if (text[close] == '{') ++depth;
      if (text[close] == '}' && --depth == 0) break;
    }
    if (close >= text.size()) throw Error("missing '}' in '" + std::string(text) + "'");
    std::string_view inner = text.substr(p + 1, close - p - 1);
    size_t n = 0;
    while (n < inner.size() && is_name_char(inner[n], n == 0)) ++n;
    if (n == 0) throw Error("bad substitution '${" + std::string(inner) + "}'");
    std::string name(inner.substr(0, n));
    std::string_view rest = inner.substr(n);
    const bool set = vars.count(name) > 0;
    const std::string value = lookup(vars, name);
    if (rest.empty()) {
      *out += value;
    } else if (rest.starts_with(":-") || rest.starts_with(":+")) {
      std::string word = expand_word(rest.substr(2), vars, escape);
      if (rest[1] == '-')
        *out += value.empty() ? word : value;
      else
        *out += set && !value.empty() ? word : "";
    } else {
      throw Error("unsupported substitution '${" + std::string(inner) +
                  "}' (use ${NAME}, ${NAME:-word} or ${NAME:+word})");
    }
    *i = close + 1;
    return;
  }
  size_t n = p;
  while (n < text.size() && is_name_char(text[n], n == p)) ++n;
  if (n == p) {
    *out += '$';  // a lone '$' stays
    return;
  }
  *out += lookup(vars, std::string(text.substr(p, n - p)));
  *i = n;
}

// The one lexer behind expand_words and expand_word. split: words at
// unquoted white space, with quotes removed; otherwise one piece, quotes
// kept as they are (JSON elements carry no shell quoting).
std::vector<std::string> lex(std::string_view text, const std::map<std::string, std::string>& vars,
                             char escape, bool split) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size();) {
    char c = text[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
        ++i;
        continue;
      }
      word += c;
      ++i;
      continue;
    }
    if (c == escape && i + 1 < text.size()) {
      // Inside double quotes the escape only escapes what would be special.
      char next = text[i + 1];
      if (quote == '"' && next != '"' && next != '$' && next != escape) {
        word += c;
        ++i;
        continue;
      }
      if (!split && next != '$') word += c;
      word += next;
      in_word = true;
      i += 2;
      continue;
    }
    if (c == '$') {
      ++i;
      substitute(text, &i, vars, escape, &word);
      in_word = true;
      continue;
    }
    if (split && quote == 0 && (c == '"' || c == '\'')) {
      quote = c;
      in_word = true;
      ++i;
      continue;
    }
    if (split && quote == '"' && c == '"') {
      quote = 0;
      ++i;
      continue;
    }
    if (split && quote == 0 && is_space(c)) {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      ++i;
      continue;
    }
    word += c;
    in_word = true;
    ++i;
  }
  if (quote) throw Error(std::string("unterminated ") + (quote == '"' ? "\"" : "'") + " quote");
  if (in_word || !split) words.push_back(std::move(word));
  return words;
}

}  // namespace

std::vector<std::string> expand_words(std::string_view text,
                                      const std::map<std::string, std::string>& vars, char escape) {
  return lex(text, vars, escape, true);
}

std::string expand_word(std::string_view text, const std::map<std::string, std::string>& vars,
                        char escape) {
  return lex(text, vars, escape, false).front();
}

std::vector<std::pair<std::string, std::string>> parse_pairs(
    const Instruction& in, const std::map<std::string, std::string>& vars, char escape) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string_view args = text::trim(in.args);
  const std::vector<std::string> words = expand_words(args, vars, escape);
  // The legacy form: `ENV KEY value with spaces` (no '=' in the first word).
  if (!words.empty() && words[0].find('=') == std::string::npos) {
    if (words.size() < 2) throw Error("expected KEY=VALUE (or KEY VALUE), got '" + words[0] + "'");
    size_t first_end = 0;
    while (first_end < args.size() && !is_space(args[first_end])) ++first_end;
    auto rest = expand_words(text::trim(args.substr(first_end)), vars, escape);
    out.emplace_back(words[0], text::join(rest, " "));
    return out;
  }
  for (const auto& word : words) {
    size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("expected KEY=VALUE, got '" + word + "'");
    out.emplace_back(word.substr(0, eq), word.substr(eq + 1));
  }
  return out;
}

std::pair<std::string, std::optional<std::string>> parse_arg(
    const Instruction& in, const std::map<std::string, std::string>& vars, char escape) {
  auto words = expand_words(in.args, vars, escape);
  if (words.size() != 1) throw Error("expected one NAME or NAME=default");
  const std::string& word = words[0];
  size_t eq = word.find('=');
  std::string name = word.substr(0, eq);
  for (size_t i = 0; i < name.size(); ++i)
    if (!is_name_char(name[i], i == 0)) throw Error("'" + name + "' is not a variable name");
  if (name.empty()) throw Error("'" + word + "' is not a variable name");
  if (eq == std::string::npos) return {name, std::nullopt};
  return {name, word.substr(eq + 1)};
}

std::string where(const std::string& file, const Instruction& in) {
  return file + ":" + std::to_string(in.line) + ": " + in.name;
}

}  // namespace openshell::image
