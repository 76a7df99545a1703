# (h) A virtio-vsock guest that listens, the other way round from (g):
# brought up as (g) does, with eight rx buffers posted, it says "ready\n"
# and waits for the host to connect to its port 6000; it accepts, echoes
# the first data it gets back to the host and prints it with a newline,
# then waits for the host's shutdown (its end closed), answers with an RST
# and says "OK\n" (or "E" and a letter naming the step that failed), then
# asks for a reset. Interrupts stay off: it polls the used rings. Linked
# at 0x100000.
        .code64
        .text
        .set    WINDOW0, 0xd0000000
        .set    RX_DESC, 0x200000
        .set    RX_AVAIL, 0x201000
        .set    RX_USED, 0x202000
        .set    TX_DESC, 0x210000
        .set    TX_AVAIL, 0x211000
        .set    TX_USED, 0x212000
        .set    RX_BUFFERS, 0x230000    # eight of 256 bytes
        .set    TX_PACKET, 0x240000     # the packet being sent
        .set    OP_REQUEST, 1
        .set    OP_RESPONSE, 2
        .set    OP_RST, 3
        .set    OP_SHUTDOWN, 4
        .set    OP_RW, 5
start:
        mov     $WINDOW0, %rdi
        mov     $'m', %bl
        cmpl    $0x74726976, 0x00(%rdi)
        jne     fail
        mov     $'d', %bl
        cmpl    $19, 0x08(%rdi)         # socket device
        jne     fail

        movl    $0, 0x70(%rdi)
        movl    $1, 0x70(%rdi)
        movl    $3, 0x70(%rdi)
        movl    $1, 0x24(%rdi)
        movl    $1, 0x20(%rdi)          # VERSION_1
        movl    $0, 0x24(%rdi)
        movl    $0, 0x20(%rdi)
        movl    $11, 0x70(%rdi)
        mov     $'f', %bl
        testl   $8, 0x70(%rdi)
        jz      fail
        mov     $0, %eax
        mov     $RX_DESC, %ecx
        call    queue
        mov     $1, %eax
        mov     $TX_DESC, %ecx
        call    queue
        movl    $15, 0x70(%rdi)         # DRIVER_OK

        # Eight rx buffers: descriptor i -> RX_BUFFERS + 256 * i, writable.
        xor     %ecx, %ecx
1:
        mov     %ecx, %eax
        shl     $4, %eax
        mov     %ecx, %edx
        shl     $8, %edx
        add     $RX_BUFFERS, %edx
        movq    %rdx, RX_DESC(%rax)
        movl    $256, RX_DESC + 8(%rax)
        movw    $2, RX_DESC + 12(%rax)  # WRITE
        movw    %cx, RX_AVAIL + 4(,%rcx,2)
        inc     %ecx
        cmp     $8, %ecx
        jne     1b
        sfence
        movw    $8, RX_AVAIL + 2
        mfence
        movl    $0, 0x50(%rdi)          # notify the rx queue
        lea     ready(%rip), %rsi
        call    print

        # The host's request for port 6000; its port is the peer's.
        call    receive
        mov     $'q', %bl
        cmpw    $OP_REQUEST, 30(%rsi)
        jne     fail
        cmpl    $6000, 20(%rsi)         # dst_port
        jne     fail
        movl    16(%rsi), %eax          # src_port
        movl    %eax, peer(%rip)
        mov     $OP_RESPONSE, %eax
        xor     %ecx, %ecx
        call    send

2:
        call    receive                 # the host's data (credit updates skipped)
        mov     $'w', %bl
        cmpw    $OP_RW, 30(%rsi)
        jne     2b
        movl    24(%rsi), %ecx          # len
        cmp     $200, %ecx
        ja      fail
        push    %rcx
        push    %rdi
        add     $44, %rsi
        mov     $TX_PACKET + 44, %rdi
        rep movsb                       # the payload, to send back
        pop     %rdi
        pop     %rcx
        mov     $TX_PACKET + 44, %rsi
        push    %rcx
        mov     $0x3f8, %dx
3:
        test    %ecx, %ecx
        jz      4f
        lodsb
        outb    %al, %dx
        dec     %ecx
        jmp     3b
4:
        mov     $'\n', %al
        outb    %al, %dx
        pop     %rcx
        mov     $OP_RW, %eax
        call    send

5:
        call    receive                 # the host's end closed
        mov     $'s', %bl
        cmpw    $OP_RW, 30(%rsi)
        je      fail
        cmpw    $OP_SHUTDOWN, 30(%rsi)
        jne     5b
        mov     $OP_RST, %eax
        xor     %ecx, %ecx
        call    send
        lea     ok(%rip), %rsi
        call    print
        jmp     reset

# Queue %eax with its descriptors at %ecx, the available ring 4 KiB on and
# the used ring 8 KiB on; 8 entries.
queue:
        movl    %eax, 0x30(%rdi)
        movl    $8, 0x38(%rdi)
        movl    %ecx, 0x80(%rdi)
        movl    $0, 0x84(%rdi)
        add     $0x1000, %ecx
        movl    %ecx, 0x90(%rdi)
        movl    $0, 0x94(%rdi)
        add     $0x1000, %ecx
        movl    %ecx, 0xa0(%rdi)
        movl    $0, 0xa4(%rdi)
        movl    $1, 0x44(%rdi)
        ret

# Sends op %eax with %ecx payload bytes (already at TX_PACKET + 44) from
# guest port 6000 to the host's port in `peer`, and waits until the device
# took it.
send:
        movq    $3, TX_PACKET           # src_cid
        movq    $2, TX_PACKET + 8       # dst_cid
        movl    $6000, TX_PACKET + 16   # src_port
        movl    peer(%rip), %edx
        movl    %edx, TX_PACKET + 20    # dst_port
        movl    %ecx, TX_PACKET + 24    # len
        movw    $1, TX_PACKET + 28      # type: stream
        movw    %ax, TX_PACKET + 30     # op
        movl    $4096, TX_PACKET + 36   # buf_alloc
        movl    received(%rip), %eax
        movl    %eax, TX_PACKET + 40    # fwd_cnt
        movzwl  TX_AVAIL + 2, %eax      # one descriptor a packet, reused
        movq    $TX_PACKET, TX_DESC
        add     $44, %ecx
        movl    %ecx, TX_DESC + 8
        movw    $0, TX_DESC + 12
        mov     %eax, %edx
        and     $7, %edx
        movw    $0, TX_AVAIL + 4(,%rdx,2)
        inc     %eax
        sfence
        movw    %ax, TX_AVAIL + 2
        mfence
        movl    $1, 0x50(%rdi)          # notify the tx queue
1:
        pause
        cmpw    %ax, TX_USED + 2
        jne     1b
        movl    $0, TX_PACKET + 32      # flags back to none
        ret

# Waits for the next used rx buffer; %rsi = its address.
receive:
        movzwl  seen(%rip), %eax
1:
        pause
        cmpw    %ax, RX_USED + 2
        je      1b
        mov     %eax, %edx
        and     $7, %edx
        movl    RX_USED + 4(,%rdx,8), %esi   # the used element's id
        shl     $8, %esi
        add     $RX_BUFFERS, %esi
        inc     %eax
        movw    %ax, seen(%rip)
        movl    24(%rsi), %eax
        addl    %eax, received(%rip)
        ret

fail:
        lea     error(%rip), %rsi
        call    print
        mov     %bl, %al
        outb    %al, %dx
        mov     $'\n', %al
        outb    %al, %dx
reset:
        mov     $0xfe, %al
        outb    %al, $0x64
        hlt

print:
        mov     $0x3f8, %dx
1:
        lodsb
        test    %al, %al
        jz      2f
        outb    %al, %dx
        jmp     1b
2:
        ret

        .balign 4
peer:
        .long   0
seen:
        .long   0
received:
        .long   0
ok:
        .asciz  "OK\n"
ready:
        .asciz  "ready\n"
error:
        .asciz  "E"
