"""An OTLP/HTTP traces endpoint inside the test process: it decodes each export's protobuf, as a collector does."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class OtlpReceiver:
    """Serves POST /v1/traces on a free loopback port until `close`; `spans` holds what arrived."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []  # (resource attributes, span)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                receiver._take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans += [(resource, span) for span in scope_spans.spans]

    def trace(self, trace_id: str) -> dict[str, Span]:
        """The spans of trace `trace_id` (hex) by name (each name once per request here)."""
        with self._lock:
            return {span.name: span for _, span in self.spans if span.trace_id.hex() == trace_id}

    def resources(self, trace_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [resource for resource, span in self.spans if span.trace_id.hex() == trace_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP key-value pairs as a dict of plain values (a list for an array)."""
    return {kv.key: _value(kv.value) for kv in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind is not None else None
