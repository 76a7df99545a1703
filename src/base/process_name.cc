#include "base/process_name.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cstring>

namespace openshell::process_name {

void set_comm(std::string_view name) {
  char comm[16] = {};
  std::memcpy(comm, name.data(), std::min(name.size(), sizeof comm - 1));
  ::prctl(PR_SET_NAME, comm, 0, 0, 0);
}

std::vector<std::string> role_arguments(int argc, const char* const* argv) {
  if (argc < 1 || !argv[0]) return {};
  std::string_view self = argv[0];
  if (auto slash = self.rfind('/'); slash != std::string_view::npos) self.remove_prefix(slash + 1);
  std::vector<std::string> words;
  int rest = 1;
  if (self == kGateway) {
    words = {"openshell", "gateway", "run"};
  } else if (self == kSupervisor) {
    words = {"openshell", "supervisor"};
    rest = 2;  // past the sandbox's name
  } else {
    return {};
  }
  for (int i = rest; i < argc; ++i) words.emplace_back(argv[i]);
  return words;
}

}  // namespace openshell::process_name
