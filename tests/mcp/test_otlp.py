"""OTLP span export through the real binary: a collector stand-in (an HTTP
server on loopback taking `POST /v1/traces`, decoded with the
OpenTelemetry project's own protobuf classes) receives a traced call's
span with the client's trace id, its span as the parent and the audit
record's span id and seq; an untraced or unsampled call sends nothing;
with no endpoint configured no connection is ever made; a dead collector
fails no call and is counted; a pane cannot reach the collector."""

import contextlib
import http.server
import os
import re
import socket
import threading
import time

import httpx2
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

from conftest import audit_records, call, connect, http_server, runtime_dir_of, serve_pids

pytestmark = pytest.mark.anyio

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{PARENT}-01"
UNSAMPLED = f"00-{'1' * 32}-{PARENT}-00"
NO_OTEL = {k: "" for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")}


class Collector:
    """An OTLP/HTTP collector stand-in on 127.0.0.1: every accepted
    connection counted, every request kept (path, content type, body)."""

    def __init__(self, status=200, retry_after=None):
        self.requests, self.connections, self.headers = [], 0, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.requests.append((self.path, self.headers.get("content-type"), body))
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("retry-after", str(retry_after))
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        class Server(http.server.ThreadingHTTPServer):
            def get_request(self):
                outer.connections += 1
                return super().get_request()

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self):
        out = []
        for path, ctype, body in self.requests:
            assert path == "/v1/traces" and ctype == "application/x-protobuf", (path, ctype)
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                svc = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append((svc, s))
        return out

    def wait_spans(self, n, timeout=15):
        end = time.monotonic() + timeout
        while time.monotonic() < end and len(self.spans()) < n:
            time.sleep(0.05)
        return self.spans()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.stop()


def attrs(span):
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.int_value if v.HasField("int_value") else v.string_value
    return out


async def test_a_traced_call_is_one_span_under_the_clients_trace_joined_to_its_audit_record(ws, collector):
    async with connect(ws, "--otlp-endpoint", collector.url, env=NO_OTEL) as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        r = await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED, "tracestate": "rojo=00f067aa0ba902b7"})
        assert not r.is_error
        # The same channel without a sampled context: no span.
        await call(c, "list_panes")
        await c.call_tool("list_windows", {}, meta={"traceparent": UNSAMPLED})
        spans = collector.wait_spans(1)
        time.sleep(0.5)
        spans = collector.spans()
    assert len(spans) == 1, [s.name for _, s in spans]
    svc, span = spans[0]
    rec = next(r for r in audit_records(ws) if r.get("trace_id") == TRACE)
    assert svc == "sandmux" and span.name == "list_windows"
    assert span.trace_id.hex() == TRACE == rec["trace_id"]
    assert span.parent_span_id.hex() == PARENT == rec["parent_span_id"]
    assert span.span_id.hex() == rec["span_id"]
    assert span.trace_state == "rojo=00f067aa0ba902b7"
    assert span.kind == span.SPAN_KIND_SERVER and span.end_time_unix_nano >= span.start_time_unix_nano > 0
    a = attrs(span)
    assert a == {"sandmux.tool": "list_windows", "sandmux.outcome": "ok", "sandmux.instance": iid, "sandmux.audit.seq": rec["seq"]}, a


async def test_the_standard_variable_turns_export_on_and_without_any_endpoint_nothing_connects(ws, collector):
    # Positive control: OTEL_EXPORTER_OTLP_ENDPOINT alone, spans arrive.
    # The client leaves at once: the span, still waiting for its batch,
    # is sent as serve ends (its flush).
    async with connect(ws, env={**NO_OTEL, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}) as c:
        await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
    assert len(collector.wait_spans(1, timeout=3)) == 1
    seen = collector.connections
    # No flag, no variable: the same traced calls make no connection at all.
    async with connect(ws, env=NO_OTEL) as c:
        for _ in range(3):
            await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
        time.sleep(1.5)
    time.sleep(0.5)
    assert collector.connections == seen and len(collector.spans()) == 1


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_dead_collector_fails_no_call_and_is_counted_and_logged_once(ws):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from test_metrics import families, scrape

    dead = f"http://127.0.0.1:{closed_port()}"
    with http_server(ws, "--otlp-endpoint", dead, env=NO_OTEL) as (url, token, proc):
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as h, Client(streamable_http_client(url, http_client=h), mode="legacy") as c:
            for _ in range(3):
                r = await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
                assert not r.is_error
        # Spans wait up to a second for their batch: poll the counters.
        end = time.monotonic() + 15
        while time.monotonic() < end:
            fam = families(scrape(url, token).text)
            otlp = {dict(k[1])["result"]: v for k, v in fam["sandmux_otlp_spans"].items()}
            if otlp["failed"] >= 3:
                break
            time.sleep(0.1)
        proc.terminate()
        proc.wait(timeout=30)
        log = proc.stderr.read()
    assert otlp["failed"] == 3 and otlp["exported"] == 0 and otlp["dropped"] == 0, otlp
    assert len(re.findall(r"OTLP export to http://127\.0\.0\.1:\d+/v1/traces failed", log)) == 1, log


async def test_an_unusable_endpoint_stops_serve_with_the_fix(ws):
    from conftest import BIN

    import subprocess

    work, host = ws
    for url, words in [("https://127.0.0.1:4318", "https is not supported"), ("127.0.0.1:4318", "not an http:// URL")]:
        p = subprocess.run([BIN, "serve", "-w", str(work), "--audit-log", str(host / "a.jsonl"), "--otlp-endpoint", url], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, **NO_OTEL})
        assert p.returncode == 2 and words in p.stderr and "http://127.0.0.1:4318" in p.stderr, p.stderr


DIAL = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED || echo REFUSED"


async def test_a_pane_cannot_reach_the_collector(ws, collector):
    from test_escape import host_net, profile

    # The attack: a pane dials the collector's port; export goes on.
    async with connect(ws, "--otlp-endpoint", collector.url, env=NO_OTEL) as c:
        r = await call(c, "run_command", {"command": DIAL.format(port=collector.port), "timeout": 20})
        await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
        spans = collector.wait_spans(1)
    assert "REFUSED" in r["output"] and "CONNECTED" not in r["output"], r
    # The supervisor reached it (one connection per batch); the pane did not.
    assert len(spans) == 1 and collector.connections == len(collector.requests) == 1
    # Positive control: a profile that opens the port to the sandbox (host
    # network, the port allowed) and the same probe connects and is seen.
    prof = profile(ws, "otlp-open", host_net(collector.port))
    async with connect(ws, "-p", prof, env=NO_OTEL) as c:
        r = await call(c, "run_command", {"command": DIAL.format(port=collector.port), "timeout": 20})
        time.sleep(0.3)
    assert "CONNECTED" in r["output"], r
    assert collector.connections == 2 and len(collector.requests) == 1


@pytest.mark.skipif(__import__("shutil").which("gdb") is None, reason="gdb is not installed (.ci/run installs it)")
async def test_the_supervisor_may_connect_to_the_collectors_port_and_no_other(ws, collector):
    """Code injected into serve's main thread (gdb, as in
    test_self_confinement.py) dials another loopback listener: refused, the
    listener sees nothing. Control: the same shell line to the collector's
    port connects (the one port export added); with export off it does not."""
    import anyio

    from test_self_confinement import inject

    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    other.settimeout(0.5)
    dial = "(int)system(\"bash -c 'echo hi >/dev/tcp/127.0.0.1/{}'\")"
    try:
        async with connect(ws, "--otlp-endpoint", collector.url, env=NO_OTEL) as c:
            await call(c, "list_sessions")
            pid = serve_pids(ws[0])[0]
            calls = [dial.format(other.getsockname()[1]), dial.format(collector.port)]
            got, out = await anyio.to_thread.run_sync(inject, pid, calls, 1)
            assert (await call(c, "run_command", {"command": "echo alive"}))["output"] == "alive"
        assert got[0][0][0] != 0, ("connected to another port", out)
        with pytest.raises(socket.timeout):
            other.accept()
        assert got[1][0][0] == 0 and collector.connections == 1, ("the control did not connect", got, out)
        # Export off: the collector's port is closed to serve like any other.
        async with connect(ws, env=NO_OTEL) as c:
            await call(c, "list_sessions")
            got, out = await anyio.to_thread.run_sync(inject, serve_pids(ws[0])[0], calls[1:], 1)
        assert got[0][0][0] != 0 and collector.connections == 1, ("connected with export off", got, out)
    finally:
        other.close()


async def test_a_throttling_collector_never_stalls_serve(ws):
    # The attack (or a collector shedding load): every export answered 503
    # with Retry-After: 5. A retry would sleep on serve's one runtime thread
    # and stop every call (and the proxy) for the five seconds; calls made
    # while the batch is being answered must still return at once.
    # (Against the exporter's default retry policy this test fails: the
    # calls after the batch take about 5 s and the collector sees 4 requests.)
    slow = Collector(status=503, retry_after=5)
    try:
        async with connect(ws, "--otlp-endpoint", slow.url, env=NO_OTEL) as c:
            await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
            end = time.monotonic() + 10
            while time.monotonic() < end and not slow.requests:
                time.sleep(0.05)
            assert slow.requests, "the batch was never sent"
            worst = 0.0
            for _ in range(15):
                t = time.monotonic()
                await c.call_tool("list_windows", {})
                worst = max(worst, time.monotonic() - t)
                time.sleep(0.1)
        assert worst < 1.0, worst
        assert len(slow.requests) == 1, len(slow.requests)
    finally:
        slow.stop()


async def test_headers_from_the_environment_never_reach_the_collector(ws, collector):
    # An operator's shell may carry another vendor's key for its own tools.
    env = {**NO_OTEL, "OTEL_EXPORTER_OTLP_HEADERS": "api-key=vendor-secret", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-trace-key=also-secret"}
    async with connect(ws, "--otlp-endpoint", collector.url, env=env) as c:
        await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
    assert len(collector.wait_spans(1, timeout=5)) == 1
    (h,) = collector.headers
    assert "api-key" not in h and "x-trace-key" not in h, h
    assert set(h) <= {"host", "content-type", "content-length"}, h


async def test_the_environments_off_switches_and_an_unusable_endpoint_leave_export_off(ws, collector):
    for extra in ({"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}):
        async with connect(ws, env={**NO_OTEL, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, **extra}) as c:
            await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
        time.sleep(0.5)
        assert collector.connections == 0, extra
    # An https endpoint from the environment: serve runs, export stays off.
    async with connect(ws, env={**NO_OTEL, "OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4318"}) as c:
        r = await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
        assert not r.is_error
    # Positive control: the same variable without a switch turns it on.
    async with connect(ws, env={**NO_OTEL, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_SDK_DISABLED": "false"}) as c:
        await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
    assert len(collector.wait_spans(1, timeout=5)) == 1


async def test_a_pane_on_the_host_network_cannot_reach_the_collectors_port(ws, collector):
    from test_escape import host_net, profile

    # The sandbox shares the host's network and may connect to another
    # port; export is on, so the supervisor may reach the collector's port:
    # the pane must not.
    other = closed_port()
    prof = profile(ws, "otlp-other", host_net(other))
    async with connect(ws, "-p", prof, "--otlp-endpoint", collector.url, env=NO_OTEL) as c:
        r = await call(c, "run_command", {"command": DIAL.format(port=collector.port), "timeout": 20})
        await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
        spans = collector.wait_spans(1)
    assert "REFUSED" in r["output"] and "CONNECTED" not in r["output"], r
    assert len(spans) == 1 and collector.connections == 1


async def test_without_landlock_tcp_rules_export_is_refused_never_widened(ws, collector):
    import subprocess

    from conftest import BIN
    from test_escape import profile

    def pin(abi):
        return lambda t: t.replace("[enforcement]\n", f"[enforcement]\nlandlock_abi = {abi}\n", 1)

    work, host = ws
    # ABI 3 has no TCP port rules: serve must refuse, not drop its Landlock
    # layer or let every port through (even with `supervisor` best-effort).
    weak = profile(ws, "otlp-abi3", lambda t: pin(3)(t).replace('best_effort = ["cgroup"]', 'best_effort = ["cgroup", "supervisor"]'))
    p = subprocess.run([BIN, "serve", "-w", str(work), "-p", weak, "--audit-log", str(host / "a.jsonl"), "--otlp-endpoint", collector.url], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, **NO_OTEL})
    assert p.returncode == 2 and "OTLP export needs Landlock ABI 4" in p.stderr, p.stderr
    assert collector.connections == 0
    # Positive control: pinned at 4, the same export works.
    ok = profile(ws, "otlp-abi4", lambda t: pin(4)(t).replace('best_effort = ["cgroup"]', 'best_effort = ["cgroup", "landlock-scope"]'))
    async with connect(ws, "-p", ok, "--otlp-endpoint", collector.url, env=NO_OTEL) as c:
        await c.call_tool("list_windows", {}, meta={"traceparent": SAMPLED})
    assert len(collector.wait_spans(1, timeout=5)) == 1
