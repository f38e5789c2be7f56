"""The backends and what the gateway knows of them.

`backends.py` (each backend's health and exact in-flight count, the `Pool`, the `Slot` a routed
request holds), `snapshot.py` (the immutable view a policy decides on), `board.py` (what the
gateway's workers share, one process or many), `health.py` (the health checker),
`engine_load.py` and `node_load.py` (the engines' own load reports in, the node's out),
`affinity.py` (which backend holds a stored response or runs a native rid). May import
`gateway.upstream`, `gateway.config` and the `gateway` package's version.
"""
