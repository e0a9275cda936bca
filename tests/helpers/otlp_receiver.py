"""A minimal OTLP/gRPC trace receiver: the collector's ``TraceService/Export`` on 127.0.0.1, keeping what it
receives. Built on the protocol's own service definition (``opentelemetry-proto``), so the router's real
OTLP exporter talks to it exactly as to a collector. Used by the tracing tests and
``benchmarks/bench_tracing.py``; ``python tests/helpers/otlp_receiver.py PORT`` runs one in its own process
and prints the span count on SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, object]
    service_name: str


def _value(any_value: object) -> object:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return None if kind is None else getattr(any_value, kind)


@dataclass
class _Store:
    spans: list[ReceivedSpan] = field(default_factory=list)
    count: int = 0
    exports: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, store: _Store, keep: bool) -> None:
        self.store = store
        self.keep = keep

    def Export(  # the protocol's name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received: list[ReceivedSpan] = []
        count = 0
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                count += len(scope_spans.spans)
                if not self.keep:
                    continue
                for span in scope_spans.spans:
                    received.append(_span(span, service))
        with self.store.lock:
            self.store.exports += 1
            self.store.count += count
            self.store.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()


def _span(span: trace_pb2.Span, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        kind=span.kind,
        attributes={a.key: _value(a.value) for a in span.attributes},
        service_name=service,
    )


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` … ``receiver.endpoint`` (``http://127.0.0.1:PORT``),
    ``receiver.spans()``. ``keep=False`` only counts (a benchmark's receiver)."""

    def __init__(self, port: int = 0, *, keep: bool = True) -> None:
        self._store = _Store()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        service = _TraceService(self._store, keep)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            service, self._server
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[ReceivedSpan]:
        with self._store.lock:
            return list(self._store.spans)

    def count(self) -> int:
        with self._store.lock:
            return self._store.count

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)


def main() -> None:
    receiver = OtlpReceiver(int(sys.argv[1]), keep=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with receiver:
        print(f"listening on {receiver.endpoint}", flush=True)
        stop.wait()
    print(f"spans {receiver.count()}", flush=True)


if __name__ == "__main__":
    main()
