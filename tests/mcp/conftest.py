"""Shared fixtures: the real sandmux binary, driven over stdio (or, with
TRANSPORT = "http", over streamable HTTP: test_http.py) by the official MCP
Python SDK. Nothing here stands in for sandmux, tmux or the kernel."""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import tempfile

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.path.abspath(os.environ.get("SANDMUX_BIN", str(ROOT / "target" / "debug" / "sandmux")))


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def ws():
    """A workspace (real path) and, beside it, a place for the audit log."""
    with tempfile.TemporaryDirectory(prefix="sandmux-mcp-ws-") as w, tempfile.TemporaryDirectory(prefix="sandmux-mcp-host-") as h:
        yield pathlib.Path(os.path.realpath(w)), pathlib.Path(os.path.realpath(h))


def server_params(ws, *extra, env=None):
    """`serve` in `ws`. The workspace is live unless a test names a mode:
    most tests read what panes wrote there from the host (the
    copy-on-write workspace, the built-ins' default, has tests of its own
    in test_workspace.py, which pass --workspace-mode)."""
    work, host = ws
    mode = [] if "--workspace-mode" in extra else ["--workspace-mode", "live"]
    args = ["serve", "-w", str(work), "--audit-log", str(host / "audit.jsonl"), *mode, *extra]
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    e.update(env or {})
    return StdioServerParameters(command=BIN, args=args, env=e)


# "stdio", or "http": connect() then starts `serve --http 127.0.0.1:0` and
# talks to it with the SDK's streamable HTTP client (test_http.py sets it).
TRANSPORT = "stdio"


@contextlib.contextmanager
def http_server(ws, *extra, env=None):
    """`serve --http` on a free loopback port: yields (url, token, process);
    stopped with SIGTERM at the end."""
    p = server_params(ws, "--http", "127.0.0.1:0", *extra, env=env)
    proc = subprocess.Popen([p.command, *p.args], env=p.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for line in proc.stderr:
            if "serving MCP at " in line:
                break
        assert "serving MCP at " in line, f"serve --http did not start: {line}"
        url = line.split("serving MCP at ")[1].split()[0]
        # The line ends with the log's fields (instance=…) after the path.
        token = pathlib.Path(re.search(r"Bearer token in (.+?)\)( |$)", line).group(1)).read_text().strip()
        yield url, token, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            proc.stderr.close()


def http_client(token, **kw):
    import httpx2

    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60.0, read=300.0), **kw)


@contextlib.asynccontextmanager
async def connect(ws, *extra, mode="auto", env=None, message_handler=None):
    kw = {} if message_handler is None else {"message_handler": message_handler}
    if TRANSPORT == "http":
        from mcp.client.streamable_http import streamable_http_client

        with http_server(ws, *extra, env=env) as (url, token, _):
            async with http_client(token) as h:
                async with Client(streamable_http_client(url, http_client=h), mode=mode, **kw) as c:
                    yield c
        return
    async with Client(server_params(ws, *extra, env=env), mode=mode, **kw) as c:
        yield c


async def call(c, name, args=None, ok=True):
    r = await c.call_tool(name, args or {})
    if ok:
        assert not r.is_error, f"{name} failed: {r.content[0].text if r.content else r}"
        return r.structured_content
    assert r.is_error, f"{name} unexpectedly succeeded: {r.structured_content}"
    return r.content[0].text


def serve_pids(work):
    """Host pids of `sandmux serve` processes for this workspace."""
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and str(work).encode() in cmd:
            out.append(int(p.name))
    return out


def runtime_dir_of(pid):
    base = pathlib.Path(os.environ.get("XDG_RUNTIME_DIR", "")) / "sandmux"
    if not os.environ.get("XDG_RUNTIME_DIR") or not base.exists():
        base = pathlib.Path(tempfile.gettempdir()) / f"sandmux-{os.getuid()}"
    for d in base.iterdir():
        try:
            if (d / "owner").read_text().split()[0] == str(pid):
                return d
        except (OSError, IndexError):
            continue
    return None


def tmux_host(sock, *args):
    return subprocess.run(["tmux", "-N", "-S", str(sock), *args], capture_output=True, text=True, timeout=10)


def audit_records(ws):
    """The records of calls and events: a clean stop's final `(sealed)`
    record is left out (test_audit.py checks it)."""
    recs = [json.loads(l) for l in (ws[1] / "audit.jsonl").read_text().split("\n") if l]
    return recs[:-1] if recs and recs[-1]["tool"] == "(sealed)" else recs


def alive(pid):
    """Whether a process exists and is not a zombie."""
    try:
        return " Z " not in pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


def descendants(root):
    """Every descendant of a host pid (from /proc parent links)."""
    kids = {}
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                st = (p / "stat").read_text()
                kids.setdefault(int(st[st.rfind(")") + 2 :].split()[1]), []).append(int(p.name))
            except (OSError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def tmux_server_pid(serve_pid):
    """Host pid of the sandboxed tmux server (a descendant named 'tmux: server')."""
    for k in descendants(serve_pid):
        try:
            if pathlib.Path(f"/proc/{k}/comm").read_text().strip() == "tmux: server":
                return k
        except OSError:
            pass
    return None
