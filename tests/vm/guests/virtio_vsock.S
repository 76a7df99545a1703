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
# MODE=7 is MODE=4 as the init of a copy's VM: "ready 0\n" (no main
# process), and each command's stdout is a tar of one file, hello.txt
# ("from the guest's layer\n"), with exit status 0: what tar -c in the
# guest sends for a download.
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
# is posted again when the next packet is waited for. The driver's routines
# (bring-up, send, receive) are vsock_driver.inc's, shared with (h).
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
        .include "vsock_driver.inc"
        .ifdef  BZIMAGE
        hlt                             # load + 0: not the entry
        .org    0x200
        .endif
start:
        call    vsock_init
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
        .if     MODE == 4 || MODE == 7
        .if     MODE == 7
        lea     ready_none_line(%rip), %rsi
        .else
        lea     ready_line(%rip), %rsi
        .endif
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
        call    print_bytes
        .if     MODE == 2 || MODE == 4 || MODE == 7
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

        .if     MODE == 4 || MODE == 7
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
        call    print_bytes
4:
        mov     $OP_RST, %eax           # done with it, whatever the host says
        xor     %ecx, %ecx
        call    send_on
        lea     done_lines(%rip), %rsi
        mov     $(done_lines_end - done_lines), %ecx
        call    send_text
        jmp     status_end
        .endif

        .balign 4
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
ready_none_line:
        .ascii  "ready 0\n"
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
        .if     MODE == 7
# A command that wrote a tar (a ustar header and one block of content; the
# reader takes its end at a block's edge as the archive's) and exited 0.
exec_answer:
        .byte   16, 0, 0, 0, 1          # started, pid 1
        .ascii  "1"
        .byte   17, 0, 0, 4, 0          # stdout, 1024 bytes
1:
        .ascii  "hello.txt"             # name
        .fill   100 - (. - 1b), 1, 0
        .ascii  "0000644\0"             # mode
        .ascii  "0000000\0"             # uid
        .ascii  "0000000\0"             # gid
        .ascii  "00000000027\0"         # size: 23
        .ascii  "00000000000\0"         # mtime
        .ascii  "007610\0 "             # checksum
        .ascii  "0"                     # a regular file
        .fill   100, 1, 0               # link name
        .ascii  "ustar\0" "00"
        .fill   512 - (. - 1b), 1, 0
2:
        .ascii  "from the guest's layer\n"
        .fill   512 - (. - 2b), 1, 0
        .byte   19, 0, 0, 0, 1          # exited, status 0
        .ascii  "0"
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
