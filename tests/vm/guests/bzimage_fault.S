# A crafted bzImage's protected-mode part (bzimage_setup.S goes in front)
# whose 64-bit entry faults at once: with the boot code's empty IDT, #UD
# becomes a triple fault. The supervisor's tests boot it as a --vm
# sandbox's kernel that misbehaves. Linked at 1 MiB.
        .code64
        .text
        hlt                             # load + 0: not the entry
        .org    0x200
        ud2
