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
#
# MODE=4 is the init's exec side: it sends "ready 1\n", then serves the
# host's connections to its port 1024 one after the other: each gets the
# frames of a command that ran (runtime/guest_init.h: started "1", stdout
# "hi from the guest\n", stderr "to stderr\n", exited "3") once the host's
# first data (its exec frame) came; the rest the host sends is consumed,
# and its shutdown is answered with an RST. A line on the status stream (a
# stop) is printed and answered as MODE=2 does.
# MODE=5 is a sandbox's curl as the init relays it to the proxy: from
# reserved port 1001 to host port 3128 it sends the identity line naming
# /usr/bin/curl and a GET for http://blocked.invalid/, prints the first
# packet of the answer (at most 200 bytes; "closed" when the host closes
# instead), resets the connection and sends "ready 1\nexit 0\n". MODE=6
# is MODE=5 from port 5000, which the supervisor must refuse. With
# --defsym BUSYBOX=1 the identity line names /bin/busybox instead, the file
# a busybox image's applet links (/usr/bin/wget) lead to.
#
# Packets come for several connections in these modes: the status stream's
# (the main one) counts what it received in fwd_cnt; the others say 0 and
# live off buf_alloc (64 KiB, more than a test sends them). Each rx buffer
# is posted again when the next packet is waited for.
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
        .if     MODE == 3 || MODE == 0
        .set    GUEST_PORT, 5000
        .else
        .set    GUEST_PORT, 1000
        .endif
        .set    EXEC_PORT, 1024         # the init's, the host connects to it
        .set    EGRESS_PORT, 3128       # the host's proxy
        .if     MODE == 5
        .set    EGRESS_FROM, 1001
        .else
        .set    EGRESS_FROM, 5000
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
        .if     MODE == 4
        lea     ready_line(%rip), %rsi
        mov     $8, %ecx
        call    send_text
        jmp     exec_loop
        .endif
        .if     MODE == 5 || MODE == 6
        jmp     egress
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
print_answer:
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
        .if     MODE == 2 || MODE == 4
        lea     stopped_line(%rip), %rsi
        mov     $9, %ecx
        call    send_text
        .endif
6:
status_end:
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

        .if     MODE == 4
# The exec side: a packet to port 1000 is the status stream's, one to 1024
# an exec connection's; exec_peer is the host's port of the one served.
exec_loop:
        call    receive
        cmpl    $GUEST_PORT, 20(%rsi)   # dst_port
        jne     1f
        cmpw    $OP_RW, 30(%rsi)
        jne     exec_loop               # a credit update
        jmp     print_answer            # the stop line
1:
        cmpl    $EXEC_PORT, 20(%rsi)
        jne     exec_loop
        movl    16(%rsi), %r10d         # src_port: the host's
        mov     $EXEC_PORT, %r9d
        movzwl  30(%rsi), %edx          # op
        cmp     $OP_REQUEST, %edx
        jne     2f
        movl    %r10d, exec_peer(%rip)
        movb    $0, answered(%rip)
        mov     $OP_RESPONSE, %eax
        xor     %ecx, %ecx
        call    send_on
        jmp     exec_loop
2:
        cmpl    %r10d, exec_peer(%rip)
        jne     exec_loop               # not the connection served
        cmp     $OP_RW, %edx
        jne     3f
        cmpb    $0, answered(%rip)
        jne     exec_loop               # more of the exec frame, stdin, eof
        movb    $1, answered(%rip)
        lea     exec_answer(%rip), %rsi
        mov     $(exec_answer_end - exec_answer), %ecx
        call    send_text_on
        jmp     exec_loop
3:
        cmp     $OP_SHUTDOWN, %edx
        jne     exec_loop               # an RST or a credit update: nothing to answer
        mov     $OP_RST, %eax
        xor     %ecx, %ecx
        call    send_on
        movl    $0, exec_peer(%rip)
        jmp     exec_loop
        .endif

        .if     MODE == 5 || MODE == 6
# The egress connection: what the init's relay sends for a sandbox's curl.
egress:
        mov     $EGRESS_FROM, %r9d
        mov     $EGRESS_PORT, %r10d
        mov     $'e', %bl
        mov     $OP_REQUEST, %eax
        xor     %ecx, %ecx
        call    send_on
1:
        call    receive
        cmpl    $EGRESS_FROM, 20(%rsi)
        jne     1b
        cmpw    $OP_RESPONSE, 30(%rsi)
        jne     fail
        lea     identity(%rip), %rsi
        mov     $(identity_end - identity), %ecx
        call    send_text_on
        lea     request(%rip), %rsi
        mov     $(request_end - request), %ecx
        call    send_text_on
2:
        call    receive
        cmpl    $EGRESS_FROM, 20(%rsi)
        jne     2b
        cmpw    $OP_RW, 30(%rsi)
        je      3f
        cmpw    $OP_SHUTDOWN, 30(%rsi)
        je      5f
        cmpw    $OP_RST, 30(%rsi)
        jne     2b                      # a credit update
5:
        lea     closed(%rip), %rsi
        call    print
        jmp     4f
3:
        movl    24(%rsi), %ecx          # len, clamped to what a line shows
        cmp     $200, %ecx
        jbe     6f
        mov     $200, %ecx
6:
        add     $44, %rsi
        mov     $0x3f8, %dx
        rep outsb
        mov     $'\n', %al
        outb    %al, %dx
4:
        mov     $OP_RST, %eax           # done with it, whatever the host says
        xor     %ecx, %ecx
        call    send_on
        lea     done_lines(%rip), %rsi
        mov     $(done_lines_end - done_lines), %ecx
        call    send_text
        jmp     status_end
        .endif

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
# GUEST_PORT to HOST_PORT (the main connection), and waits until the device
# took it; send_on: from guest port %r9d to host port %r10d.
send:
        mov     $GUEST_PORT, %r9d
        mov     $HOST_PORT, %r10d
send_on:
        movq    $3, TX_PACKET           # src_cid
        movq    $2, TX_PACKET + 8       # dst_cid
        movl    %r9d, TX_PACKET + 16    # src_port
        movl    %r10d, TX_PACKET + 20   # dst_port
        movl    %ecx, TX_PACKET + 24    # len
        movw    $1, TX_PACKET + 28      # type: stream
        movw    %ax, TX_PACKET + 30     # op
        movl    $0x10000, TX_PACKET + 36   # buf_alloc
        xor     %eax, %eax
        cmp     $GUEST_PORT, %r9d
        jne     2f
        movl    received(%rip), %eax
2:
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

# Sends the %ecx bytes at %rsi as one OP_RW packet on the main connection;
# send_text_on: on send_on's.
send_text:
        mov     $GUEST_PORT, %r9d
        mov     $HOST_PORT, %r10d
send_text_on:
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
        jmp     send_on

# Posts the last rx buffer again (its packet has been dealt with), then
# waits for the next used one; %rsi = its address.
receive:
        movl    last(%rip), %eax
        cmp     $4, %eax
        jae     2f                      # none yet
        movzwl  RX_AVAIL + 2, %edx
        mov     %edx, %r8d
        and     $7, %r8d
        movw    %ax, RX_AVAIL + 4(,%r8,2)
        inc     %edx
        sfence
        movw    %dx, RX_AVAIL + 2
        mfence
        movl    $0, 0x50(%rdi)          # notify the rx queue
2:
        movzwl  seen(%rip), %eax
1:
        pause
        cmpw    %ax, RX_USED + 2
        je      1b
        mov     %eax, %edx
        and     $7, %edx
        movl    RX_USED + 4(,%rdx,8), %esi   # the used element's id
        movl    %esi, last(%rip)
        shl     $8, %esi
        add     $RX_BUFFERS, %esi
        inc     %eax
        movw    %ax, seen(%rip)
        cmpl    $GUEST_PORT, 20(%rsi)   # dst_port: the main connection's?
        jne     3f
        movl    24(%rsi), %eax
        addl    %eax, received(%rip)
3:
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
last:
        .long   4                       # the rx buffer last used; 4: none
exec_peer:
        .long   0
answered:
        .byte   0
ok:
        .asciz  "OK\n"
exit_lines:
        .ascii  "ready 1\nexit 7\n"
ready_line:
        .ascii  "ready 1\n"
stopped_line:
        .ascii  "exit 143\n"
        .if     MODE == 4
# The frames of a command that ran: TYPE, LENGTH (big-endian), BYTES.
exec_answer:
        .byte   16, 0, 0, 0, 1          # started, pid 1
        .ascii  "1"
        .byte   17, 0, 0, 0, 18         # stdout
        .ascii  "hi from the guest\n"
        .byte   18, 0, 0, 0, 10         # stderr
        .ascii  "to stderr\n"
        .byte   19, 0, 0, 0, 1          # exited, status 3
        .ascii  "3"
exec_answer_end:
        .endif
        .if     MODE == 5 || MODE == 6
identity:
        .ifdef  BUSYBOX
        .ascii  "{\"pid\":7,\"exe\":\"/bin/busybox\",\"untrusted\":\"\"}\n"
        .else
        .ascii  "{\"pid\":7,\"exe\":\"/usr/bin/curl\",\"untrusted\":\"\"}\n"
        .endif
identity_end:
request:
        .ascii  "GET http://blocked.invalid/ HTTP/1.1\r\nHost: blocked.invalid\r\n\r\n"
request_end:
done_lines:
        .ascii  "ready 1\nexit 0\n"
done_lines_end:
closed:
        .asciz  "closed\n"
        .endif
error:
        .asciz  "E"
