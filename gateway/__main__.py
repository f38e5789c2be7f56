"""`python -m gateway` is the `specgate` command."""

from gateway.cli import main

main()
