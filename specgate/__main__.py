"""`python -m specgate` is the `specgate` command."""

from specgate.cli import main

main()
