"""The envelope harness, `python -m loadtest envelope`: specgate against the same GPUs run each other way.

It starts simulated stacks (`backends.sim`, behind `specgate serve`, the least-in-flight balancer
or the SMG router), sweeps them with the generic tool in `loadtest`, and judges specgate's numbers
against the best baseline: by default plain, EAGLE and adaptive data-parallel servers on the same
GPUs, behind the balancer and, where prompts share prefixes, behind SMG too (`fair.py`), or with
`--compare single` the two servers specgate routes to (`harness.py`). The generic tool never
imports this package or the simulator.
"""
