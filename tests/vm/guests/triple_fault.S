# (d) Long mode: an IDT of no entries, then an undefined opcode (UD2). The
# #UD finds no gate (#GP), the #GP none either (#DF), the #DF none: a
# triple fault. (Not int3: PVM emulates it and fails with an internal
# error instead.)
        .code64
        .text
start:
        mov     $0x3f8, %dx
        mov     $'!', %al
        outb    %al, %dx
        lidt    empty_idt(%rip)
        ud2
        hlt
        .balign 8
empty_idt:
        .word   0
        .quad   0
