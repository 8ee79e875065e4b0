"""`serve --http` behind Kubernetes agent-sandbox's sandbox-router, played by
standins.SandboxRouter (what the real router's code does: Authorization
stripped, Host rewritten to the pod's address or DNS name, X-Forwarded-*
set, responses streamed, a request given up after its timeout). The pod is
`serve` bound to 127.0.0.2 (a pod IP that is not one of the names always
allowed), reached by the router through the name
sbx-1.agents.svc.cluster.local. Every check has its control: the same
request the way the router breaks it without the option fails."""

import contextlib
import json
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
def pod(ws, *extra, argv=None):
    """`serve --http 127.0.0.2:0` (the pod), or `argv` as given: yields
    (port, instance id, process)."""
    p = server_params(ws, "--http", f"{POD_IP}:0", *extra)
    proc = subprocess.Popen(argv or [p.command, *p.args], env=p.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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


def profile_with(ws, **keys):
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text = text.replace("\n[mcp]\n", "\n[mcp]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()), 1)
    p = ws[1] / "router.toml"
    p.write_text(text)
    return str(p)


def token_set(ws, instance, token):
    """`sandmux token set ID` with the token on stdin, as `kubectl exec -i
    POD -- sandmux token set ID` runs it in the pod."""
    p = server_params(ws)
    return subprocess.run([BIN, "token", "set", instance], input=token + "\n", env=p.env, capture_output=True, text=True, timeout=60)


@pytest.mark.anyio
async def test_a_warm_pool_pod_is_adopted_refused_before_served_after_and_rotated(ws):
    """A pooled pod starts --unclaimed: every MCP request is refused, whatever
    token is shown. `sandmux token set` claims it: the SDK works through the
    router. Set again: the old token is refused, the new one served. The
    token appears nowhere but in the request (not in `token set`'s output,
    not in the audit log, which names it by digest)."""
    a, b = os.urandom(16).hex(), os.urandom(16).hex()
    router = SandboxRouter(dns={NAME: POD_IP})
    try:
        with pod(ws, "--unclaimed", "--token-header", "X-Sandmux-Token", *hosts_for_the_pod()) as (port, inst, proc):
            for guess in (a, None, "x" * 16):
                assert post_init(router, through(port, guess)).status_code == 401
            assert httpx2.get(f"http://{POD_IP}:{port}/healthz", timeout=10).status_code == 200, "a pooled pod is ready"
            r = token_set(ws, inst, a)
            assert r.returncode == 0, r.stderr
            assert "token_claimed" in r.stderr and a not in r.stdout + r.stderr
            await sdk_calls(router, through(port, a))
            r = token_set(ws, inst, b)
            assert r.returncode == 0 and "token_replaced" in r.stderr, r.stderr
            assert post_init(router, through(port, a)).status_code == 401
            assert post_init(router, through(port, b)).status_code == 200
            bad = token_set(ws, inst, "short")
            assert bad.returncode == 1 and "16-4096" in bad.stderr
            assert post_init(router, through(port, b)).status_code == 200, "a refused token set changes nothing"
            assert proc.poll() is None
    finally:
        router.close()
    events = [r["error_type"] for r in audit_records(ws) if r["tool"] == "(http)"]
    assert events == ["token_claimed", "token_replaced", "token_set_refused"], events
    text = (ws[1] / "audit.jsonl").read_text()
    assert a not in text and b not in text


def test_token_set_is_refused_for_an_instance_with_a_token_file(ws, secrets):
    """Control: only --unclaimed instances take a token over the endpoint
    (a token file stays the one source, rotated by replacing the file)."""
    tok = os.urandom(16).hex()
    with pod(ws, "--token-file", token_file(secrets, tok), *hosts_for_the_pod()) as (port, inst, _):
        r = token_set(ws, inst, os.urandom(16).hex())
        assert r.returncode == 1 and "--token-file" in r.stderr
        direct = httpx2.post(f"http://{POD_IP}:{port}/mcp", json=INIT, headers={**MCP_ACCEPT, "Authorization": f"Bearer {tok}"}, timeout=30)
        assert direct.status_code == 200


def test_the_idle_clock_waits_for_the_claim(ws):
    """[mcp] http_idle_seconds = 5: unclaimed, the pod outlives it twice
    over; once claimed, it ends after 5 s without a request (the control:
    the same clock, running)."""
    prof = profile_with(ws, http_idle_seconds=5)
    with pod(ws, "-p", prof, "--unclaimed", *hosts_for_the_pod()) as (port, inst, proc):
        time.sleep(11)
        assert proc.poll() is None, "an unclaimed pod is not idle"
        t0 = time.monotonic()
        assert token_set(ws, inst, os.urandom(16).hex()).returncode == 0
        assert proc.wait(timeout=60) == 0
        assert 4.5 <= time.monotonic() - t0 < 30
    assert any(r["tool"] == "(http-idle)" for r in audit_records(ws))


def raw_call(base, headers, name, args):
    """One tools/call over plain HTTP, as a client that does not resume a
    cut stream sends it: (the result, or None when no answer arrived)."""
    with httpx2.Client(headers={**MCP_ACCEPT, **headers}, timeout=httpx2.Timeout(30.0, read=120.0)) as h:
        r = h.post(base + "/mcp", json=INIT)
        assert r.status_code == 200, r.text
        sid = {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        h.post(base + "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=sid)
        body = b""
        try:
            with h.stream("POST", base + "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": args}}, headers=sid) as resp:
                for chunk in resp.iter_bytes():
                    body += chunk
        except httpx2.HTTPError:
            pass  # cut off mid-stream
        for line in body.decode().splitlines():
            if line.startswith("data:") and '"id":2' in line.replace(" ", ""):
                return json.loads(line[5:])["result"]["structuredContent"]
        return None


@pytest.mark.anyio
async def test_waits_end_under_the_upstream_timeout_and_say_so(ws, secrets):
    """The router gives up after 20 s here (180 s in a cluster). With
    --upstream-timeout 20, each wait ends within 10 s, and the answer
    arrives through the router in the call's own stream and says it was
    cut short. Control: the same call without the option: the router cuts
    the stream at 20 s and a client that does not resume streams gets no
    answer."""
    tok = os.urandom(16).hex()
    router = SandboxRouter(dns={NAME: POD_IP}, timeout=20)
    long_run = ("run_command", {"command": "sleep 40; echo late", "timeout": 60})
    try:
        with pod(ws, "--token-file", token_file(secrets, tok), "--token-header", "X-Sandmux-Token", "--upstream-timeout", "20", *hosts_for_the_pod()) as (port, _, _):
            t0 = time.monotonic()
            run = raw_call(router.url, through(port, tok), *long_run)
            wait = raw_call(router.url, through(port, tok), "wait_for_text", {"patterns": ["never-printed"], "timeout": 60})
            cmd = raw_call(router.url, through(port, tok), "wait_for_command", {"command_id": run["command_id"], "timeout": 60})
            assert time.monotonic() - t0 < 45
        # 10 s below the router's 20, less what the call took before its wait.
        assert run["status"] == "timeout" and 9 < run["timeout"] <= 10, run
        assert "--upstream-timeout 20" in run["note"], run
        assert wait["outcome"] == "timeout" and 9 < wait["effective_timeout"] <= 10, wait
        assert 9 < cmd["timeout"] <= 10 and "--upstream-timeout 20" in cmd["note"], cmd
        assert router.cuts == []
        with pod(ws, "--token-file", token_file(secrets, tok), "--token-header", "X-Sandmux-Token", *hosts_for_the_pod()) as (port, _, _):
            assert raw_call(router.url, through(port, tok), *long_run) is None
        assert router.cuts == ["POST"], "the router cut the answer off"
    finally:
        router.close()


def test_audit_stdout_carries_the_whole_sealed_log_after_the_pod_is_gone(ws, secrets):
    """--audit-stdout: each record goes to stdout as it is written, so the
    cluster's log pipeline keeps the log when the pod's volume goes. The
    copy is the log byte for byte, and `sandmux audit verify` finds its
    chain intact and sealed with the file deleted. Control: without the
    option, stdout carries nothing (it is not the MCP channel over HTTP)."""
    tok = os.urandom(16).hex()
    outs = {}
    for flag in ([], ["--audit-stdout"]):
        log = ws[1] / "audit.jsonl"
        log.unlink(missing_ok=True)
        p = server_params(ws, "--http", f"{POD_IP}:0", "--token-file", token_file(secrets, tok), "--allowed-host", POD_IP, *flag)
        proc = subprocess.Popen([p.command, *p.args], env=p.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = ""
        for line in proc.stderr:
            if "serving MCP at " in line:
                break
        url = line.split("serving MCP at ")[1].split()[0]
        assert raw_call(url.removesuffix("/mcp"), {"Authorization": f"Bearer {tok}"}, "sandbox_status", {})
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        outs[bool(flag)] = (out, log.read_text())
    assert outs[False][0] == ""
    out, text = outs[True]
    assert out == text and '"tool":"sandbox_status"' in out
    copy = ws[1] / "collected.jsonl"
    copy.write_text(out)
    (ws[1] / "audit.jsonl").unlink()
    v = subprocess.run([BIN, "audit", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and "sealed" in v.stdout, v.stdout + v.stderr


def test_the_templates_own_arguments_serve_through_the_router_after_adoption(ws, tmp_path):
    """The SandboxTemplate's container arguments as rendered, expanded as the
    kubelet expands $(VAR) from the Downward API (status.podIP,
    metadata.name, metadata.namespace), with only the workspace and the
    port made local: the pod starts unclaimed, `token set` adopts it, the
    router reaches it by its DNS name and by its IP. Control: a variable
    the kubelet could not expand stays literal, and serve refuses to start."""
    out = subprocess.run(["kubectl", "kustomize", str(pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "agent-sandbox" / "default")], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=120)
    assert out.returncode == 0, out.stderr
    import yaml

    t = next(o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "SandboxTemplate")
    (c,) = t["spec"]["podTemplate"]["spec"]["containers"]
    env = {"POD_IP": POD_IP, "POD_NAME": "sbx-1", "POD_NAMESPACE": "agents"}
    assert {e["name"] for e in c["env"]} == set(env)
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in c["args"]]
    args[args.index("--workspace") + 1] = str(ws[0])
    args[args.index("--http") + 1] = f"{POD_IP}:0"
    argv = [BIN, *args, "--audit-log", str(ws[1] / "audit.jsonl")]
    tok = os.urandom(16).hex()
    router = SandboxRouter(dns={NAME: POD_IP})
    try:
        with pod(ws, argv=argv) as (port, inst, proc):
            assert post_init(router, through(port, tok)).status_code == 401
            assert token_set(ws, inst, tok).returncode == 0
            assert post_init(router, through(port, tok)).status_code == 200
            assert post_init(router, through(port, tok, by_ip=True)).status_code == 200
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        router.close()
    literal = ["$(POD_IP)" if a == POD_IP else a for a in argv]
    r = subprocess.run(literal, env=server_params(ws).env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and '--allowed-host "$(POD_IP)"' in r.stderr, r.stderr


CONFORMANCE = pathlib.Path(__file__).resolve().parents[1] / "conformance"


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
def test_the_conformance_suite_passes_through_the_router(ws, secrets, version):
    """The official MCP conformance suite (tests/conformance, installed by
    `npm ci` as .ci/run does) against `serve --http --token-header` behind
    the stand-in router, with the same expected failures as without it. The
    suite cannot send headers: the router adds the routing headers and the
    token as a client's configuration would, and Authorization with its
    own credential, which it strips."""
    node = CONFORMANCE / "node_modules" / ".bin" / "node"
    suite = CONFORMANCE / "node_modules" / f"conformance-{version}" / "dist" / "index.js"
    if not suite.exists():
        pytest.fail("npm ci --prefix tests/conformance first (.ci/run does)")
    prof = profile_with(ws, http_max_sessions=256)
    tok = os.urandom(16).hex()
    with pod(ws, "-p", prof, "--toolsets", "inspect", "--token-file", token_file(secrets, tok), "--token-header", "X-Sandmux-Token", *hosts_for_the_pod()) as (port, _, _):
        router = SandboxRouter(dns={NAME: POD_IP}, inject=through(port, tok))
        try:
            r = subprocess.run([str(node), str(suite), "server", "--url", router.url + "/mcp", "--spec-version", version, "--expected-failures", str(CONFORMANCE / f"expected-failures-{version}.yaml")], capture_output=True, text=True, timeout=600, cwd=ws[1])
        finally:
            router.close()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert all("authorization" not in f for f in router.forwarded)
