// Files in and out of a running sandbox: a tar stream through exec, made
// and unpacked here (the sandbox needs a tar: busybox's or GNU's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/streams.h"
#include "cli/upload_filter.h"

namespace openshell::cli {

// What upload leaves out, and what it says it copied.
struct UploadOptions {
  bool git_ignore = true;  // leave out what .gitignore says (see upload_filter.h)
  bool verbose = false;    // name each entry copied
  int summary_fd = 1;      // where what was copied is said
};

// What an upload's archive held.
struct UploadStats {
  uint64_t files = 0, directories = 0, links = 0;
  uint64_t bytes = 0;              // of the files' contents
  uint64_t ignored = 0;            // entries left out (a directory counts once)
  std::vector<std::string> names;  // as archived ("src/a.txt"), in order
};

// Copies `local` (a file, a directory with everything below it, or a
// symbolic link) into the sandbox's directory `dest`, as the sandbox's user.
// Returns 0 when done. Throws Error (125) when openshell fails, the sandbox
// has no tar, or the sandbox refused the copy (tar there failed: a
// directory it may not write, a full disk), with one line naming what.
int upload(const GatewayClient& client, const std::string& name, const std::string& local,
           const std::string& dest, const UploadOptions& options);

// "copied 3 files, 1 directory (12 B) into /sandbox; 2 left out by git
// (--no-git-ignore copies them)".
std::string upload_summary(const UploadStats& stats, const std::string& dest,
                           const std::string& filter_how);

// The one line for a refused upload, from what tar in the sandbox wrote
// (its first complaint) and its status: "upload to /usr/x: Permission
// denied".
std::string upload_failure(const std::string& tar_errors, const std::string& dest, int status);

// The same for any tar in the sandbox that worked in `dir`: `prefix`, the
// path it complained about (below dir), and its reason.
std::string tar_failure(const std::string& tar_errors, const std::string& prefix,
                        const std::string& dir, int status);

// Copies the sandbox's `remote` into `local`: into it under its own name
// when `local` is an existing directory, else, as docker cp does, as `local`
// itself, whose parent must exist. What it becomes must not exist yet. What
// arrives is unpacked as an untrusted archive (nothing outside that
// directory, no device nodes, owned by the caller) and moved into place only
// when complete. Throws Error (125), one line, when it cannot be done,
// also when the sandbox's tar refused (a missing or unreadable file).
int download(const GatewayClient& client, const std::string& name, const std::string& remote,
             const std::string& local);

// The tar stream upload sends: `local` under its base name (GNU format,
// long names as GNU records; modes without setuid/setgid, owners 0, which
// tar in the sandbox, running unprivileged, replaces with its own). Throws
// Error when `local` cannot be read or fd stops taking bytes.
// With a filter, the entries below a directory it refuses are left out.
UploadStats write_tar(const std::string& local, int fd, const UploadFilter& keep = {});

}  // namespace openshell::cli
