"""The envelope harness, `python -m loadtest envelope`: specgate against the simulated servers it routes to.

It starts the simulated stack (`backends.sim` behind `specgate serve`), sweeps it with the generic
tool in `loadtest`, and judges specgate's numbers against the direct servers'. The generic tool
never imports this package or the simulator.
"""
