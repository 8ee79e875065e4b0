"""Metrics and trace context, through the real binary: `GET /metrics` on
`serve --http` (behind the token) and `sandmux metrics ID` for a stdio
instance, parsed with the Prometheus project's own Python parser, their
counters moving with calls; a W3C `traceparent` in `_meta` or in the HTTP
headers named in the call's audit record and log lines, an invalid one
ignored and never echoed."""

import json
import os
import re
import subprocess
import time

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, audit_records, call, connect, http_server, runtime_dir_of, serve_pids

pytestmark = pytest.mark.anyio

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{PARENT}-01"
# Each is no trace context: uppercase hex, an all-zero trace id, version ff,
# a trailing field, a terminal escape where the flags go.
BAD = [
    f"00-{TRACE.upper()}-{PARENT}-01",
    f"00-{'0' * 32}-{PARENT}-01",
    f"ff-{TRACE}-{PARENT}-01",
    f"00-{TRACE}-{PARENT}-01-x",
    f"00-{TRACE}-{PARENT}-\x1b[",
]


def families(text):
    """name -> {(sample name, labels as a sorted tuple): value}."""
    out = {}
    for f in text_string_to_metric_families(text):
        out[f.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples}
    return out


def calls_of(fam, tool, outcome):
    return fam.get("sandmux_tool_calls", {}).get(("sandmux_tool_calls_total", (("outcome", outcome), ("tool", tool)))) or 0


def refusals_of(fam, kind):
    return fam["sandmux_refusals"][("sandmux_refusals_total", (("kind", kind),))]


def scrape(url, token):
    return httpx2.get(url.replace("/mcp", "/metrics"), headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30)


async def test_http_metrics_need_the_token_parse_and_move_with_calls(ws):
    with http_server(ws) as (url, token, proc):
        assert scrape(url, None).status_code == 401
        assert scrape(url, "x" * len(token)).status_code == 401
        r = scrape(url, token)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        before = families(r.text)
        for name in ("sandmux_info", "sandmux_approval_questions_open", "sandmux_audit_bytes_left", "sandmux_proxy_connections", "sandmux_proxy_bytes", "sandmux_http_rejected", "sandmux_tool_call_duration_seconds"):
            assert name in before, name
        # The two refused scrapes are counted among the HTTP refusals.
        assert before["sandmux_http_rejected"][("sandmux_http_rejected_total", (("reason", "no_token"),))] == 1
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as h, Client(streamable_http_client(url, http_client=h), mode="legacy") as c:
            await call(c, "list_panes")
            await call(c, "list_panes")
            with pytest.raises(MCPError):
                await c.call_tool("no_such_tool", {})
        after = families(scrape(url, token).text)
        proc.terminate()
        proc.wait(timeout=30)
    assert calls_of(after, "list_panes", "ok") - calls_of(before, "list_panes", "ok") == 2
    assert calls_of(after, "(unknown)", "refused") - calls_of(before, "(unknown)", "refused") == 1
    assert refusals_of(after, "refused") - refusals_of(before, "refused") == 1
    h = after["sandmux_tool_call_duration_seconds"]
    count = h[("sandmux_tool_call_duration_seconds_count", (("tool", "list_panes"),))]
    inf = h[("sandmux_tool_call_duration_seconds_bucket", (("le", "+Inf"), ("tool", "list_panes")))]
    assert count == inf == 2
    # The agent-chosen tool name is no label value; audited as it came.
    assert not any("no_such_tool" in str(k) for f in after.values() for k in f)
    assert any(r["tool"] == "no_such_tool" and r["outcome"] == "refused" for r in audit_records(ws))
    # Scrapes are not audited (a scraper would spend the budget).
    assert not any("metrics" in r["tool"] for r in audit_records(ws))


def sm(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30, env=env)


async def test_the_operator_metrics_command_gives_a_stdio_instance_the_same_families(ws):
    async with connect(ws) as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        first = sm("metrics", iid)
        assert first.returncode == 0, first.stderr
        before = families(first.stdout)
        await call(c, "list_panes")
        await call(c, "list_panes")
        after = families(sm("metrics", iid).stdout)
        left = after["sandmux_audit_bytes_left"][("sandmux_audit_bytes_left", ())]
        assert 0 < left < before["sandmux_audit_bytes_left"][("sandmux_audit_bytes_left", ())], "records spend the budget"
    assert calls_of(after, "list_panes", "ok") - calls_of(before, "list_panes", "ok") == 2
    for name in ("sandmux_tool_calls", "sandmux_tool_call_duration_seconds", "sandmux_refusals", "sandmux_approval_questions_open", "sandmux_audit_bytes_left", "sandmux_proxy_connections", "sandmux_proxy_bytes"):
        assert name in after, name
    assert "sandmux_http_rejected" not in after, "a stdio instance has no HTTP"
    gone = sm("metrics", iid)
    assert gone.returncode == 1 and "no running instance" in gone.stderr


async def test_a_valid_traceparent_is_in_the_audit_record_an_invalid_one_is_ignored(ws):
    async with connect(ws) as c:
        for i, tp in enumerate([GOOD, *BAD]):
            r = await c.call_tool("list_windows", {}, meta={"traceparent": tp, "tracestate": "rojo=00f067aa0ba902b7"})
            assert not r.is_error, f"call {i} failed: {r}"
    recs = [r for r in audit_records(ws) if r["tool"] == "list_windows"]
    assert len(recs) == 1 + len(BAD)
    good, bad = recs[0], recs[1:]
    assert good["trace_id"] == TRACE and good["parent_span_id"] == PARENT
    assert re.fullmatch(r"[0-9a-f]{16}", good["span_id"]) and good["span_id"] not in (PARENT, "0" * 16)
    assert good["tracestate"] == "rojo=00f067aa0ba902b7"
    for r in bad:
        assert not {"trace_id", "span_id", "parent_span_id"} & set(r), r
    text = (ws[1] / "audit.jsonl").read_text()
    assert TRACE.upper() not in text and "\\u001b[" not in text


async def test_traceparent_from_http_headers_names_the_log_lines_and_meta_wins(ws):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    other = "0af7651916cd43dd8448eb211c80319c"
    with http_server(ws, env={"SANDMUX_LOG": "sandmux=debug"}) as (url, token, proc):
        hdr = {"Authorization": f"Bearer {token}", "traceparent": f"00-{other}-b7ad6b7169203331-01"}
        async with httpx2.AsyncClient(headers=hdr, timeout=60) as h, Client(streamable_http_client(url, http_client=h), mode="legacy") as c:
            await call(c, "list_panes")
            await c.call_tool("list_windows", {}, meta={"traceparent": GOOD})
            # A refusal is logged (at debug) inside the call's span.
            with pytest.raises(MCPError):
                await c.call_tool("no_such_tool", {})
        proc.terminate()
        proc.wait(timeout=30)
        log = proc.stderr.read()
    by = {r["tool"]: r for r in audit_records(ws)}
    assert by["list_panes"]["trace_id"] == other, "the header's context"
    assert by["list_windows"]["trace_id"] == TRACE, "_meta comes before the header"
    refused = by["no_such_tool"]
    line = next(l for l in log.splitlines() if "tool call refused" in l)
    assert f"trace_id={other}" in line and f"span_id={refused['span_id']}" in line, line


def layer_gauges(iid):
    fam = families(sm("metrics", iid).stdout)
    get = lambda n: fam.get(n, {}).get((n, ()))
    return get("sandmux_layer_bytes"), get("sandmux_layer_files")


async def test_the_layer_size_moves_when_the_agent_writes_a_file(ws):
    async with connect(ws, "--workspace-mode", "copy-on-write") as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        end = time.monotonic() + 15
        while time.monotonic() < end and layer_gauges(iid)[0] is None:
            time.sleep(0.2)
        b0, f0 = layer_gauges(iid)
        assert b0 is not None and f0 is not None, "the layer is measured within seconds"
        r = await call(c, "run_command", {"command": "head -c 3000000 /dev/urandom > big.bin && echo WROTE", "timeout": 30})
        assert "WROTE" in r["output"], r
        end = time.monotonic() + 40
        while time.monotonic() < end and layer_gauges(iid)[0] < b0 + 3_000_000:
            time.sleep(0.2)
        b1, f1 = layer_gauges(iid)
    assert b1 >= b0 + 3_000_000 and f1 >= f0 + 1, (b0, f0, b1, f1)
    assert not (ws[0] / "big.bin").exists(), "the write went to the layer"


async def test_a_live_workspace_has_no_layer_gauge(ws):
    async with connect(ws) as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        await call(c, "run_command", {"command": "head -c 100000 /dev/urandom > big.bin", "timeout": 30})
        time.sleep(1.5)
        assert layer_gauges(iid) == (None, None)
