"""`python -m backends.sim ...`: the same command as `specgate sim ...` (the supervisor starts it so)."""

from backends.sim.cli import sim_command

sim_command(prog_name="python -m backends.sim")
