# (f) A virtio-blk driver loop over MMIO, started in long mode like (c): it
# finds a version-2 virtio-blk device in window 0, negotiates VERSION_1,
# sets up queue 0 (8 entries) in its own RAM, writes sector 1 with 512 bytes
# of 'V', reads it back into another buffer, compares, and says "OK\n" (or
# "E" and a letter naming the step that failed), then asks for a reset.
# Interrupts stay off: it polls the used ring. Loaded and linked at 0x100000.
        .code64
        .text
        .include "serial.inc"
        .set    WINDOW0, 0xd0000000
        .set    DESC, 0x200000          # the descriptor table (8 x 16 bytes)
        .set    AVAIL, 0x201000         # the available ring
        .set    USED, 0x202000          # the used ring
        .set    HEADER, 0x203000        # a request's 16-byte header
        .set    WRITTEN, 0x204000       # the sector written
        .set    STATUS, 0x205000        # a request's status byte
        .set    READ, 0x206000          # the sector read back
start:
        mov     $WINDOW0, %rdi
        mov     $'m', %bl
        cmpl    $0x74726976, 0x00(%rdi) # "virt"
        jne     fail
        mov     $'v', %bl
        cmpl    $2, 0x04(%rdi)          # version 2
        jne     fail
        mov     $'d', %bl
        cmpl    $2, 0x08(%rdi)          # block device
        jne     fail

        movl    $0, 0x70(%rdi)          # reset
        movl    $1, 0x70(%rdi)          # ACKNOWLEDGE
        movl    $3, 0x70(%rdi)          # DRIVER
        movl    $1, 0x24(%rdi)          # DriverFeaturesSel = 1
        movl    $1, 0x20(%rdi)          # VERSION_1 (bit 32)
        movl    $0, 0x24(%rdi)
        movl    $0, 0x20(%rdi)
        movl    $11, 0x70(%rdi)         # FEATURES_OK
        mov     $'f', %bl
        testl   $8, 0x70(%rdi)
        jz      fail

        movl    $0, 0x30(%rdi)          # QueueSel = 0
        movl    $8, 0x38(%rdi)          # QueueNum
        movl    $DESC, 0x80(%rdi)
        movl    $0, 0x84(%rdi)
        movl    $AVAIL, 0x90(%rdi)
        movl    $0, 0x94(%rdi)
        movl    $USED, 0xa0(%rdi)
        movl    $0, 0xa4(%rdi)
        movl    $1, 0x44(%rdi)          # QueueReady
        movl    $15, 0x70(%rdi)         # DRIVER_OK
        mov     $'q', %bl
        cmpl    $1, 0x44(%rdi)
        jne     fail

        # The sector to write: 512 bytes of 'V'.
        push    %rdi
        mov     $WRITTEN, %rdi
        mov     $'V', %al
        mov     $512, %ecx
        rep stosb
        pop     %rdi

        # OUT, sector 1: descriptors 0 (header) -> 1 (data, readable) -> 2 (status).
        mov     $1, %eax
        mov     $0, %r8d
        call    header
        mov     $0, %esi
        mov     $WRITTEN, %edx
        mov     $1, %ecx                # the data is device-readable: NEXT only
        call    request
        mov     $'w', %bl
        cmpb    $0, STATUS
        jne     fail

        # IN, sector 1: descriptors 3 -> 4 (data, writable) -> 5.
        mov     $0, %eax
        call    header
        mov     $3, %esi
        mov     $READ, %edx
        mov     $3, %ecx                # NEXT | WRITE
        call    request
        mov     $'r', %bl
        cmpb    $0, STATUS
        jne     fail

        mov     $'c', %bl
        push    %rdi
        mov     $WRITTEN, %rsi
        mov     $READ, %rdi
        mov     $512, %ecx
        repe cmpsb
        pop     %rdi
        jne     fail

        # The used-buffer interrupt was raised (the IOAPIC pin stays masked).
        mov     $'i', %bl
        testl   $1, 0x60(%rdi)
        jz      fail
        movl    $1, 0x64(%rdi)          # InterruptACK

        lea     ok(%rip), %rsi
        call    print
        jmp     reset

# The header at HEADER: type %eax, sector 1.
header:
        movl    %eax, HEADER
        movl    $0, HEADER + 4
        movq    $1, HEADER + 8
        ret

# One request in descriptors %esi, %esi+1, %esi+2: HEADER, 512 bytes at
# %edx with flags %ecx, STATUS; made available, notified, waited for.
request:
        movb    $0xff, STATUS
        mov     %esi, %eax
        shl     $4, %eax
        add     $DESC, %eax             # &desc[%esi]
        movq    $HEADER, (%rax)
        movl    $16, 8(%rax)
        movw    $1, 12(%rax)            # NEXT
        lea     1(%esi), %r9d
        movw    %r9w, 14(%rax)
        movq    %rdx, 16(%rax)
        movl    $512, 24(%rax)
        movw    %cx, 28(%rax)
        lea     2(%esi), %r9d
        movw    %r9w, 30(%rax)
        movq    $STATUS, 32(%rax)
        movl    $1, 40(%rax)
        movw    $2, 44(%rax)            # WRITE
        movw    $0, 46(%rax)
        movzwl  AVAIL + 2, %eax         # the available index
        mov     %eax, %r9d
        and     $7, %r9d
        movw    %si, AVAIL + 4(,%r9,2)  # ring[idx % 8] = head
        inc     %eax
        sfence
        movw    %ax, AVAIL + 2
        mfence
        movl    $0, 0x50(%rdi)          # QueueNotify: queue 0
1:
        pause
        cmpw    %ax, USED + 2           # wait for the used index to catch up
        jne     1b
        ret

        serial_routines
ok:
        .asciz  "OK\n"
