# (b) Real mode to protected mode to long mode by itself: its own GDT, its
# own page tables (1 GiB identity-mapped in 2 MiB pages at 0x30000), then
# "long mode" on the serial port and a reset request (i8042 pulse).
# Loaded at 0x10000 (BASE), started with CS = DS = 0x1000, IP = 0; linked
# at 0, so a linear address is BASE + label.
        .set    BASE, 0x10000
        .set    PML4, 0x30000
        .code16
        .text
start:
        cli
        lgdtl   gdt_descriptor
        mov     %cr0, %eax
        or      $1, %eax                # PE
        mov     %eax, %cr0
        ljmpl   $0x08, $(BASE + protected)

        .code32
protected:
        mov     $0x10, %ax
        mov     %ax, %ds
        mov     %ax, %es
        mov     %ax, %ss
        # Zero three pages: PML4, PDPT, PD.
        mov     $PML4, %edi
        xor     %eax, %eax
        mov     $(3 * 4096 / 4), %ecx
        rep stosl
        movl    $(PML4 + 0x1000 + 3), PML4
        movl    $(PML4 + 0x2000 + 3), PML4 + 0x1000
        # 512 entries of 2 MiB pages: present, writable, large.
        mov     $(PML4 + 0x2000), %edi
        mov     $0x83, %eax
        mov     $512, %ecx
fill:
        mov     %eax, (%edi)
        movl    $0, 4(%edi)
        add     $0x200000, %eax
        add     $8, %edi
        loop    fill
        mov     $PML4, %eax
        mov     %eax, %cr3
        mov     %cr4, %eax
        or      $0x20, %eax             # PAE
        mov     %eax, %cr4
        mov     $0xc0000080, %ecx       # EFER
        rdmsr
        or      $0x100, %eax            # LME
        wrmsr
        mov     %cr0, %eax
        or      $0x80000000, %eax       # PG
        mov     %eax, %cr0
        ljmp    $0x18, $(BASE + long)

        .code64
long:
        mov     $0x3f8, %dx
        lea     message(%rip), %rsi
next:
        lodsb
        test    %al, %al
        jz      reset
        outb    %al, %dx
        jmp     next
reset:
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt

        .balign 8
gdt:
        .quad   0
        .quad   0x00cf9a000000ffff      # 0x08: 32-bit code
        .quad   0x00cf92000000ffff      # 0x10: data
        .quad   0x00af9a000000ffff      # 0x18: 64-bit code
gdt_end:
gdt_descriptor:
        .word   gdt_end - gdt - 1
        .long   BASE + gdt
message:
        .asciz  "long mode\n"
