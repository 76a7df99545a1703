# The benchmark's guest: its first instruction writes a port (the first
# exit), its third writes a byte to the serial port; then a reset request.
        .code64
        .text
start:
        outb    %al, $0x80
        mov     $'x', %al
        mov     $0x3f8, %dx
        outb    %al, %dx
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt
