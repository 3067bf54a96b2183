"""OTLP receiver for the agent's tests: OTLP/HTTP (protobuf) on /v1/logs and /v1/metrics and
OTLP/gRPC (LogsService, MetricsService), decoded with the official opentelemetry-proto classes.
Each request is appended to OUT as one JSON line: {"transport", "signal", "request",
"headers"} where request is MessageToDict of the Export*ServiceRequest and headers the
request's HTTP headers / gRPC metadata (lower-case names). HTTP bodies with
`Content-Encoding: gzip` are decompressed (and the encoding kept in headers).

usage: otlp_receiver.py OUT HTTP_PORT [GRPC_PORT [CERT KEY]]
  CERT KEY: serve gRPC over TLS with this PEM certificate chain and key.
"""
import gzip, json, sys, threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb, logs_service_pb2_grpc as lgrpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb, metrics_service_pb2_grpc as mgrpc

OUT = sys.argv[1]
LOCK = threading.Lock()
KINDS = {"/v1/logs": ("logs", lpb.ExportLogsServiceRequest, lpb.ExportLogsServiceResponse),
         "/v1/metrics": ("metrics", mpb.ExportMetricsServiceRequest, mpb.ExportMetricsServiceResponse)}


def record(transport, signal, req, headers):
    line = json.dumps({"transport": transport, "signal": signal, "request": MessageToDict(req),
                       "headers": headers})
    with LOCK, open(OUT, "a") as f:
        f.write(line + "\n")


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        kind = KINDS.get(self.path)
        if kind is None:
            self.send_error(404)
            return
        req = kind[1]()
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        req.ParseFromString(body)
        record("http", kind[0], req, {k.lower(): v for k, v in self.headers.items()})
        body = kind[2]().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Logs(lgrpc.LogsServiceServicer):
    def Export(self, request, context):
        record("grpc", "logs", request, dict(context.invocation_metadata()))
        return lpb.ExportLogsServiceResponse()


class Metrics(mgrpc.MetricsServiceServicer):
    def Export(self, request, context):
        record("grpc", "metrics", request, dict(context.invocation_metadata()))
        return mpb.ExportMetricsServiceResponse()


if len(sys.argv) > 3:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    lgrpc.add_LogsServiceServicer_to_server(Logs(), server)
    mgrpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    if len(sys.argv) > 5:
        with open(sys.argv[4], "rb") as c, open(sys.argv[5], "rb") as k:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        server.add_secure_port("127.0.0.1:" + sys.argv[3], creds)
    else:
        server.add_insecure_port("127.0.0.1:" + sys.argv[3])
    server.start()
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Http).serve_forever()
