// Containerfile (Dockerfile) text -> instructions, as `image build` runs
// them. Pure: no file system, no process.
//
// Read as Docker reads it: parser directives (`# syntax=`, `# escape=`) at
// the top, comments, line continuations with the escape character, the
// instruction's name in any case. Each instruction keeps its arguments as
// written; variables ($VAR, ${VAR}, ${VAR:-word}, ${VAR:+word}) are
// substituted when the build reaches it (expand_words), since ARG and ENV
// change them as it goes, and only in the instructions Docker substitutes
// in (FROM, COPY, ADD, ENV, ARG, LABEL, EXPOSE, WORKDIR, USER): RUN's, CMD's
// and ENTRYPOINT's text is the shell's to expand.
//
// Supported: FROM (one stage), RUN, COPY, ADD (local sources), ENV, ARG,
// WORKDIR, USER, ENTRYPOINT, CMD, LABEL, EXPOSE, SHELL. Anything else is
// refused with "FILE:LINE: NAME: why" (ContainerfileError).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace openshell::image {

// A refusal of the file's text: its what() is "FILE:LINE: NAME: why".
class ContainerfileError : public Error {
 public:
  using Error::Error;
};

struct Instruction {
  int line = 0;                              // where it starts, 1-based
  std::string name;                          // upper case: "RUN"
  std::string args;                          // the text after the name, continuations joined
  bool exec_form = false;                    // RUN, CMD, ENTRYPOINT, SHELL, COPY, ADD: a JSON array
  std::vector<std::string> exec_args;        // its strings
  std::map<std::string, std::string> flags;  // COPY --chown=..., --chmod=...
  // The instruction as the build shows and keys it: "RUN apt-get update".
  std::string text() const;
};

struct Containerfile {
  std::string file;  // for messages
  char escape = '\\';
  std::vector<Instruction> instructions;
  // The ARGs before FROM: their defaults may be used in FROM only.
  std::vector<Instruction> global_args;
};

// Parses text; `file` names it in errors. Throws ContainerfileError.
Containerfile parse_containerfile(std::string_view text, const std::string& file);

// Variable substitution and quote removal, as Docker's word processing does
// it: splits `text` into words at unquoted white space, removes quotes,
// substitutes $VAR, ${VAR}, ${VAR:-word}, ${VAR:+word} (not inside single
// quotes; `escape` escapes the next character). An unknown variable is
// empty. Throws Error (without a place: callers add it) on a malformed
// ${...}.
std::vector<std::string> expand_words(std::string_view text,
                                      const std::map<std::string, std::string>& vars,
                                      char escape = '\\');
// The same substitution on one word, keeping white space (JSON-form
// elements, the value of legacy `ENV KEY value`).
std::string expand_word(std::string_view text, const std::map<std::string, std::string>& vars,
                        char escape = '\\');

// ENV and LABEL: KEY=VALUE pairs (quotes allowed), or the legacy `KEY VALUE
// with spaces`. Substituted. Throws Error.
std::vector<std::pair<std::string, std::string>> parse_pairs(
    const Instruction& instruction, const std::map<std::string, std::string>& vars,
    char escape = '\\');

// ARG NAME[=default]: the name and its default, if any. Throws Error.
std::pair<std::string, std::optional<std::string>> parse_arg(
    const Instruction& instruction, const std::map<std::string, std::string>& vars,
    char escape = '\\');

// "FILE:LINE: NAME: why", for errors found while building.
std::string where(const std::string& file, const Instruction& instruction);

}  // namespace openshell::image
