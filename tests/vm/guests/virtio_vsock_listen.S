# (h) A virtio-vsock guest that listens, the other way round from (g):
# brought up as (g) is (vsock_driver.inc), with eight rx buffers posted, it
# says "ready\n" and waits for the host to connect to its port 6000; it
# accepts, echoes the first data it gets back to the host and prints it
# with a newline, then waits for the host's shutdown (its end closed),
# answers with an RST and says "OK\n" (or "E" and a letter naming the step
# that failed), then asks for a reset. Interrupts stay off: it polls the
# used rings. Linked at 0x100000.
        .code64
        .text
        .set    GUEST_PORT, 6000
        .set    HOST_PORT, 0            # the peer's, stored at its request
        .set    RX_COUNT, 8
        .set    BUF_ALLOC, 4096
        .include "vsock_driver.inc"
start:
        call    vsock_init
        lea     ready(%rip), %rsi
        call    print

        # The host's request for port 6000; its port is the peer's.
        call    receive
        mov     $'q', %bl
        cmpw    $OP_REQUEST, 30(%rsi)
        jne     fail
        cmpl    $GUEST_PORT, 20(%rsi)   # dst_port
        jne     fail
        movl    16(%rsi), %eax          # src_port
        movl    %eax, host_port(%rip)
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
        add     $44, %rsi
        call    print_bytes
        sub     %rcx, %rsi              # print_bytes moved it past the payload
        call    send_text               # the payload, back

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

ok:
        .asciz  "OK\n"
ready:
        .asciz  "ready\n"
