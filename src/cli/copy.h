// Files in and out of a running sandbox: a tar stream through exec, made
// and unpacked here (the sandbox needs a tar: busybox's or GNU's).
#pragma once

#include <string>

#include "base/paths.h"
#include "cli/streams.h"

namespace openshell::cli {

// Copies `local` (a file, a directory with everything below it, or a
// symbolic link) into the sandbox's directory `dest`, as the sandbox's user.
// Returns tar's exit status in the sandbox (0: done). Throws Error.
int upload(const Paths& paths, const std::string& name, const std::string& local,
           const std::string& dest);

// Copies the sandbox's `remote` into the existing directory `local_dir`,
// under its own name, which must not exist there yet. What arrives is
// unpacked as an untrusted archive (nothing outside local_dir, no device
// nodes, owned by the caller) and moved into place only when complete.
int download(const Paths& paths, const std::string& name, const std::string& remote,
             const std::string& local_dir);

// The tar stream upload sends: `local` under its base name (GNU format,
// long names as GNU records; modes without setuid/setgid, owners 0, which
// tar in the sandbox, running unprivileged, replaces with its own). Throws
// Error when `local` cannot be read or fd stops taking bytes.
void write_tar(const std::string& local, int fd);

}  // namespace openshell::cli
