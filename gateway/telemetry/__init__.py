"""What the gateway tells operators about each proxied request, besides its metrics: traces and access logs.

`tracing.py` builds OpenTelemetry spans and sends them over OTLP/HTTP from a thread; `access_log.py`
writes one JSON line per request from a thread, to stdout or to a file rotated by `log_file.py`;
`outcome.py` is how an exchange ended; `record.py` is what the proxy calls: one process's
`Telemetry` (None when both are off) and a sampled exchange's `ExchangeRecord`. May import
`gateway` and `gateway.config`.
"""
