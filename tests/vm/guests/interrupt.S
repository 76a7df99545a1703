# Long mode: an interrupt through the in-kernel IOAPIC and LAPIC. The
# IOAPIC pin is the quadword after the first jump (patched by the test):
# pin 4 is the serial port (the guest enables its transmit-empty
# interrupt), any other pin is a device in window 0 (the guest writes 1 at
# offset 0x60 and the test's device raises its interrupt eventfd). The
# handler, at vector 0x30, writes "irq" and asks for a reset; without the
# interrupt the guest halts forever.
        .code64
        .text
        .set    IOAPIC, 0xfec00000
        .set    LAPIC, 0xfee00000
        .set    VECTOR, 0x30
start:
        jmp     code
        .balign 8
pin:
        .quad   4
code:
        # The IDT gate for VECTOR: handler's address in three pieces,
        # selector 0x10 (the boot GDT's 64-bit code), present interrupt gate.
        lea     idt(%rip), %rdi
        add     $(VECTOR * 16), %rdi
        lea     handler(%rip), %rax
        mov     %ax, (%rdi)
        movw    $0x10, 2(%rdi)
        movw    $0x8e00, 4(%rdi)
        shr     $16, %rax
        mov     %ax, 6(%rdi)
        shr     $16, %rax
        mov     %eax, 8(%rdi)
        movl    $0, 12(%rdi)
        lidt    idt_descriptor(%rip)

        # Both 8259s masked: KVM resets the BSP's LINT0 to ExtINT, so an
        # unprogrammed PIC would deliver IRQ 4 (and the PIT's IRQ 0) at its
        # vector base 0, where exceptions live.
        mov     $0xff, %al
        outb    %al, $0x21
        outb    %al, $0xa1
        # The LAPIC on (spurious vector register: enable | 0xff).
        mov     $LAPIC, %rbx
        movl    $0x1ff, 0xf0(%rbx)
        # IOAPIC redirection entry of the pin: VECTOR, fixed, physical,
        # edge, unmasked, to APIC id 0.
        mov     $IOAPIC, %rbx
        mov     pin(%rip), %rcx
        lea     0x10(,%rcx,2), %eax
        movl    %eax, (%rbx)
        movl    $VECTOR, 0x10(%rbx)
        inc     %eax
        movl    %eax, (%rbx)
        movl    $0, 0x10(%rbx)
        sti

        cmp     $4, %rcx
        jne     device
        mov     $0x3f9, %dx             # IER: transmit-empty interrupt
        mov     $0x02, %al
        outb    %al, %dx
        jmp     wait
device:
        mov     $0xd0000000, %rbx
        movl    $1, 0x60(%rbx)
wait:
        hlt
        jmp     wait

handler:
        mov     $0x3f9, %dx             # interrupts off at the port again
        xor     %al, %al
        outb    %al, %dx
        mov     $0x3f8, %dx
        mov     $'i', %al
        outb    %al, %dx
        mov     $'r', %al
        outb    %al, %dx
        mov     $'q', %al
        outb    %al, %dx
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt

        .balign 8
idt_descriptor:
        .word   256 * 16 - 1
        .quad   idt
        .balign 16
idt:
        .fill   256 * 16, 1, 0
