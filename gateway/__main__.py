"""`python -m gateway` is the `specgate` command (kept for existing callers; `python -m specgate` is the same)."""

from specgate.cli import main

main()
