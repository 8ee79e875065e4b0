"""`sandmux expose`: a dev server inside the sandbox, reached from the host
through the real CLI and the real `serve`, refused after `revoke` and after
the instance's end; the listener is on loopback unless the operator names
another address; and the agent reaches nothing new while a port is exposed
(network mode none: its outbound connects still fail)."""

import json
import os
import socket
import subprocess
import time
import urllib.request

import anyio
import pytest

from conftest import BIN, call, connect, runtime_dir_of, serve_pids

pytestmark = pytest.mark.anyio

PORT = 8765


def sm(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30, env=env)


def instance_id(ws):
    return runtime_dir_of(serve_pids(ws[0])[0]).name


def host_ip():
    """The host's address on its default route (not loopback), or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


def get(url, tries=100):
    """The page at `url`, retried while the server inside starts."""
    last = None
    for _ in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read().decode()
        except OSError as e:
            last = e
            time.sleep(0.1)
    ps = sm("ps", "--json").stdout
    listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    raise AssertionError(f"{url}: {last}\nps: {ps}\nlistening: {listening}")


def refused(addr):
    try:
        socket.create_connection(addr, timeout=3).close()
    except OSError:
        return True
    return False


async def dev_server(c, ws, token):
    (ws[0] / "index.html").write_text(token)
    await call(c, "run_command", {"command": f"python3 -m http.server {PORT} --directory {ws[0]} >/dev/null 2>&1 &"})


async def inside_connect(c, host, port):
    """What a pane gets connecting to (host, port): "ok" or the error."""
    code = f"import socket\ntry:\n socket.create_connection(({host!r}, {port}), timeout=3).close(); print('ok')\nexcept OSError as e: print('err', e.errno)"
    out = await call(c, "run_command", {"command": "python3 - <<'PY'\n" + code + "\nPY"})
    return out["output"].strip()


async def test_a_dev_server_inside_is_reached_through_expose_and_refused_after_revoke(ws):
    token = f"page-{os.getpid()}-{time.monotonic_ns()}"
    async with connect(ws) as c:
        await dev_server(c, ws, token)
        iid = instance_id(ws)
        r = sm("expose", iid, str(PORT))
        assert r.returncode == 0, r.stderr
        host = r.stdout.strip()
        ip, hp = host.rsplit(":", 1)
        assert ip == "127.0.0.1" and int(hp) > 0, host
        assert get(f"http://{host}/index.html") == token
        ps = json.loads(sm("ps", "--json").stdout)
        me = next(x for x in ps if x["id"] == iid)
        [e] = me["exposures"]
        assert e["port"] == PORT and e["host"] == host and e["loopback"] is True and e["tally"]["connections"] >= 1, e
        assert f"port {PORT} exposed at {host}" in sm("ps").stdout
        # The agent gains nothing: under network mode none the host's port
        # is not reachable from a pane (127.0.0.1 there is the sandbox's own).
        assert (await inside_connect(c, "127.0.0.1", int(hp))).startswith("err")
        # revoke: the host listener is gone, the next connect is refused.
        r = sm("revoke", iid, "--expose", str(PORT))
        assert r.returncode == 0 and "no longer exposed" in r.stdout, (r.stdout, r.stderr)
        assert refused(("127.0.0.1", int(hp)))
        assert json.loads(sm("ps", "--json").stdout)[-1]["exposures"] == [] or all(
            x["exposures"] == [] for x in json.loads(sm("ps", "--json").stdout) if x["id"] == iid
        )
        r = sm("revoke", iid, "--expose", str(PORT))
        assert r.returncode == 1 and "not exposed" in r.stderr, r.stderr
        # Exposed again on a port the human chose; it ends with the instance.
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        chosen = probe.getsockname()[1]
        probe.close()
        r = sm("expose", iid, str(PORT), "--host-port", str(chosen))
        assert r.returncode == 0 and r.stdout.strip() == f"127.0.0.1:{chosen}", (r.stdout, r.stderr)
        assert get(f"http://127.0.0.1:{chosen}/index.html") == token
        recs = [json.loads(l) for l in sm("journal", iid, "--json").stdout.splitlines()]
        kinds = [x.get("error_type") for x in recs if x.get("tool") == "(expose)"]
        assert kinds == ["exposed", "unexposed", "exposed"], kinds
        assert sm("stop", iid).returncode == 0
        for _ in range(200):
            if not serve_pids(ws[0]):
                break
            await anyio.sleep(0.05)
    assert not serve_pids(ws[0])
    assert refused(("127.0.0.1", chosen))


async def test_the_host_side_is_loopback_unless_the_operator_names_an_address(ws):
    ip = host_ip()
    if ip is None:
        pytest.skip("this host has no non-loopback address to try")
    token = f"page-{os.getpid()}-{time.monotonic_ns()}"
    async with connect(ws) as c:
        await dev_server(c, ws, token)
        iid = instance_id(ws)
        host = sm("expose", iid, str(PORT)).stdout.strip()
        hp = int(host.rsplit(":", 1)[1])
        assert get(f"http://{host}/index.html") == token
        # Loopback only: the host's other address does not answer.
        assert refused((ip, hp))
        assert sm("revoke", iid, "--expose", str(PORT)).returncode == 0
        # Positive control: named explicitly, another address does answer,
        # and ps says it is not loopback.
        r = sm("expose", iid, str(PORT), "--address", "0.0.0.0")
        assert r.returncode == 0, r.stderr
        wide = int(r.stdout.strip().rsplit(":", 1)[1])
        assert get(f"http://{ip}:{wide}/index.html") == token
        assert "(NOT loopback)" in sm("ps").stdout
        # The agent still cannot reach the host, not even the exposed port
        # on the host's own address (network mode none: nothing leaves).
        assert (await inside_connect(c, ip, wide)).startswith("err")


async def test_what_expose_refuses(ws):
    async with connect(ws) as c:
        await call(c, "run_command", {"command": "true"})
        iid = instance_id(ws)
        for args, why in [
            (["80"], "from 1024"),
            (["0"], "from 1024"),
            (["8000", "--host-port", "22"], "--host-port 22"),
            (["8000", "--address", "localhost"], "not an IP address"),
            (["8000", "--address", "203.0.113.7"], "listening on 203.0.113.7"),
        ]:
            r = sm("expose", iid, *args)
            assert r.returncode == 1 and why in r.stderr, (args, r.stderr)
        # A non-loopback address cannot be given as the host port.
        r = sm("expose", iid, "8000", "--host-port", "0.0.0.0:9000")
        assert r.returncode != 0
        hosts = [sm("expose", iid, str(8000 + i)).stdout.strip() for i in range(8)]
        assert all(h.startswith("127.0.0.1:") for h in hosts), hosts
        r = sm("expose", iid, "8000")
        assert r.returncode == 1 and "already exposed" in r.stderr, r.stderr
        r = sm("expose", iid, "9000")
        assert r.returncode == 1 and "8 ports are exposed" in r.stderr, r.stderr
        # Nothing listens inside: a host connect is accepted, then closed.
        s = socket.create_connection(("127.0.0.1", int(hosts[0].rsplit(":", 1)[1])), timeout=5)
        s.settimeout(10)
        assert s.recv(1) == b""
        s.close()


async def test_a_port_that_never_accepts_does_not_hold_the_broker(ws):
    """The review's attack: inside, a listener with a full backlog that
    never accepts; on the host, the most connections an exposure takes.
    Each waits for its connect inside — in the supervisor, bounded — while
    the broker (which also freezes and stops the instance) answers at once:
    a second `expose` (the broker binds its listener), `freeze` and `thaw`
    return within 1.5 s each. Before, each connect held the broker up to
    5 s, one after another."""
    async with connect(ws) as c:
        iid = instance_id(ws)
        code = f"import socket,time\ns=socket.socket(); s.bind(('127.0.0.1',{PORT})); s.listen(0)\nopen('ready','w').close(); time.sleep(120)"
        (ws[0] / "stuck.py").write_text(code)
        await call(c, "run_command", {"command": "python3 stuck.py >/dev/null 2>&1 &"})
        await call(c, "run_command", {"command": "while [ ! -e ready ]; do sleep 0.05; done"})
        r = sm("expose", iid, str(PORT))
        assert r.returncode == 0, r.stdout + r.stderr
        host = json.loads(sm("ps", "--json").stdout)
        addr = next(e["host"] for x in host if x["id"] == iid for e in x["exposures"])
        h, p = addr.rsplit(":", 1)
        held = []
        for _ in range(16):
            s = socket.socket()
            s.settimeout(2)
            s.connect((h, int(p)))
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            held.append(s)
        await anyio.sleep(0.5)
        # Another request the broker serves (the listener of a second
        # exposure) and a freeze answer at once.
        for op in (("expose", iid, str(PORT + 1)), ("freeze", iid), ("thaw", iid)):
            t0 = time.monotonic()
            r = sm(*op)
            assert r.returncode == 0 and time.monotonic() - t0 < 1.5, (op, time.monotonic() - t0, r.stdout + r.stderr)
        for s in held:
            s.close()
        assert sm("revoke", iid, "--expose", str(PORT)).returncode == 0
