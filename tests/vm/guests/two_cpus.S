# (g) Both vCPUs enter here in long mode. Each sends its APIC id (CPUID
# leaf 1, EBX[31:24]) as a digit, then counts itself in; vCPU 0 waits for
# both and asks for a reset.
        .code64
        .text
start:
        mov     $1, %eax
        cpuid
        shr     $24, %ebx
        mov     %ebx, %eax
        add     $'0', %al
        mov     $0x3f8, %dx
        outb    %al, %dx
        lock incl arrived(%rip)
        test    %ebx, %ebx
        jnz     park
wait:
        pause
        cmpl    $2, arrived(%rip)
        jne     wait
        mov     $'\n', %al
        outb    %al, %dx
        mov     $0xfe, %al
        outb    %al, $0x64
park:
        cli
        hlt
        jmp     park
        .balign 4
arrived:
        .long   0
