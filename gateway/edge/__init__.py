"""Bytes to ASGI: what the gateway's HTTP server does before any route runs.

`http_protocol.py` (uvicorn's httptools protocol with a bound on the request head, OpenAI-shaped
parse errors, slow clients timed out and the per-client connection cap), `read_deadline.py` (one
timer per connection for the head and body timeouts), `client_cap.py` (the cap's client keys and
counts), `body_writer.py` (a synchronous body writer the server offers each request),
`client_watch.py` (hearing that a client left), `body_limit.py` and `auth.py` (pure ASGI
middleware), `descriptors.py` (the open-file budget). May import `gateway.config`,
`gateway.errors` and `backends.fdlimit` only.
"""
