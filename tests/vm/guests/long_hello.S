# (c) Started straight in long mode by the VMM's boot code, as a kernel is
# (the boot GDT, identity page tables, RSP set). Says "long" and, when
# CPUID leaf 1 has the hypervisor bit, " hypervisor", then asks for a reset.
# Loaded and linked at 0x100000.
        .code64
        .text
        .include "serial.inc"
start:
        lea     message(%rip), %rsi
        call    print
        mov     $1, %eax
        cpuid
        bt      $31, %ecx
        jnc     1f
        lea     hypervisor(%rip), %rsi
        call    print
1:
        lea     newline(%rip), %rsi
        call    print
        jmp     reset

        serial_routines
message:
        .asciz  "long"
hypervisor:
        .asciz  " hypervisor"
newline:
        .asciz  "\n"
