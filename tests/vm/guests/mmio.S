# (e) Long mode MMIO, against whatever the test put in the windows:
#   write 0xabcd to window 0 + 0x10, read a byte from window 0 + 0x14 and
#   send it to the serial port; ring window 0's doorbell (7 at 0x50);
#   then a 4-byte write at the address in the first quadword after the
#   code ("target", patched by the test), then a reset request.
        .code64
        .text
        .set    WINDOW0, 0xd0000000
start:
        jmp     code
        .balign 8
target:
        .quad   0
code:
        mov     $WINDOW0, %rdi
        movl    $0xabcd, 0x10(%rdi)
        movb    0x14(%rdi), %al
        mov     $0x3f8, %dx
        outb    %al, %dx
        movl    $7, 0x50(%rdi)
        mov     target(%rip), %rbx
        test    %rbx, %rbx
        jz      reset
        movl    $0x1234, (%rbx)
        mov     $'+', %al
        outb    %al, %dx
reset:
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt
