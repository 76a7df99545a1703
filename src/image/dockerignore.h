// .dockerignore: which files of a build context COPY and ADD leave out.
//
// Read as Docker reads it: one pattern a line, '#' lines are comments,
// surrounding white space is dropped, a leading '/' means the context's
// root (every pattern is relative to it anyway), paths are cleaned
// ("a/./b" is "a/b"). A pattern is a glob: '*' any run of characters but
// '/', '?' one character but '/', '[a-z]' a class ('[^...]' negated), '\'
// escapes, and '**' any number of directories (none included). "!pattern"
// takes back what the patterns before it excluded. The last pattern that
// matches a path decides; a path is also excluded when one of its parent
// directories matches.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace openshell::image {

class IgnoreRules {
 public:
  IgnoreRules() = default;
  // The file's text.
  static IgnoreRules parse(std::string_view text);

  // Whether `path` (relative to the context, '/'-separated, no leading
  // '/') is left out.
  bool excluded(std::string_view path) const;
  // Whether some "!" pattern could take back a path below `dir` (then a
  // walk must look inside an excluded directory).
  bool has_exceptions() const { return has_exceptions_; }
  bool empty() const { return rules_.empty(); }

 private:
  struct Rule {
    std::string pattern;
    bool exception = false;
  };
  std::vector<Rule> rules_;
  bool has_exceptions_ = false;
};

// Whether a glob of the kind above matches the whole of `path`.
bool glob_match(std::string_view pattern, std::string_view path);

}  // namespace openshell::image
