"""`python -m rldojo ...` is the `rldojo` command (torchrun launches ranks this way:
`torchrun --nproc-per-node 2 -m rldojo sft CONFIG`)."""

from rldojo.cli import main

main()
