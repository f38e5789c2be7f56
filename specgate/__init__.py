"""The `specgate` command: the composition root that assembles every subcommand.

Only this package may depend on all of `gateway`, `backends` and the simulator at once; none of
them imports it.
"""
