# (a) Real mode: "hello" on the serial port, then HLT with interrupts off.
# Loaded at 0x10000, started with CS = DS = 0x1000, IP = 0.
        .code16
        .text
start:
        mov     $0x3f8, %dx
        mov     $message, %si
next:
        lodsb
        test    %al, %al
        jz      done
        outb    %al, %dx
        jmp     next
done:
        cli
        hlt
        jmp     done
message:
        .asciz  "hello\n"
