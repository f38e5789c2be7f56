"""The HTTP surfaces, one module per API: each validates its requests and hands a `ProxyJob` to the proxy.

`openai.py` (chat, completions, models), `responses.py` (the Responses API), `ollama.py` (Ollama's
routes), `native.py` (SGLang's `/generate`, tokenize, abort, flush), `ops.py` (probes, metrics,
admin status, the node's `/v1/loads`, SGLang info pass-through); `jobs.py` is the one request ->
job builder and its checks, `fast_path.py` serves well-formed chat and completions without
FastAPI's route machinery, `schemas.py` the pydantic request bodies. May import every package
below it: `gateway.proxy`, `gateway.dialects`, `gateway.policies`, `gateway.pool`, `gateway.upstream`.
"""
