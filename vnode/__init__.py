"""vnode: a node of simulated SGLang servers in virtual time, to judge routing without HTTP or a wall clock.

The real-time simulator's engine cores (`backends.sim.core`) step on discrete-event GPU timelines
(`events`, `gpu`); the load tool's plans are run by virtual clients (`clients`) against a target's
`node`: K servers behind the least-in-flight balancer, or specgate's K co-located groups routed by
the gateway's own pool and policy (`gateway_router`), any `router.Router` in general; `requests`
is a request as routers see it, `draws` per-request acceptance draws. `targets` builds the four
same-hardware targets from the real-time envelope's configuration, `envelope` runs them and judges
specgate as the envelope does. `family` is a family of synthetic profiles, `family_sweep` its sweep,
`family_report` its verdict; `cli` is `python -m vnode`. docs/vnode.md has the whole story.
"""
