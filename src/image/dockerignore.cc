#include "image/dockerignore.h"

#include "base/text.h"

namespace openshell::image {

namespace {

// "./a//b/../c/" -> "a/c" (".." above the root is dropped, as Go's
// filepath.Clean does for a rooted path).
std::string clean(std::string_view path) {
  std::vector<std::string> parts;
  for (const auto& part : text::split(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  return text::join(parts, "/");
}

// One character class at p[*i] ('[' already seen); whether c is in it.
// *ok false for a malformed class.
bool class_match(std::string_view p, size_t* i, char c, bool* ok) {
  size_t j = *i;
  bool negate = j < p.size() && (p[j] == '^' || p[j] == '!');
  if (negate) ++j;
  bool matched = false;
  bool first = true;
  while (j < p.size() && (first || p[j] != ']')) {
    first = false;
    char lo = p[j];
    if (lo == '\\' && j + 1 < p.size()) lo = p[++j];
    char hi = lo;
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      hi = p[j + 2];
      if (hi == '\\' && j + 3 < p.size()) {
        hi = p[j + 3];
        ++j;
      }
      j += 2;
    }
    if (c >= lo && c <= hi) matched = true;
    ++j;
  }
  if (j >= p.size()) {
    *ok = false;
    return false;
  }
  *i = j + 1;
  return matched != negate;
}

bool match_from(std::string_view p, size_t pi, std::string_view s, size_t si) {
  while (pi < p.size()) {
    char c = p[pi];
    if (c == '*') {
      if (pi + 1 < p.size() && p[pi + 1] == '*') {
        // "**": any number of directories. "**/" may also match nothing.
        size_t next = pi + 2;
        if (next < p.size() && p[next] == '/') {
          if (match_from(p, next + 1, s, si)) return true;
          for (size_t k = si; k < s.size(); ++k)
            if (s[k] == '/' && match_from(p, next + 1, s, k + 1)) return true;
          return false;
        }
        for (size_t k = si; k <= s.size(); ++k)
          if (match_from(p, next, s, k)) return true;
        return false;
      }
      for (size_t k = si; k <= s.size(); ++k) {
        if (match_from(p, pi + 1, s, k)) return true;
        if (k < s.size() && s[k] == '/') break;
      }
      return false;
    }
    if (si >= s.size()) return false;
    if (c == '?') {
      if (s[si] == '/') return false;
      ++pi;
      ++si;
      continue;
    }
    if (c == '[') {
      size_t j = pi + 1;
      bool ok = true;
      bool in = class_match(p, &j, s[si], &ok);
      if (!ok || !in || s[si] == '/') return false;
      pi = j;
      ++si;
      continue;
    }
    if (c == '\\' && pi + 1 < p.size()) c = p[++pi];
    if (c != s[si]) return false;
    ++pi;
    ++si;
  }
  return si == s.size();
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view path) {
  return match_from(pattern, 0, path, 0);
}

IgnoreRules IgnoreRules::parse(std::string_view text) {
  IgnoreRules rules;
  for (const auto& raw : text::split(text, '\n')) {
    std::string_view line = text::trim(raw);
    if (line.empty() || line[0] == '#') continue;
    Rule rule;
    if (line[0] == '!') {
      rule.exception = true;
      line = text::trim(line.substr(1));
    }
    rule.pattern = clean(line);
    if (rule.pattern.empty()) continue;
    rules.has_exceptions_ = rules.has_exceptions_ || rule.exception;
    rules.rules_.push_back(std::move(rule));
  }
  return rules;
}

bool IgnoreRules::excluded(std::string_view path) const {
  const std::string cleaned = clean(path);
  bool out = false;
  for (const auto& rule : rules_) {
    // The path itself, or one of its parents.
    bool matched = glob_match(rule.pattern, cleaned);
    for (size_t k = cleaned.find('/'); !matched && k != std::string::npos;
         k = cleaned.find('/', k + 1))
      matched = glob_match(rule.pattern, std::string_view(cleaned).substr(0, k));
    if (matched) out = !rule.exception;
  }
  return out;
}

}  // namespace openshell::image
