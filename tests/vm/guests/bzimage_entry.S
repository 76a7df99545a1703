# The protected-mode part of a crafted bzImage (tests/unit/vm_boot_test.cc
# puts the setup sectors in front): its 64-bit entry, at load + 0x200, is
# what the boot protocol says a loader calls, in long mode with RSI =
# boot_params. It prints the command line that boot_params points to
# (hdr.cmd_line_ptr at 0x228) and asks for a reset. Linked at 1 MiB.
        .code64
        .text
        .include "serial.inc"
        hlt                             # load + 0: not the entry
        .org    0x200
entry64:
        cmpl    $0x53726448, 0x202(%rsi)        # "HdrS": RSI is boot_params
        jne     reset
        mov     0x228(%rsi), %esi
        serial_line
reset:
        reset_machine
