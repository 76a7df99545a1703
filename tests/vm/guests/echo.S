# Long mode: the serial port's receiver, polled. Every byte received is
# sent back; a newline ends the VM with a reset request.
        .code64
        .text
start:
        mov     $0x3fd, %dx             # LSR
wait:
        inb     %dx, %al
        test    $0x01, %al              # data ready
        jz      wait
        mov     $0x3f8, %dx
        inb     %dx, %al
        outb    %al, %dx
        cmp     $'\n', %al
        je      reset
        mov     $0x3fd, %dx
        jmp     wait
reset:
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt
