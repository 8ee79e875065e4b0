"""`serve --http`: MCP over streamable HTTP against the real binary, with the
official SDK's streamable HTTP client and raw HTTP requests (httpx2, which the
SDK ships). Attacks come from the network side: no or a wrong token, a
foreign Host or Origin (DNS rebinding), an oversized body, too many sessions;
each has its positive control (the same request with the one thing fixed
goes through)."""

import json
import os
import socket
import struct
import subprocess
import time

import anyio
import httpx2
import pytest

import conftest
from conftest import BIN, audit_records, call, descendants, http_client, http_server, tmux_server_pid

pytestmark = pytest.mark.anyio

ACCEPT = "application/json, text/event-stream"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


def post(url, token=None, body=None, headers=None, **kw):
    h = {"Accept": ACCEPT, "Content-Type": "application/json", **(headers or {})}
    if token:
        h["Authorization"] = f"Bearer {token}"
    data = json.dumps(INIT if body is None else body).encode() if not isinstance(body, bytes) else body
    return httpx2.post(url, content=data, headers=h, timeout=30, **kw)


def profile_with(ws, **keys):
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    assert "\n[mcp]\n" in text
    text = text.replace("\n[mcp]\n", "\n[mcp]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()), 1)
    p = ws[1] / "http.toml"
    p.write_text(text)
    v = subprocess.run([BIN, "profile", "validate", str(p)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return str(p)


def raw_status(port, token, extra):
    """The status of an `initialize` sent with raw header lines `extra`."""
    body = json.dumps(INIT).encode()
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nAccept: {ACCEPT}\r\nContent-Type: application/json\r\nConnection: close\r\n".encode() + extra + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    c.settimeout(30)
    d = b""
    while b"\r\n" not in d and (k := c.recv(4096)):
        d += k
    c.close()
    return d.split(b" ")[1]


def raw_head(port, headers, token="x" * 16):
    """The status of an `initialize` sent with raw Host/Origin lines: a
    wrong token gives 401 once they pass, the right one 200."""
    body = json.dumps(INIT).encode()
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"POST /mcp HTTP/1.1\r\n" + headers + f"Authorization: Bearer {token}\r\nAccept: {ACCEPT}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    c.settimeout(30)
    d = b""
    while b"\r\n" not in d and (k := c.recv(4096)):
        d += k
    c.close()
    return d.split(b" ")[1]


def stopped(proc):
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_no_token_or_a_wrong_one_is_401_and_the_right_one_serves(ws):
    with http_server(ws) as (url, token, proc):
        assert post(url).status_code == 401
        r = post(url, "x" * len(token))
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert post(url, token[:-1]).status_code == 401
        assert post(url, headers={"Authorization": f"Basic {token}"}).status_code == 401
        ok = post(url, token)
        assert ok.status_code == 200 and "mcp-session-id" in ok.headers
        stopped(proc)
    rej = [r for r in audit_records(ws) if r["tool"] == "(http-rejected)"]
    assert len(rej) == 1, "refusals are one aggregated record"
    assert rej[0]["args"]["by_reason"] == {"no_token": 1, "bad_token": 3}
    assert rej[0]["args"]["clients"] == {"127.0.0.1": 4}
    assert token not in (ws[1] / "audit.jsonl").read_text()


def test_foreign_host_or_origin_is_403_allowed_names_pass(ws):
    with http_server(ws, "--allowed-host", "sandmux-a1.agents.svc") as (url, token, proc):
        port = url.split(":")[2].split("/")[0]
        assert post(url, token, headers={"Host": f"evil.example:{port}"}).status_code == 403
        assert post(url, token, headers={"Origin": "http://evil.example"}).status_code == 403
        assert post(url, token, headers={"Origin": "null"}).status_code == 403
        assert post(url, token, headers={"Origin": "file://localhost"}).status_code == 403
        # Text after an IPv6 literal's `]`, and repeated headers (before the
        # fix: 200, only the first was looked at).
        assert raw_head(port, b"Host: [::1]evil.example\r\n") == b"403"
        assert raw_head(port, b"Host: 127.0.0.1\r\nOrigin: http://[::1]evil.example\r\n") == b"403"
        assert raw_head(port, b"Host: 127.0.0.1\r\nHost: evil.example\r\n") == b"403"
        assert raw_head(port, b"Host: 127.0.0.1\r\nOrigin: http://localhost\r\nOrigin: http://evil.example\r\n") == b"403"
        assert raw_head(port, b"Host: [::1]:80\r\nOrigin: http://[::1]:80\r\n", token) == b"200"
        # Positive controls: loopback names and the allowed one.
        assert post(url, token, headers={"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}).status_code == 200
        assert post(url, token, headers={"Host": f"sandmux-a1.agents.svc:{port}"}).status_code == 200
        assert post(url, token, headers={"Origin": "https://sandmux-a1.agents.svc"}).status_code == 200
        stopped(proc)
    rej = [r for r in audit_records(ws) if r["tool"] == "(http-rejected)"]
    assert rej[0]["args"]["by_reason"] == {"host": 3, "origin": 5}


def test_a_large_body_is_413_whether_declared_or_streamed(ws):
    with http_server(ws) as (url, token, proc):
        big = json.dumps({**INIT, "pad": "x" * (1 << 20)}).encode()
        assert post(url, token, big).status_code == 413

        def chunks():
            for _ in range(40):
                yield b"x" * 65536

        h = {"Authorization": f"Bearer {token}", "Accept": ACCEPT, "Content-Type": "application/json"}
        assert httpx2.post(url, content=chunks(), headers=h, timeout=30).status_code == 413
        # Positive control: a body just under the cap reaches MCP.
        fits = json.dumps({**INIT, "params": {**INIT["params"], "pad": "x" * 1000}}).encode()
        assert post(url, token, fits).status_code == 200
        stopped(proc)


def test_the_session_cap_refuses_one_more_and_frees_on_delete(ws):
    prof = profile_with(ws, http_max_sessions=2)
    with http_server(ws, "-p", prof) as (url, token, proc):
        ids = [post(url, token).headers["mcp-session-id"] for _ in range(2)]
        assert post(url, token).status_code == 503
        # An id rmcp cannot read (not visible ASCII) or two ids: refused, so
        # neither opens a session past the cap; a well-formed unknown id is
        # rmcp's 404 (the control that the header is looked at at all).
        port = int(url.split(":")[2].split("/")[0])
        assert raw_status(port, token, b"Mcp-Session-Id: \x80\r\n") == b"400"
        assert raw_status(port, token, b"Mcp-Session-Id: a\r\nMcp-Session-Id: b\r\n") == b"400"
        assert raw_status(port, token, b"Mcp-Session-Id: unknown\r\n") == b"404"
        h = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": ids[0], "MCP-Protocol-Version": "2025-11-25"}
        assert httpx2.delete(url, headers=h, timeout=30).status_code in (200, 202, 204)
        assert post(url, token).status_code == 200, "a closed session frees its place"
        assert proc.poll() is None, "clients coming and going do not end the instance"
        stopped(proc)


def test_healthz_needs_no_token_says_only_ready_and_is_not_audited(ws):
    with http_server(ws) as (url, token, proc):
        base = url.rsplit("/", 1)[0]
        for _ in range(5):
            r = httpx2.get(f"{base}/healthz", headers={"Host": "10.1.2.3:8765"}, timeout=30)
            assert r.status_code == 200 and r.text == "ready\n"
        assert httpx2.get(f"{base}/other", timeout=30).status_code == 404
        ps = json.loads(subprocess.run([BIN, "ps", "--json"], capture_output=True, text=True, check=True).stdout)
        me = [p for p in ps if p["pid"] == proc.pid]
        assert me and me[0]["http"]["url"] == url
        assert open(me[0]["http"]["token_file"]).read().strip() == token
        assert oct(os.stat(me[0]["http"]["token_file"]).st_mode & 0o777) == "0o600"
        text = subprocess.run([BIN, "ps"], capture_output=True, text=True, check=True).stdout
        assert f"MCP at {url} (Bearer token in {me[0]['http']['token_file']})" in text
        stopped(proc)
    tools = [r["tool"] for r in audit_records(ws)]
    assert "(healthz)" not in tools and tools.count("(http-rejected)") == 1


def test_a_non_loopback_bind_needs_a_private_token_file(ws):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    base = [BIN, "serve", "-w", str(ws[0]), "--audit-log", str(ws[1] / "a.jsonl"), "--http"]
    r = subprocess.run([*base, "0.0.0.0:0"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--token-file" in r.stderr
    tf = ws[1] / "token"
    tf.write_text("0123456789abcdef0123456789\n")
    tf.chmod(0o644)
    r = subprocess.run([*base, "0.0.0.0:0", "--token-file", str(tf)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "0644" in r.stderr and "chmod 0400" in r.stderr
    r = subprocess.run([*base, "localhost:80"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "IP:PORT" in r.stderr
    # A FIFO as the token file is refused at once, not waited on (before the
    # fix serve hung in open(2), before any sandbox, and SIGTERM did not end it).
    fifo = ws[1] / "fifo"
    os.mkfifo(fifo, 0o600)
    r = subprocess.run([*base, "127.0.0.1:0", "--token-file", str(fifo)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not a regular file" in r.stderr
    # A token the sandbox could write (in the workspace): the agent could
    # choose the token once it is read again after a change. Refused.
    inside = ws[0] / "token"
    inside.write_text("0123456789abcdef0123456789\n")
    inside.chmod(0o600)
    r = subprocess.run([*base, "127.0.0.1:0", "--token-file", str(inside)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "which the sandbox can write" in r.stderr, r.stderr
    inside.unlink()
    # The control: a 0600 regular file, through a symlink (as Kubernetes
    # mounts Secrets), is read.
    tf.chmod(0o600)
    (ws[1] / "link").symlink_to(tf)
    with http_server(ws, "--token-file", str(ws[1] / "link")) as (url, token, proc):
        assert token == "0123456789abcdef0123456789"
        stopped(proc)


def test_a_rotated_token_file_replaces_the_token_at_once_and_an_unusable_one_admits_nothing(ws):
    # A Kubernetes Secret rotates by swapping the `..data` link in its
    # directory. The supervisor, confined after start, reads the file again
    # when it changes: the old token stops working at once (before, it kept
    # working until the instance ended), and a file that cannot be used
    # admits nothing until it can (fail closed). The audit log names each
    # change by its digest, never the token itself.
    d = ws[1] / "secret"
    d.mkdir(mode=0o700)

    def put(gen, text, mode=0o600):
        g = d / f"..{gen}"
        g.mkdir(mode=0o700)
        (g / "token").write_text(text + "\n")
        (g / "token").chmod(mode)
        (d / "..data_tmp").symlink_to(g.name)
        os.replace(d / "..data_tmp", d / "..data")

    a, b, c, e = ("a" * 20, "b" * 20, "c" * 20, "e" * 20)
    put("v1", a)
    (d / "token").symlink_to("..data/token")
    with http_server(ws, "--token-file", str(d / "token")) as (url, token, proc):
        assert token == a and post(url, a).status_code == 200
        put("v2", b)
        assert post(url, a).status_code == 401
        assert post(url, b).status_code == 200
        put("v3", c, 0o644)  # others may read it: unusable
        assert post(url, b).status_code == 401 and post(url, c).status_code == 401
        put("v4", e)
        assert post(url, e).status_code == 200
        stopped(proc)
    events = [(r["error_type"], r["args"]) for r in audit_records(ws) if r["tool"] == "(http)"]
    kinds = [k for k, _ in events]
    assert kinds == ["token_replaced", "token_unusable", "token_replaced"], events
    assert "0644" in events[1][1]["why"]
    text = (ws[1] / "audit.jsonl").read_text()
    assert not any(t in text for t in (a, b, c, e))


async def test_one_sandbox_serves_100_sequential_and_20_concurrent_calls(ws):
    with http_server(ws) as (url, token, proc):
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with http_client(token) as h, Client(streamable_http_client(url, http_client=h), mode="legacy") as c:
            server = tmux_server_pid(proc.pid)
            assert server
            for _ in range(100):
                await call(c, "sandbox_status")
            # The shell's start-up is over before the listings are compared:
            # its prompt moves the cursor, and tmux renames the window from
            # the gate's name to the shell's up to 0.5 s after the prompt.
            await call(c, "run_command", {"command": "true"})
            for _ in range(100):
                if (await call(c, "list_windows"))["windows"][0]["window_name"] != "sandmux-pane":
                    break
                await anyio.sleep(0.05)
            outs = []

            async def one():
                outs.append((await call(c, "list_panes"))["panes"])

            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(one)
            odd = [o for o in outs if o != outs[0]][:1]
            diff = odd and {k: (outs[0][0].get(k), odd[0][0].get(k)) for k in outs[0][0] if outs[0][0].get(k) != odd[0][0].get(k)}
            assert len(outs) == 20 and not odd, diff
            assert tmux_server_pid(proc.pid) == server
        servers = [k for k in descendants(proc.pid) if open(f"/proc/{k}/comm").read().strip() == "tmux: server"]
        assert len(servers) == 1, "one sandbox for every session and request"
        stopped(proc)
    recs = [r for r in audit_records(ws) if r["tool"] in ("sandbox_status", "list_panes")]
    assert len(recs) == 120 and all(r["http"]["session"] and r["http"]["client"].startswith("127.0.0.1:") for r in recs)


async def test_stateless_2026_07_28_records_token_and_client(ws):
    with http_server(ws) as (url, token, proc):
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with http_client(token) as h, Client(streamable_http_client(url, http_client=h), mode="2026-07-28") as c:
            assert (await call(c, "list_panes"))["panes"]
        stopped(proc)
    rec = [r for r in audit_records(ws) if r["tool"] == "list_panes"][-1]
    assert rec["http"]["session"] is None
    assert rec["http"]["token"].startswith("sha256:") and rec["http"]["client"].startswith("127.0.0.1:")


def test_the_idle_timeout_ends_the_instance_and_requests_keep_it(ws):
    prof = profile_with(ws, http_idle_seconds=5)
    with http_server(ws, "-p", prof) as (url, token, proc):
        for _ in range(4):
            assert post(url, token).status_code == 200
            time.sleep(2)
        assert proc.poll() is None, "requests every 2 s keep a 5 s idle timeout away"
        assert proc.wait(timeout=60) == 0
    assert any(r["tool"] == "(http-idle)" for r in audit_records(ws))


class Raw:
    """One MCP session over raw sockets, one connection per request."""

    def __init__(self, url, token):
        self.port, self.token, self.sid, self.id = int(url.split(":")[2].split("/")[0]), token, None, 10
        self.sid = self.rt(INIT, "initialize")[0]["mcp-session-id"]
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"}).close()

    def send(self, obj):
        body = json.dumps(obj).encode()
        sid = f"Mcp-Session-Id: {self.sid}\r\nMcp-Protocol-Version: 2025-11-25\r\n" if self.sid else ""
        c = socket.create_connection(("127.0.0.1", self.port))
        head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\nAccept: {ACCEPT}\r\nContent-Type: application/json\r\nConnection: close\r\n{sid}Content-Length: {len(body)}\r\n\r\n"
        c.sendall(head.encode() + body)
        return c

    def rt(self, obj, what):
        """Sends and reads the answer to its end; a hang is a failure (60 s guard)."""
        c = self.send(obj)
        c.settimeout(60)
        d, end = b"", time.monotonic() + 60  # SSE pings would reset a socket timeout
        try:
            while time.monotonic() < end and (k := c.recv(1 << 20)):
                d += k
                if b'"id":%d' % obj["id"] in d and d.endswith(b"\n\n"):
                    break
        except socket.timeout:
            pytest.fail(f"{what}: no answer within 60 s")
        finally:
            c.close()
        if time.monotonic() >= end:
            pytest.fail(f"{what}: no answer within 60 s")
        head, _, body = d.partition(b"\r\n\r\n")
        h = dict(l.decode().split(": ", 1) for l in head.split(b"\r\n")[1:])
        return {k.lower(): v for k, v in h.items()}, body

    def call(self, name, args):
        self.id += 1
        return self.rt({"jsonrpc": "2.0", "id": self.id, "method": "tools/call", "params": {"name": name, "arguments": args}}, name)[1]

    def reset_after_sending(self, name, args):
        self.id += 1
        c = self.send({"jsonrpc": "2.0", "id": self.id, "method": "tools/call", "params": {"name": name, "arguments": args}})
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()


def test_answers_of_reset_connections_are_not_owed_for_good(ws):
    """20 capture_pane answers of ~900 KB (> the 8 MiB backlog together) whose
    connections are reset right after sending: the backlog is paid when each
    body is dropped, so the next calls, of this and of a new session, answer."""
    with http_server(ws) as (url, token, proc):
        s = Raw(url, token)
        s.call("run_command", {"command": "for i in $(seq 1 3000); do printf '%0300d\\n' $i; done", "timeout": 20})
        args = {"start": -3000, "max_lines": 5000, "max_bytes": 1000000}
        # Control: one such answer, read, is big enough that 20 exceed 8 MiB.
        assert len(s.call("capture_pane", args)) > 450_000
        for _ in range(20):
            s.reset_after_sending("capture_pane", args)
        time.sleep(3)  # the calls run and their answers are produced
        assert b'"result"' in s.call("list_sessions", {})
        assert b'"result"' in Raw(url, token).call("list_sessions", {})
        stopped(proc)


def test_idle_connections_without_a_token_cannot_lock_out_healthz(ws):
    """128 idle connections (the cap: 4 × http_max_requests) that never send a
    header: a new connection still gets /healthz, the oldest idle one is the
    one closed for it (before the fix: every new connection was reset)."""
    with http_server(ws) as (url, token, proc):
        port = int(url.split(":")[2].split("/")[0])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(128)]
        time.sleep(1)  # all accepted
        for _ in range(3):
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            c.settimeout(30)
            assert c.recv(4096).startswith(b"HTTP/1.1 200"), "healthz answers past the idle connections"
            c.close()
        idle[0].settimeout(30)
        assert idle[0].recv(1) == b"", "the oldest idle connection was closed"
        idle[-1].setblocking(False)
        with pytest.raises(BlockingIOError):
            idle[-1].recv(1)  # the newest is still open
        for c in idle:
            c.close()
        stopped(proc)


# Some of test_tools.py, unchanged, over the SDK's streamable HTTP client:
# every test of this module runs with conftest.connect() over HTTP.
from test_tools import (  # noqa: E402
    test_every_tool_once_with_schema_checked_results,
    test_keys_and_text_are_kept_apart,
    test_run_command_sends_progress,
    test_waits,
)


@pytest.fixture(autouse=True)
def over_http(monkeypatch):
    monkeypatch.setattr(conftest, "TRANSPORT", "http")
