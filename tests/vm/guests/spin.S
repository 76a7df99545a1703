# (f) Long mode: one byte on the serial port, then a loop that never ends
# and never exits to the VMM.
        .code64
        .text
start:
        mov     $0x3f8, %dx
        mov     $'s', %al
        outb    %al, %dx
1:
        jmp     1b
