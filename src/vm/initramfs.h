// The guest's initramfs: a cpio archive in the "newc" format the kernel
// unpacks into its first root file system (Documentation/driver-api/
// early-userspace/buffer-format.rst), optionally gzip-compressed.
//
// The micro-VM's holds /init (this same static binary, run as PID 1 in the
// guest as `openshell __guest-init`) and the sandbox's guest configuration.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace openshell::vm::initramfs {

struct Entry {
  enum class Type { kDirectory, kFile, kSymlink, kCharDevice };
  Type type = Type::kFile;
  std::string path;      // relative, no leading "/", no "." or ".." parts
  uint32_t mode = 0644;  // permission bits only
  std::string data;      // a file's content, or a link's target
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t dev_major = 0;  // a character device's numbers
  uint32_t dev_minor = 0;
};

// The archive: the entries in order, then the "TRAILER!!!" record. Each
// record's header and data are padded to 4 bytes. Throws Error naming an
// entry whose path is empty, absolute, has "." or ".." parts, or is over
// 4095 bytes, or whose data is over 4 GiB.
std::string write(const std::vector<Entry>& entries);

// gzip (RFC 1952) of bytes, as the kernel's RD_GZIP reads it.
std::string gzip(std::string_view bytes);

// The micro-VM's initramfs: /init (mode 0755) holding init_binary's bytes,
// /dev/console (c 5 1: the kernel opens it as init's stdin, stdout and
// stderr before it runs /init), /etc, /proc, /sys, /mnt and the guest configuration at
// /etc/openshell-guest.json (mode 0600). Gzip-compressed when compress.
// Throws Error when init_binary cannot be read.
std::string for_guest(const std::string& init_binary, std::string_view guest_config, bool compress);

inline constexpr std::string_view kConfigPath = "etc/openshell-guest.json";

// for_guest in two archives that the kernel reads one after the other
// (__vmm --initramfs twice): what depends only on the binary, which a
// host makes once and keeps, and the guest's configuration, made at each
// start. Uncompressed.
std::string init_archive(const std::string& init_binary);
std::string config_archive(std::string_view guest_config);

}  // namespace openshell::vm::initramfs
