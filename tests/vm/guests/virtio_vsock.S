# (g) A virtio-vsock driver loop over MMIO, started in long mode like (c):
# it finds a version-2 vsock device (id 19) in window 0, negotiates
# VERSION_1, sets up the rx and tx queues (8 entries) in its own RAM, posts
# four rx buffers, connects from port 5000 to the host's port 1024, sends
# "ping", prints the payload of the host's answer and a newline, shuts the
# connection down both ways, waits for the RST that confirms it and says
# "OK\n" (or "E" and a letter naming the step that failed), then asks for a
# reset. Interrupts stay off: it polls the used rings. Linked at 0x100000.
#
# Assembled with --defsym MODE=1 or 2 it is instead a guest's init as the
# supervisor of a --vm sandbox hears it on the status stream (host port
# 1025), from reserved port 1000: MODE=1 sends "ready 1\nexit 7\n" and
# ends; MODE=2 sends "ready 1\n", prints the host's next line (a stop) and
# answers "exit 143\n"; MODE=3 sends MODE=1's lines from port 5000, which
# the supervisor must refuse. With --defsym BZIMAGE=1 its entry is at +0x200, where a
# bzImage's 64-bit entry is (bzimage_setup.S is put in front), and it looks
# for the vsock device in every window, since the supervisor's VMM puts the
# disks first.
        .code64
        .text
        .ifndef MODE
        .set    MODE, 0
        .endif
        .if     MODE
        .set    HOST_PORT, 1025
        .else
        .set    HOST_PORT, 1024
        .endif
        # The init connects from a reserved port (runtime/guest_relay.h);
        # MODE=3 is MODE=1 from an ordinary one, as a sandbox process would.
        .if     MODE == 1 || MODE == 2
        .set    GUEST_PORT, 1000
        .else
        .set    GUEST_PORT, 5000
        .endif
        .ifdef  BZIMAGE
        hlt                             # load + 0: not the entry
        .org    0x200
        .endif
        .set    WINDOW0, 0xd0000000
        .set    RX_DESC, 0x200000
        .set    RX_AVAIL, 0x201000
        .set    RX_USED, 0x202000
        .set    TX_DESC, 0x210000
        .set    TX_AVAIL, 0x211000
        .set    TX_USED, 0x212000
        .set    RX_BUFFERS, 0x230000    # four of 256 bytes
        .set    TX_PACKET, 0x240000     # the packet being sent
        .set    OP_REQUEST, 1
        .set    OP_RESPONSE, 2
        .set    OP_RST, 3
        .set    OP_SHUTDOWN, 4
        .set    OP_RW, 5
start:
        mov     $WINDOW0, %rdi
        .ifdef  BZIMAGE
        mov     $'d', %bl
        mov     $32, %ecx
0:
        cmpl    $0x74726976, 0x00(%rdi)
        jne     fail
        cmpl    $19, 0x08(%rdi)         # socket device
        je      5f
        add     $0x1000, %rdi
        dec     %ecx
        jnz     0b
        jmp     fail
5:
        .else
        mov     $'m', %bl
        cmpl    $0x74726976, 0x00(%rdi)
        jne     fail
        mov     $'d', %bl
        cmpl    $19, 0x08(%rdi)         # socket device
        jne     fail
        .endif
        mov     $'c', %bl
        cmpl    $3, 0x100(%rdi)         # guest_cid
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

        # Four rx buffers: descriptor i -> RX_BUFFERS + 256 * i, writable.
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
        cmp     $4, %ecx
        jne     1b
        sfence
        movw    $4, RX_AVAIL + 2
        mfence
        movl    $0, 0x50(%rdi)          # notify the rx queue

        mov     $'q', %bl
        mov     $OP_REQUEST, %eax
        xor     %ecx, %ecx
        call    send
        call    receive
        mov     $'r', %bl
        cmpw    $OP_RESPONSE, 30(%rsi)
        jne     fail

        .if     MODE == 1 || MODE == 3
        lea     exit_lines(%rip), %rsi
        mov     $15, %ecx
        call    send_text
        jmp     6f
        .endif
        .if     MODE == 2
        lea     ready_line(%rip), %rsi
        mov     $8, %ecx
        call    send_text
        .else
        mov     $OP_RW, %eax
        mov     $4, %ecx
        movl    $0x676e6970, TX_PACKET + 44   # "ping"
        call    send
        .endif
2:
        call    receive                 # the answer (credit updates skipped)
        mov     $'w', %bl
        cmpw    $OP_RW, 30(%rsi)
        jne     2b
        movl    24(%rsi), %ecx          # len
        cmp     $200, %ecx
        ja      fail
        add     $44, %rsi
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
        .if     MODE == 2
        lea     stopped_line(%rip), %rsi
        mov     $9, %ecx
        call    send_text
        .endif
6:
        mov     $OP_SHUTDOWN, %eax
        xor     %ecx, %ecx
        movl    $3, TX_PACKET + 32      # flags: RECEIVE | SEND
        call    send
        mov     $'s', %bl
7:
        call    receive                 # a credit update may come first
        cmpw    $OP_RST, 30(%rsi)
        jne     7b
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
# guest port 5000 to host port 1024, and waits until the device took it.
send:
        movq    $3, TX_PACKET           # src_cid
        movq    $2, TX_PACKET + 8       # dst_cid
        movl    $GUEST_PORT, TX_PACKET + 16   # src_port
        movl    $HOST_PORT, TX_PACKET + 20   # dst_port
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

# Sends the %ecx bytes at %rsi as one OP_RW packet.
send_text:
        push    %rcx
        lea     TX_PACKET + 44, %rdx
        mov     %rdx, %r8
1:
        movb    (%rsi), %al
        movb    %al, (%r8)
        inc     %rsi
        inc     %r8
        dec     %ecx
        jnz     1b
        pop     %rcx
        mov     $OP_RW, %eax
        jmp     send

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
seen:
        .long   0
received:
        .long   0
ok:
        .asciz  "OK\n"
exit_lines:
        .ascii  "ready 1\nexit 7\n"
ready_line:
        .ascii  "ready 1\n"
stopped_line:
        .ascii  "exit 143\n"
error:
        .asciz  "E"
