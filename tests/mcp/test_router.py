"""`serve --http` behind Kubernetes agent-sandbox's sandbox-router, played by
standins.SandboxRouter (what the real router's code does: Authorization
stripped, Host rewritten to the pod's address or DNS name, X-Forwarded-*
set, responses streamed, a request given up after its timeout). The pod is
`serve` bound to 127.0.0.2 (a pod IP that is not one of the names always
allowed), reached by the router through the name
sbx-1.agents.svc.cluster.local. Every check has its control: the same
request the way the router breaks it without the option fails."""

import contextlib
import os
import pathlib
import re
import subprocess
import tempfile
import time

import httpx2
import pytest

from conftest import BIN, audit_records, call, server_params
from standins import SandboxRouter

POD_IP = "127.0.0.2"
NAME = "sbx-1.agents.svc.cluster.local"
ROUTER_CRED = "router-own-credential-0123456789"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def secrets():
    """A directory of its own for token files (0700)."""
    with tempfile.TemporaryDirectory(prefix="sandmux-router-tok-") as d:
        yield pathlib.Path(d)


def token_file(d, token):
    p = d / "token"
    p.write_text(token + "\n")
    p.chmod(0o600)
    return str(p)


@contextlib.contextmanager
def pod(ws, *extra):
    """`serve --http 127.0.0.2:0` (the pod): yields (port, instance id, process)."""
    p = server_params(ws, "--http", f"{POD_IP}:0", *extra)
    proc = subprocess.Popen([p.command, *p.args], env=p.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for line in proc.stderr:
            if "serving MCP at " in line:
                break
        assert "serving MCP at " in line, f"serve --http did not start: {line}"
        port = int(re.search(r"http://127\.0\.0\.2:(\d+)/mcp", line).group(1))
        yield port, re.search(r"instance=(\w+)", line).group(1), proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            proc.stderr.close()


def through(port, token=None, by_ip=False, header="X-Sandmux-Token"):
    """What a client sends the router: its own credential in Authorization,
    the routing headers, and sandmux's token in `header`."""
    h = {"Authorization": f"Bearer {ROUTER_CRED}", "X-Sandbox-ID": "sbx-1", "X-Sandbox-Namespace": "agents", "X-Sandbox-Port": str(port)}
    if by_ip:
        h["X-Sandbox-Pod-IP"] = POD_IP
    if token is not None:
        h[header] = f"Bearer {token}"
    return h


def post_init(router, headers):
    return httpx2.post(router.url + "/mcp", json=INIT, headers={**MCP_ACCEPT, **headers}, timeout=30)


def hosts_for_the_pod():
    return ["--allowed-host", POD_IP, "--allowed-host", NAME]


async def sdk_calls(router, headers):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=300.0)) as h:
        async with Client(streamable_http_client(router.url + "/mcp", http_client=h), mode="legacy") as c:
            assert (await call(c, "sandbox_status"))
            out = await call(c, "run_command", {"command": "echo through-the-router"})
            assert "through-the-router" in str(out)


@pytest.mark.anyio
@pytest.mark.parametrize("by_ip", [False, True], ids=["dns-name", "pod-ip"])
async def test_the_sdk_works_through_the_router_with_the_token_header(ws, secrets, by_ip):
    tok = os.urandom(16).hex()
    router = SandboxRouter(dns={NAME: POD_IP})
    try:
        with pod(ws, "--token-file", token_file(secrets, tok), "--token-header", "X-Sandmux-Token", *hosts_for_the_pod()) as (port, _, proc):
            await sdk_calls(router, through(port, tok, by_ip))
            assert proc.poll() is None
    finally:
        router.close()
    # The router did strip Authorization and rewrite Host: what sandmux saw.
    assert router.forwarded and all("authorization" not in f for f in router.forwarded)
    want = f"{POD_IP}:{port}" if by_ip else f"{NAME}:{port}"
    assert {f["host"] for f in router.forwarded} == {want}
    assert all(f["x-forwarded-for"] == "127.0.0.1" for f in router.forwarded)
    recs = [r for r in audit_records(ws) if r["tool"] == "run_command"]
    assert recs and recs[-1]["http"]["token"].startswith("sha256:")
    assert ROUTER_CRED not in (ws[1] / "audit.jsonl").read_text()


def test_control_without_token_header_the_stripped_authorization_means_401(ws, secrets):
    """The same token in Authorization, the only place sandmux looks without
    --token-header: the router strips it, so every request is 401. Straight
    to the pod (no router), the same request is served."""
    tok = os.urandom(16).hex()
    router = SandboxRouter(dns={NAME: POD_IP})
    try:
        with pod(ws, "--token-file", token_file(secrets, tok), *hosts_for_the_pod()) as (port, _, _):
            h = through(port)
            h["Authorization"] = f"Bearer {tok}"
            assert post_init(router, h).status_code == 401
            direct = httpx2.post(f"http://{POD_IP}:{port}/mcp", json=INIT, headers={**MCP_ACCEPT, "Authorization": f"Bearer {tok}"}, timeout=30)
            assert direct.status_code == 200
    finally:
        router.close()


def test_with_token_header_authorization_is_not_accepted_and_the_host_must_be_allowed(ws, secrets):
    """With --token-header, a token in Authorization admits nothing (one
    place for the token, and the router's own credential there is never
    compared against ours). Without --allowed-host for the name the router
    sends as Host, 403: the Host check stays on behind the router."""
    tok = os.urandom(16).hex()
    router = SandboxRouter(dns={NAME: POD_IP})
    try:
        with pod(ws, "--token-file", token_file(secrets, tok), "--token-header", "X-Sandmux-Token", "--allowed-host", POD_IP) as (port, _, _):
            direct = httpx2.post(f"http://{POD_IP}:{port}/mcp", json=INIT, headers={**MCP_ACCEPT, "Authorization": f"Bearer {tok}"}, timeout=30)
            assert direct.status_code == 401
            assert post_init(router, through(port, tok, by_ip=True)).status_code == 200
            # The DNS name was not allowed: refused before the token is looked at.
            assert post_init(router, through(port, tok, by_ip=False)).status_code == 403
    finally:
        router.close()


def test_a_token_header_a_proxy_drops_is_refused_at_start(ws):
    p = server_params(ws, "--http", f"{POD_IP}:0", "--unclaimed", "--token-header", "X-Forwarded-Host")
    r = subprocess.run([p.command, *p.args], env=p.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--token-header x-forwarded-host" in r.stderr and "X-Sandmux-Token" in r.stderr
