"""`python -m vnode`."""

from vnode.cli import main

main()
