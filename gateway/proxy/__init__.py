"""One proxied exchange, from admission to the last byte sent to the client.

`job.py` (the validated request the routes build), `admission.py` (the gateway's limits, the
policy's decision and the slot, as one step for the whole gateway), `exchange.py` (the ASGI
response that owns the upstream exchange, its slot and its metrics), `continuation.py` (the request
that has another backend go on with a started stream, and its usage), `cancel.py` (ending the
exchange from outside its task). May import `gateway.runtime` and everything below it.
"""
