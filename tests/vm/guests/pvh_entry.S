# The code of a crafted PVH vmlinux (tests/unit/vm_boot_test.cc wraps it in
# an ELF with the XEN_ELFNOTE_PHYS32_ENTRY note): entered as the PVH ABI
# says, in 32-bit protected mode with paging off and EBX = hvm_start_info.
# Checks the start info's magic, prints its command line (cmdline_paddr at
# offset 24) and asks for a reset. Linked at 1 MiB.
        .code32
        .text
        .include "serial.inc"
entry32:
        cmpl    $0x336ec578, (%ebx)
        jne     reset
        mov     24(%ebx), %esi
        serial_line
reset:
        reset_machine
