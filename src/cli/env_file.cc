#include "cli/env_file.h"

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/files.h"
#include "cli/run_options.h"

namespace openshell::cli {

std::vector<std::string> read_env_file(const std::string& path) {
  std::string content;
  if (int err = files::read_into(path, &content); err != 0)
    throw Error("--env-file " + path + ": " + std::strerror(err));
  std::vector<std::string> entries;
  size_t line_number = 0;
  for (size_t start = 0; start < content.size();) {
    size_t end = content.find('\n', start);
    if (end == std::string::npos) end = content.size();
    std::string line = content.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    line.erase(0, first);
    const std::string key = line.substr(0, line.find('='));
    if (key.empty() || key.find_first_of(" \t") != std::string::npos)
      throw Error("--env-file " + path + ":" + std::to_string(line_number) + ": '" + line +
                  "' is not KEY=VALUE or KEY");
    entries.push_back(line);
  }
  return entries;
}

std::vector<std::string> environment_entries(const std::vector<std::string>& env_files,
                                             const std::vector<std::string>& env) {
  std::vector<std::string> all;
  for (const auto& file : env_files) {
    auto entries = read_env_file(file);
    all.insert(all.end(), entries.begin(), entries.end());
  }
  all.insert(all.end(), env.begin(), env.end());
  // One entry a key, where it first came, with the last value given.
  std::vector<std::string> out;
  for (auto& entry : env_entries(all)) {
    const size_t key_end = entry.find('=') + 1;
    bool replaced = false;
    for (auto& existing : out)
      if (existing.compare(0, key_end, entry, 0, key_end) == 0) {
        existing = entry;
        replaced = true;
        break;
      }
    if (!replaced) out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace openshell::cli
