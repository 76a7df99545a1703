# The setup sectors of a crafted bzImage (boot protocol 2.15, one setup
# sector, relocatable, a 64-bit entry), to be put in front of a guest
# linked at 1 MiB whose entry is at +0x200: the supervisor's tests boot
# such a file as a --vm sandbox's kernel.
        .code16
        .text
        .org    0x1f1
        .byte   1                       # setup_sects
        .org    0x1fe
        .word   0xaa55
        .byte   0xeb, 0x66              # the header runs to 0x268
        .ascii  "HdrS"
        .word   0x020f                  # version
        .org    0x211
        .byte   1                       # loadflags: LOADED_HIGH
        .org    0x22c
        .long   0x7fffffff              # initrd_addr_max
        .long   0x200000                # kernel_alignment
        .byte   1                       # relocatable_kernel
        .org    0x236
        .word   1                       # xloadflags: XLF_KERNEL_64
        .long   2047                    # cmdline_size
        .org    0x260
        .long   0x100000                # init_size
        .org    0x400
