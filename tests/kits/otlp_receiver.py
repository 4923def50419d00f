"""An OTLP collector inside the test: gRPC (grpcio + opentelemetry-proto's TraceService /
MetricsService servicers) or HTTP (``/v1/traces`` and ``/v1/metrics`` protobuf bodies), on
127.0.0.1 and a free port. It keeps every request it decoded; ``stop()`` makes it go away.
"""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

PROTOCOLS = {"grpc": "grpc", "http": "http/protobuf"}


class Received:
    """What the collector decoded, appended from its server threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []

    def add(self, kind: str, req: Any) -> None:
        with self._lock:
            getattr(self, kind).append(req)

    def spans(self) -> list[tuple[dict, Any]]:
        """``(resource attributes, span)`` for every span received."""
        with self._lock:
            reqs = list(self.traces)
        return [(attributes(rs.resource.attributes), s) for r in reqs for rs in r.resource_spans
                for ss in rs.scope_spans for s in ss.spans]

    def metric_points(self) -> dict[str, list]:
        """Metric name -> every data point received for it."""
        with self._lock:
            reqs = list(self.metrics)
        out: dict[str, list] = {}
        for r in reqs:
            for rm in r.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = getattr(m, m.WhichOneof("data"))
                        out.setdefault(m.name, []).extend(data.data_points)
        return out


def value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as the Python value the SDK was given."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, got: Received) -> None:
        self.got = got

    def Export(self, request, context):  # noqa: N802 - the generated servicer's name
        self.got.add("traces", request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, got: Received) -> None:
        self.got = got

    def Export(self, request, context):  # noqa: N802
        self.got.add("metrics", request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcCollector:
    def __init__(self) -> None:
        self.got = Received()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self.got),
                                                                  self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsService(self.got), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None).wait(timeout=10)


_HTTP_PATHS = {"/v1/traces": ("traces", trace_service_pb2.ExportTraceServiceRequest,
                              trace_service_pb2.ExportTraceServiceResponse),
               "/v1/metrics": ("metrics", metrics_service_pb2.ExportMetricsServiceRequest,
                               metrics_service_pb2.ExportMetricsServiceResponse)}


class HttpCollector:
    def __init__(self) -> None:
        self.got = got = Received()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                route = _HTTP_PATHS.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if route is None:
                    self.send_error(404)
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                kind, req_cls, resp_cls = route
                got.add(kind, req_cls.FromString(body))
                out = resp_cls().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start(protocol: str) -> GrpcCollector | HttpCollector:
    return GrpcCollector() if protocol == "grpc" else HttpCollector()
