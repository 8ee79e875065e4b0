"""Network mode `proxy`, driven through MCP as an agent would: real clients
(curl, git over smart HTTP, pip, npm) in a pane reach local HTTPS stand-ins
on the host's loopback through the proxy the supervisor serves, by pinned
names ending in `.test` (the test profile allows 127.0.0.0/8); escapes from
a pane reach nothing, each with a positive control; a flood of connections
is refused past the cap with the supervisor's memory bounded. The
stand-ins' certificates come from a CA made at run time; the proxy never
sees plaintext."""

import errno
import fcntl
import json
import os
import pathlib
import shutil
import socket
import subprocess
import time

import anyio
import pytest

from conftest import audit_records, call, serve_pids, server_params
from standins import NAMES, Canary, Standins
from test_escape import host_ipv4, launch, profile, run_probe

pytestmark = pytest.mark.anyio

SIOCGIFMTU, SIOCSIFMTU = 0x8921, 0x8922
ALL = ["--toolsets", "inspect,manage,execute,teardown"]


def proxy_net(port, allow=(), private=("127.0.0.0/8",), pins=None):
    names = [f"{n}:{port}" for n in NAMES] + list(allow)
    pins = {**{n: "127.0.0.1" for n in NAMES}, **(pins or {})}
    table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in pins.items())
    return lambda t: t.replace('mode = "none"', f'mode = "proxy"\nallow = {json.dumps(names)}\nallow_private = {json.dumps(list(private))}\nhosts = {{ {table} }}')


@pytest.fixture
def standins(tmp_path):
    s = Standins(tmp_path).start()
    yield s
    s.stop()


async def sh(c, cmd, timeout=30):
    r = await call(c, "run_command", {"command": cmd, "timeout": timeout})
    assert r["status"] == "completed", r
    return r


async def test_real_clients_through_the_proxy(ws, standins):
    (ws[0] / "ca.pem").write_bytes(standins.ca.read_bytes())
    port = standins.port
    prof = profile(ws, "proxy-clients", proxy_net(port))
    async with launch(ws, "-p", prof, *ALL) as c:
        st = await call(c, "sandbox_status")
        said = [x for x in st["limits"]["impossible"] if "through the proxy" in x]
        assert st["network"] == "proxy" and said and "http://127.0.0.1:3128" in said[0], st
        assert f"files.test:{port}" in said[0], said
        r = await sh(c, f"curl -sS --cacert ca.pem https://files.test:{port}/hello.txt")
        assert "hello through the proxy" in r["output"] and r["exit_status"] == 0, r
        r = await sh(c, f"git -c http.sslCAInfo=$PWD/ca.pem clone -q https://git.test:{port}/repo.git cloned && cat cloned/README")
        assert "cloned through the proxy" in r["output"] and r["exit_status"] == 0, r
        r = await sh(c, f"python3 -m pip install -q --disable-pip-version-check --no-cache-dir --cert ca.pem --index-url https://pypi.test:{port}/simple --target pipout sandmuxdemo && PYTHONPATH=pipout python3 -c 'import sandmuxdemo; print(sandmuxdemo.MESSAGE)'")
        assert "installed through the proxy" in r["output"] and r["exit_status"] == 0, r
        r = await sh(c, f"mkdir -p npmdir && cd npmdir && npm install --no-audit --no-fund --loglevel=error --cafile ../ca.pem --registry https://npm.test:{port}/ sandmux-demo && node -e 'console.log(require(\"sandmux-demo\"))'")
        assert "installed through the proxy" in r["output"] and r["exit_status"] == 0, r
        # Denied: a name not on the list gets an answer that names it.
        r = await sh(c, f"curl -sS -i -x http://127.0.0.1:3128 http://unlisted.test:{port}/hello.txt")
        assert "403" in r["output"] and "unlisted.test" in r["output"] and "the profile decides" in r["output"], r
    hosts = {h.split(":")[0] for h, _, _ in standins.requests}
    assert {"files.test", "git.test", "pypi.test", "npm.test"} <= hosts, standins.requests
    recs = [r for r in audit_records(ws) if r["tool"] == "(proxy)"]
    allowed = {r["args"]["name"] for r in recs if r["error_type"] == "proxy_allowed"}
    assert {f"{n}:{port}" for n in NAMES} <= allowed, recs
    denied = [r for r in recs if r["error_type"] == "proxy_denied"]
    assert any(r["args"]["name"] == f"unlisted.test:{port}" for r in denied), recs


ESCAPE_PROBE = r'''
import ssl
port, cport, hip, lan_port = (int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
def hello(sni):
    ctx = ssl.create_default_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    o = ctx.wrap_bio(inc, out, server_hostname=sni)
    try:
        o.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()
def with_ext(h, typ):
    """The ClientHello `h` with one more (empty) extension `typ` at the end."""
    i = 5 + 4 + 2 + 32
    i += 1 + h[i]
    i += 2 + int.from_bytes(h[i:i + 2], "big")
    i += 1 + h[i]
    ext = typ.to_bytes(2, "big") + b"\x00\x00"
    grow = lambda b, n: (int.from_bytes(b, "big") + n).to_bytes(len(b), "big")
    return h[:3] + grow(h[3:5], 4) + h[5:6] + grow(h[6:9], 4) + h[9:i] + grow(h[i:i + 2], 4) + h[i + 2:] + ext
def ask(head):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(head)
    got = b""
    while b"\r\n\r\n" not in got:
        b = s.recv(4096)
        if not b:
            break
        got += b
    code = int(got.split(b" ")[1]) if got.startswith(b"HTTP/") else ("closed" if not got else got[:40].decode(errors="replace"))
    return s, code
def connect(target, host=None):
    h = b"CONNECT " + target.encode() + b" HTTP/1.1\r\n" + (b"Host: " + host.encode() + b"\r\n" if host else b"") + b"\r\n"
    s, code = ask(h)
    s.close()
    return code
def tunnel(target, first):
    """CONNECT, then `first`; what comes back (b'' when the proxy closes)."""
    s, code = ask(b"CONNECT " + target.encode() + b" HTTP/1.1\r\n\r\n")
    if code != 200:
        return code
    s.sendall(first)
    try:
        back = s.recv(8)
    except OSError as e:
        back = en(e.errno)
    s.close()
    if isinstance(back, bytes):
        return back[:1].hex() if back else "closed"
    return back
def plain(head):
    s, code = ask(head)
    s.close()
    return code
R["direct_loopback"] = tr(lambda: socket.create_connection(("127.0.0.1", cport), timeout=5) and 0)
R["direct_host_ip"] = tr(lambda: socket.create_connection((hip, cport), timeout=5) and 0)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
R["udp53"] = tr(lambda: u.sendto(b"\x00" * 12, (hip, 53)) and 0)
R["udp53_public"] = tr(lambda: u.sendto(b"\x00" * 12, ("8.8.8.8", 53)) and 0)
R["ipv6"] = tr(lambda: socket.create_connection(("2001:4860:4860::8888", 443), timeout=5) and 0)
R["noproxy"] = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", "ca.pem", f"https://files.test:{port}/hello.txt"], capture_output=True).returncode
R["name"] = connect(f"canary.test:{cport}")
R["name_case"] = connect(f"CANARY.Test:{cport}")
R["name_dot"] = connect(f"canary.test.:{cport}")
R["name_unicode"] = connect(f"c\u00e4nary.test:{cport}")
R["ip_literal"] = connect(f"127.0.0.1:{cport}")
R["ip6_literal"] = connect(f"[::1]:{cport}")
R["numeric_name"] = connect(f"2130706433:{cport}")
R["host_header"] = connect(f"files.test:{port}", host=f"canary.test:{cport}")
R["lan_private"] = connect(f"lan.test:{lan_port}")
R["sni_mismatch"] = tunnel(f"files.test:{port}", hello("canary.test"))
R["esni_draft"] = tunnel(f"files.test:{port}", with_ext(hello("files.test"), 0xffce))
R["sni_none"] = tunnel(f"files.test:{port}", b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00")
R["chained"] = tunnel(f"files.test:{port}", f"CONNECT canary.test:{cport} HTTP/1.1\r\n\r\n".encode())
R["plain_in_tunnel"] = tunnel(f"files.test:{port}", b"GET / HTTP/1.1\r\nHost: canary.test\r\n\r\n")
R["dup_cl"] = plain(f"POST http://files.test:{port}/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx".encode())
R["cl_te"] = plain(f"POST http://files.test:{port}/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\nx".encode())
R["te"] = plain(f"POST http://files.test:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode())
R["origin_form"] = plain(b"GET / HTTP/1.1\r\nHost: canary.test\r\n\r\n")
R["plain_name"] = plain(f"GET http://canary.test:{cport}/ HTTP/1.1\r\n\r\n".encode())
R["sni_ok"] = tunnel(f"files.test:{port}", hello("files.test"))
'''


async def test_escapes_from_a_pane_reach_nothing(ws, standins):
    (ws[0] / "ca.pem").write_bytes(standins.ca.read_bytes())
    canary = Canary("127.0.0.1")
    hip = host_ipv4()
    lan = Canary(hip)
    port = standins.port
    pins = {"canary.test": "127.0.0.1", "lan.test": hip}
    allow = [f"lan.test:{lan.port}"]
    try:
        prof = profile(ws, "proxy-escape", proxy_net(port, allow=allow, pins=pins))
        before = standins.accepted
        async with launch(ws, "-p", prof, *ALL) as c:
            r, _ = await run_probe(c, ws, "proxy", ESCAPE_PROBE, port, canary.port, hip, lan.port, timeout=30)
        assert r["direct_loopback"] == "ECONNREFUSED", r  # the sandbox's own loopback
        assert r["direct_host_ip"] == "ENETUNREACH" and r["udp53"] == "ENETUNREACH" and r["udp53_public"] == "ENETUNREACH", r
        assert r["ipv6"] in ("ENETUNREACH", "EADDRNOTAVAIL"), r
        assert r["noproxy"] != 0, r
        for k in ("name", "name_case", "name_dot", "ip_literal", "ip6_literal", "numeric_name", "plain_name"):
            assert r[k] == 403, (k, r)
        assert r["name_unicode"] in (400, 403), r
        for k in ("host_header", "dup_cl", "cl_te", "origin_form"):
            assert r[k] == 400, (k, r)
        assert r["te"] == 411, r
        if hip != "127.0.0.1":
            assert r["lan_private"] == 403, r
        for k in ("sni_mismatch", "esni_draft", "sni_none", "chained", "plain_in_tunnel"):
            assert r[k] in ("closed", "ECONNRESET"), (k, r)
        # The one allowed tunnel (SNI = CONNECT host) got a TLS answer.
        assert r["sni_ok"] == "16", r
        time.sleep(0.2)
        assert canary.seen == [] and lan.seen == [], (canary.seen, lan.seen)
        assert standins.accepted == before + 1, "only the allowed tunnel reached the stand-in"
        denied = [x for x in audit_records(ws) if x["tool"] == "(proxy)" and x["error_type"] == "proxy_denied"]
        assert any("ClientHello names canary.test" in (x["args"]["reason"] or "") for x in denied), denied
        # Positive controls. (a) The same direct connect from the host reaches the canary.
        socket.create_connection(("127.0.0.1", canary.port), timeout=5).close()
        # (b) A profile that lists canary.test (and allows the LAN address):
        # the same CONNECTs reach both listeners.
        time.sleep(0.2)
        assert len(canary.seen) == 1
        priv = ["127.0.0.0/8"] + ([f"{hip}/32"] if hip != "127.0.0.1" else [])
        open_prof = profile(ws, "proxy-escape-open", proxy_net(port, allow=allow + [f"canary.test:{canary.port}"], private=priv, pins=pins))
        async with launch(ws, "-p", open_prof, *ALL) as c:
            r, _ = await run_probe(c, ws, "proxy2", ESCAPE_PROBE.replace('R["sni_mismatch"]', 'R["open"] = tunnel(f"canary.test:{cport}", hello("canary.test"))\nR["lan_open"] = tunnel(f"lan.test:{lan_port}", hello("lan.test"))\nR["sni_mismatch"]'), port, canary.port, hip, lan.port, timeout=30)
        assert r["name"] == 200 and r["name_case"] == 200 and r["name_dot"] == 200, r
        time.sleep(0.2)
        assert any(s.startswith(b"\x16") for s in canary.seen), canary.seen
        if hip != "127.0.0.1":
            assert r["lan_private"] == 200 and any(s.startswith(b"\x16") for s in lan.seen), (r, lan.seen)
    finally:
        canary.close()
        lan.close()


FLOOD_PROBE = r'''
n = int(sys.argv[2])
held, refused, other = [], 0, 0
for i in range(n):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    held.append(s)
time.sleep(1)
for s in held:
    s.setblocking(False)
    try:
        b = s.recv(200)
        if b.startswith(b"HTTP/1.1 503"):
            refused += 1
        else:
            other += 1
    except BlockingIOError:
        pass
R["refused"] = refused
R["other"] = other
R["open"] = n - refused - other
for s in held:
    s.close()
'''


def rss_kib(pid):
    for l in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
    return 0


async def test_a_flood_is_refused_past_the_cap_and_memory_stays_bounded(ws, standins):
    port = standins.port
    prof = profile(ws, "proxy-flood", proxy_net(port))
    async with launch(ws, "-p", prof, *ALL) as c:
        pid = serve_pids(ws[0])[0]
        before = rss_kib(pid)
        r, _ = await run_probe(c, ws, "flood", FLOOD_PROBE, 400, timeout=30)
        after = rss_kib(pid)
    print(f"proxy flood: 400 connections, {r}, supervisor RSS {before} KiB -> {after} KiB")
    assert r["open"] == 64 and r["refused"] == 336 and r["other"] == 0, r
    assert after - before < 32 * 1024, (before, after)
    recs = [x for x in audit_records(ws) if x["tool"] == "(proxy)"]
    # Aggregated past the first records of an interval: far fewer records than decisions.
    assert 0 < len(recs) < 200, len(recs)
    assert any(x["args"].get("aggregated") for x in recs), recs[-3:]


AUDIT_FLOOD_PROBE = r'''
# Denied CONNECTs to 400 distinct long names, for 12 s.
end, n = time.time() + 12, 0
while time.time() < end:
    for i in range(400):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(f"CONNECT {'x' * 200}{i}.flood.test:443 HTTP/1.1\r\n\r\n".encode())
        s.recv(512)
        s.close()
        n += 1
R["sent"] = n
'''


async def test_a_pane_flood_cannot_spend_the_audit_budget(ws, standins):
    """A pane floods the proxy with denied CONNECTs to many distinct long
    names under the smallest audit budget (64 KiB). The proxy's records stay
    inside their share (an eighth), the rest is counted in the seal, and
    tool calls are still admitted afterwards. Without the share (the
    positive control, before the fix) the flood filled the budget and
    every later call was refused."""
    prof = profile(ws, "proxy-audit", lambda t: proxy_net(standins.port)(t).replace('audit_max_bytes = "256MiB"', 'audit_max_bytes = "64KiB"'))
    async with launch(ws, "-p", prof, *ALL) as c:
        r, _ = await run_probe(c, ws, "auditflood", AUDIT_FLOOD_PROBE, timeout=40)
        assert r["sent"] > 2000, r
        st = await call(c, "sandbox_status")
        assert "network" in st, st
        await sh(c, "echo still-admitted")
    lines = (ws[1] / "audit.jsonl").read_text().splitlines(keepends=True)
    proxy = [json.loads(l) for l in lines if json.loads(l)["tool"] == "(proxy)"]
    size = sum(len(l) for l in lines if json.loads(l)["tool"] == "(proxy)")
    assert 0 < size <= 64 * 1024 // 8, size
    seal = json.loads(lines[-1])
    assert seal["tool"] == "(sealed)" and seal["args"]["proxy_unrecorded"] > 0, seal
    assert seal["args"]["refused_calls"] == 0, seal
    summaries = [x for x in proxy if x["args"].get("aggregated")]
    assert all(len(x["args"]["top"]) <= 5 for x in summaries), summaries[:2]


TRICKLE_PROBE = r'''
# A request head one byte every 0.3 s: never idle for 1 s, but 9 s in all.
head = b"CONNECT unlisted.test:1 HTTP/1.1\r\n\r\n"
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
sent = 0
try:
    for b in head:
        s.send(bytes([b]))
        sent += 1
        time.sleep(0.3)
    R["answer"] = s.recv(64).decode(errors="replace")
except OSError as e:
    R["answer"] = "closed: " + en(e.errno)
R["sent"], R["len"] = sent, len(head)
'''


async def test_a_trickled_head_cannot_hold_a_slot(ws, standins):
    """A pane client sends its request head a byte at a time, each gap
    shorter than the idle time (1 s here): the head and ClientHello have
    one deadline in all, so the proxy closes the connection before the head
    is whole. Before the deadline (the positive control) each byte restarted
    the idle timer and the head, once whole after 9 s, was answered 403."""
    prof = profile(ws, "proxy-trickle", lambda t: proxy_net(standins.port)(t).replace('mode = "proxy"', 'mode = "proxy"\nproxy_idle_seconds = 1'))
    async with launch(ws, "-p", prof, *ALL) as c:
        r, _ = await run_probe(c, ws, "trickle", TRICKLE_PROBE, timeout=30)
    assert "403" not in r["answer"], r
    assert r["sent"] < r["len"] or r["answer"] in ("", "closed: ECONNRESET"), r
    recs = [x for x in audit_records(ws) if x["tool"] == "(proxy)"]
    assert any("no whole request head" in (x["args"].get("reason") or "") for x in recs), recs


def test_proxy_mode_needs_landlock_abi_4_for_the_supervisor(ws, standins):
    """Below Landlock ABI 4 the supervisor's TCP connects could not be kept
    to the allow list's ports, so `serve` in proxy mode refuses to start
    (exit 3, naming the reason); with `supervisor` best effort it starts.
    Control: the same profile at ABI 4 starts."""
    def serve(abi, best_effort=False):
        def edit(t):
            t = proxy_net(standins.port)(t).replace("[enforcement]\n", f"[enforcement]\nlandlock_abi = {abi}\n", 1)
            # The sandbox's own layers that need a later ABI are best effort in all three.
            t = t.replace("best_effort = [", 'best_effort = ["landlock-scope", "landlock-net", ', 1)
            return t.replace("best_effort = [", 'best_effort = ["supervisor", ', 1) if best_effort else t
        prof = profile(ws, f"proxy-abi{abi}{'-be' if best_effort else ''}", edit)
        p = server_params(ws, "-p", prof)
        return subprocess.run([p.command, *p.args], env=p.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    low = serve(3)
    assert low.returncode == 3 and "network mode proxy needs Landlock ABI 4" in low.stderr, (low.returncode, low.stderr)
    # Started: the sandbox is up and serve waits for a client (stdin is empty).
    ok = serve(4)
    assert ok.returncode != 3 and "initialize request" in ok.stderr, (ok.returncode, ok.stderr)
    be = serve(3, best_effort=True)
    assert be.returncode != 3 and "initialize request" in be.stderr, (be.returncode, be.stderr)


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (.ci/run installs it)")
async def test_the_confined_supervisor_connects_only_to_the_lists_ports(ws, standins):
    """In proxy mode serve may make inet sockets and connect, but only to the
    ports the allow list can reach: code injected into serve (gdb, as in
    test_self_confinement.py) reaches a listener on such a port and not one
    on any other port, and it can make no other socket family, no raw, SCTP
    or UDP inet socket (every name is pinned: no resolver) and no socket
    configuration ioctl (SIOCSIFMTU, `ifconfig … mtu`). The unlisted-port
    attempt is its own negative control; the host, unconfined, makes the
    same UDP datagram arrive and the same ioctl reach the network stack."""
    from test_self_confinement import inject

    port = standins.port
    other = Canary("127.0.0.1")
    listed = socket.socket()
    try:
        listed.bind(("127.0.0.2", port))  # same port number as the stand-in, another address
    except OSError as e:
        pytest.skip(f"cannot bind 127.0.0.2:{port}: {e}")
    listed.listen(4)
    listed.settimeout(5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    # Controls, on the host: the datagram arrives; an interface ioctl
    # reaches the stack through a unix socket (ENODEV: no interface named
    # ""; SIOCSIFMTU asks for CAP_NET_ADMIN first, so the get is the control).
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"host\n", udp.getsockname())
    assert udp.recv(16) == b"host\n"
    with pytest.raises(OSError) as e, socket.socket(socket.AF_UNIX) as u:
        fcntl.ioctl(u, SIOCGIFMTU, bytes(40))
    assert e.value.errno == errno.ENODEV, e.value
    prof = profile(ws, "proxy-sup", proxy_net(port))
    try:
        async with launch(ws, "-p", prof, *ALL) as c:
            st = await call(c, "sandbox_status")
            sup = [l for l in st["layers"] if l["layer"] == "supervisor"][0]
            assert sup["enforced"] and f"TCP connect only to ports [{port}]" in sup["detail"], sup
            pid = serve_pids(ws[0])[0]
            calls = [
                f"(int)system(\"bash -c 'echo unlisted >/dev/tcp/127.0.0.1/{other.port}'\")",
                f"(int)system(\"bash -c 'echo listed >/dev/tcp/127.0.0.2/{port}'\")",
                "(int)socket(17, 3, 0)",  # AF_PACKET
                "(int)socket(2, 1, 0)",  # AF_INET: allowed in this mode
                "(int)socket(2, 3, 1)",  # raw ICMP
                "(int)socket(10, 3, 58)",  # raw ICMPv6
                "(int)socket(2, 2, 0)",  # UDP: every name is pinned
                "(int)socket(2, 2, 1)",  # ICMP "ping" socket
                "(int)socket(2, 1, 132)",  # SCTP, one-to-one style
                f"(int)ioctl((int)socket(1, 1, 0), {SIOCSIFMTU}, ((void*(*)(long, long))calloc)(1, 64))",
                f"(int)ioctl((int)socket(1, 1, 0), {SIOCGIFMTU}, ((void*(*)(long, long))calloc)(1, 64))",
                f"(int)system(\"bash -c 'echo udp >/dev/udp/127.0.0.1/{udp.getsockname()[1]}'\")",
            ]
            got, out = await anyio.to_thread.run_sync(inject, pid, calls, 1)
            rc = [g[0][0] for g in got]
            assert rc[0] != 0, ("connected to an unlisted port", out)
            assert rc[1] == 0, ("the listed port was not reachable", out)
            conn, _ = listed.accept()
            assert conn.recv(16) == b"listed\n"
            conn.close()
            assert rc[2] == -1 and got[2][0][1] == 1, ("a packet socket", out)
            assert rc[3] >= 0, ("no inet socket in proxy mode", out)
            for i in range(4, 11):
                assert got[i][0] == (-1, errno.EPERM), (calls[i], got[i], out)
            assert rc[11] != 0, ("a UDP datagram from serve", out)
            with pytest.raises(socket.timeout):
                udp.recv(16)
            time.sleep(0.2)
            assert other.seen == [], other.seen
    finally:
        other.close()
        listed.close()
        udp.close()
