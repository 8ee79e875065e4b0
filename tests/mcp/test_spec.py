"""The MCP specification's newer requirements, through the real `serve --http`:
the 2026-07-28 standard request headers (SEP-2243: `Mcp-Method`, `Mcp-Name`,
checked against the body; an older protocol version needs none), list
results' caching fields (`ttlMs`, `cacheScope`) and fixed order, and the
icons of 2025-11-25. The header attack is what a client behind a proxy that
routes or filters on `Mcp-Name` would try: headers naming a harmless tool,
a body running a command. The host checks nothing ran; the same request with
matching headers is the positive control (the channel carries it)."""

import base64
import json

import httpx2
import pytest

from conftest import audit_records, call, http_client, http_server

pytestmark = pytest.mark.anyio

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
ACCEPT = "application/json, text/event-stream"


def rpc(url, token, method, params=None, headers=None, meta=True, sid=None):
    """One JSON-RPC request: (status, the JSON-RPC message answered)."""
    p = dict(params or {})
    if meta:
        p["_meta"] = META
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": p}
    h = {"Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}", **(headers or {})}
    if sid:
        h["Mcp-Session-Id"] = sid
    r = httpx2.post(url, content=json.dumps(body).encode(), headers=h, timeout=120)
    text = r.text
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        msgs = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return r.status_code, next(m for m in msgs if m.get("id") == 7)
    return r.status_code, (json.loads(text) if text.strip().startswith("{") else text)


def modern(method, name=None):
    h = {"MCP-Protocol-Version": V, "Mcp-Method": method}
    if name is not None:
        h["Mcp-Name"] = name
    return h


def rejected(url, token, reason):
    text = httpx2.get(url.replace("/mcp", "/metrics"), headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    for line in text.splitlines():
        if line.startswith(f'sandmux_http_rejected_total{{reason="{reason}"}}'):
            return int(line.split()[-1])
    return 0


def touch(ws, name):
    return {"name": "run_command", "arguments": {"command": f"touch {ws[0] / name}"}}


def test_headers_that_name_another_tool_or_are_missing_run_nothing(ws):
    with http_server(ws) as (url, token, _):
        attacks = {
            "named-list-panes": modern("tools/call", "list_panes"),  # a proxy allowing list_panes routes it
            "encoded-list-panes": modern("tools/call", "=?base64?" + base64.b64encode(b"list_panes").decode() + "?="),
            "no-name": modern("tools/call"),
            "other-method": modern("tools/list", "run_command"),
            "no-method": {"MCP-Protocol-Version": V, "Mcp-Name": "run_command"},
            "no-version": {"Mcp-Method": "tools/call", "Mcp-Name": "run_command"},
            "old-version-header": {"MCP-Protocol-Version": "2025-11-25", "Mcp-Method": "tools/call", "Mcp-Name": "list_panes"},
        }
        for file, headers in attacks.items():
            status, msg = rpc(url, token, "tools/call", touch(ws, file), headers)
            assert status == 400, (file, status, msg)
            assert msg["id"] == 7 and msg["error"]["code"] == -32020, (file, msg)
            assert "Header mismatch" in msg["error"]["message"], msg
        assert rejected(url, token, "header_mismatch") == len(attacks)
        # Positive control: the same request, its headers matching (plain and
        # Base64-encoded), runs the command.
        status, msg = rpc(url, token, "tools/call", touch(ws, "matching"), modern("tools/call", "run_command"))
        assert status == 200 and not msg["result"].get("isError"), msg
        enc = "=?base64?" + base64.b64encode(b"run_command").decode() + "?="
        status, msg = rpc(url, token, "tools/call", touch(ws, "matching-encoded"), modern("tools/call", enc))
        assert status == 200 and not msg["result"].get("isError"), msg
    made = sorted(p.name for p in ws[0].iterdir())
    assert made == ["matching", "matching-encoded"], made
    assert len([r for r in audit_records(ws) if r["tool"] == "run_command"]) == 2


def test_an_older_protocol_version_needs_no_standard_headers(ws):
    """A 2025-11-25 session (initialize, Mcp-Session-Id) sends none of them,
    and a mismatched one is not its version's header: the call runs."""
    with http_server(ws) as (url, token, _):
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
        h = {"Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=h, timeout=60)
        assert r.status_code == 200, r.text
        sid = r.headers["mcp-session-id"]
        old = {"MCP-Protocol-Version": "2025-11-25"}
        httpx2.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**h, **old, "Mcp-Session-Id": sid}, timeout=60)
        status, msg = rpc(url, token, "tools/call", touch(ws, "old-plain"), old, meta=False, sid=sid)
        assert status == 200 and not msg["result"].get("isError"), msg
        status, msg = rpc(url, token, "tools/call", touch(ws, "old-odd"), {**old, "Mcp-Method": "tools/list", "Mcp-Name": "x"}, meta=False, sid=sid)
        assert status == 200 and not msg["result"].get("isError"), msg
        # An initialize that carries Mcp-Method must mean it (a proxy may route on it).
        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers={**h, "Mcp-Method": "tools/call"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32020, r.text
        assert rejected(url, token, "header_mismatch") == 1
    assert sorted(p.name for p in ws[0].iterdir()) == ["old-odd", "old-plain"]


async def test_the_official_sdk_sends_the_headers_and_keeps_working(ws):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    with http_server(ws) as (url, token, _):
        async with http_client(token) as h, Client(streamable_http_client(url, http_client=h), mode=V) as c:
            assert (await call(c, "list_panes"))["panes"]
            assert (await c.read_resource("sandmux://status")).contents
            assert (await c.get_prompt("interrupt_gracefully", {"pane_id": "%0"})).messages
            tools = await c.list_tools()
            assert len(tools.tools) == 49
        assert rejected(url, token, "header_mismatch") == 0


def names(result, key):
    return [t.get("name") or t.get("uriTemplate") or t.get("uri") for t in result[key]]


def test_list_results_carry_caching_fields_and_keep_one_order(ws):
    with http_server(ws) as (url, token, _):
        lists = {"tools/list": "tools", "resources/list": "resources", "resources/templates/list": "resourceTemplates", "prompts/list": "prompts"}
        got = {}
        for method, key in lists.items():
            status, msg = rpc(url, token, method, {}, modern(method))
            assert status == 200, msg
            got[method] = msg["result"]
            again = rpc(url, token, method, {}, modern(method))[1]["result"]
            assert names(again, key) == names(got[method], key), method
        for method in ("tools/list", "resources/list", "resources/templates/list"):
            assert (got[method]["ttlMs"], got[method]["cacheScope"]) == (0, "private"), method
        assert (got["prompts/list"]["ttlMs"], got["prompts/list"]["cacheScope"]) == (3_600_000, "public")
        status, msg = rpc(url, token, "resources/read", {"uri": "sandmux://status"}, modern("resources/read", "sandmux://status"))
        assert (msg["result"]["ttlMs"], msg["result"]["cacheScope"]) == (0, "private"), msg
        # A 2025-11-25 session gets its version's shape (no caching fields)
        # and the same order.
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
        h = {"Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=h, timeout=60)
        sid = r.headers["mcp-session-id"]
        httpx2.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**h, "Mcp-Session-Id": sid}, timeout=60)
        for method, key in lists.items():
            old = rpc(url, token, method, {}, {"MCP-Protocol-Version": "2025-11-25"}, meta=False, sid=sid)[1]["result"]
            assert "ttlMs" not in old and "cacheScope" not in old, method
            assert names(old, key) == names(got[method], key), method
    # The tools come in the catalogue's order, which groups them by toolset:
    # not alphabetical, so a sort somewhere would show here.
    assert names(got["tools/list"], "tools")[:3] == ["list_sessions", "get_session_info", "list_windows"], names(got["tools/list"], "tools")[:3]


def png_16(icon):
    assert icon["mimeType"] == "image/png" and icon["sizes"] == ["16x16"], icon
    prefix = "data:image/png;base64,"
    assert icon["src"].startswith(prefix), icon["src"][:40]
    b = base64.b64decode(icon["src"][len(prefix):], validate=True)
    assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR"
    assert int.from_bytes(b[16:20], "big") == 16 and int.from_bytes(b[20:24], "big") == 16
    return True


def test_the_server_resources_templates_and_prompts_have_an_icon_tools_none(ws):
    with http_server(ws) as (url, token, _):
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
        h = {"Accept": ACCEPT, "Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=h, timeout=60)
        body = r.text
        if body.lstrip().startswith("data:") or "\ndata:" in body:
            body = next(line[5:] for line in body.splitlines() if line.startswith("data:") and line[5:].strip())
        info = json.loads(body)["result"]["serverInfo"]
        assert info["name"] == "sandmux" and all(png_16(i) for i in info["icons"]), info
        for method, key in (("resources/list", "resources"), ("resources/templates/list", "resourceTemplates"), ("prompts/list", "prompts")):
            items = rpc(url, token, method, {}, modern(method))[1]["result"][key]
            assert items and all(len(i["icons"]) == 1 and png_16(i["icons"][0]) for i in items), method
        tools = rpc(url, token, "tools/list", {}, modern("tools/list"))[1]["result"]["tools"]
        assert not any("icons" in t for t in tools)


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_the_items_of_a_read_batch_carry_the_batchs_trace(ws):
    from conftest import connect

    ops = {"operations": [{"tool": "list_panes"}, {"tool": "list_windows"}, {"tool": "get_server_info"}]}
    other = "0af7651916cd43dd8448eb211c80319c"
    async with connect(ws) as c:
        for tp in (f"00-{TRACE}-00f067aa0ba902b7-01", None, f"00-{other}-b7ad6b7169203331-01"):
            r = await c.call_tool("call_read_tools_batch", ops, meta={"traceparent": tp} if tp else None)
            assert not r.is_error and all(i["ok"] for i in r.structured_content["results"]), r
    recs = audit_records(ws)
    batches = [r for r in recs if r["tool"] == "call_read_tools_batch"]
    items = [r for r in recs if r["request_id"] == "batch"]
    assert len(batches) == 3 and len(items) == 9, [r["tool"] for r in recs]
    for batch, its, trace in zip(batches, (items[:3], items[3:6], items[6:]), (TRACE, None, other)):
        if trace is None:
            # No context on the batch: none on its items (nothing left over
            # from the batch before).
            assert not any("trace_id" in i for i in its + [batch]), its
            continue
        assert batch["trace_id"] == trace
        for i in its:
            assert i["trace_id"] == trace and i["parent_span_id"] == batch["span_id"], i
        assert len({i["span_id"] for i in its} | {batch["span_id"]}) == 4, "each item its own span"


def test_discover_declares_no_tool_list_changes_a_stateless_client_cannot_hear(ws):
    """2026-07-28 has no session to notify: a list change reaches a client
    only on `subscriptions/listen`, which sandmux does not serve, so
    `server/discover` does not declare `tools.listChanged` (the conformance
    suite's `server-stateless` failed three checks on it). Control: a
    2025-11-25 session, which does get `notifications/tools/list_changed`,
    still sees it declared."""
    with http_server(ws) as (url, token, _):
        status, msg = rpc(url, token, "server/discover", headers=modern("server/discover"))
        assert status == 200, (status, msg)
        caps = msg["result"]["capabilities"]
        assert "tools" in caps and "listChanged" not in caps["tools"], caps
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
        status, msg = rpc(url, token, "initialize", init, headers={"MCP-Protocol-Version": "2025-11-25"}, meta=False)
        assert status == 200 and msg["result"]["capabilities"]["tools"]["listChanged"] is True, msg
