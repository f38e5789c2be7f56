"""One module per API family's wire format, each a `Dialect` the proxy carries a request in.

`openai.py` (chat and text completions; the base `Dialect`), `responses.py` (the Responses API),
`ollama.py` (Ollama's routes), `native.py` (SGLang's `/generate`, and its body parser). A dialect
says where a body names its output limit, what is added upstream, where token counts live, how a
stream is relayed and how errors reach the client. May import `gateway.relay`, `gateway.edge`,
`gateway.upstream`, `gateway.errors` and `gateway.tiers`.
"""
