"""`python -m loadtest ...`."""

from loadtest.cli import main

main()
