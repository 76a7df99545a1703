# (c) Started straight in long mode by the VMM's boot code, as a kernel is
# (the boot GDT, identity page tables, RSP set). Says "long" and, when
# CPUID leaf 1 has the hypervisor bit, " hypervisor", then asks for a reset.
# Loaded and linked at 0x100000.
        .code64
        .text
start:
        lea     message(%rip), %rsi
        call    print
        mov     $1, %eax
        cpuid
        bt      $31, %ecx
        jnc     reset
        lea     hypervisor(%rip), %rsi
        call    print
reset:
        lea     newline(%rip), %rsi
        call    print
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt

print:
        mov     $0x3f8, %dx
1:
        lodsb
        test    %al, %al
        jz      2f
        outb    %al, %dx
        jmp     1b
2:
        ret

message:
        .asciz  "long"
hypervisor:
        .asciz  " hypervisor"
newline:
        .asciz  "\n"
