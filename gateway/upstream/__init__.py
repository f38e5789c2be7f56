"""The HTTP/1.1 client to the backends: one long-lived pooled client per backend.

`client.py` is what the rest of the gateway calls (`UpstreamClient`); `connection_pool.py` the
bounded keep-alive pool under it, `http11.py` one exchange on one connection, and `errors.py` every
failure they raise. May import `gateway.config` only.
"""
