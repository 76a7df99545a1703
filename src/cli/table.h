// Plain-text tables for the commands' default output.
#pragma once

#include <string>
#include <vector>

namespace openshell::cli {

// Prints rows (the first is the header) as columns three spaces apart.
void print_table(const std::vector<std::vector<std::string>>& rows);

}  // namespace openshell::cli
