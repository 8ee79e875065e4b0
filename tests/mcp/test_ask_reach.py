"""Issue 41, class 5: approved names that could never connect. The
supervisor confines itself to what the proxy may dial; with `[network] ask`
that was only the allow list's ports, and no UDP when every allow entry is
pinned, so an approved name on another port failed with "Permission
denied" and one the host's resolver had to find never resolved. Now a
question may be only about `[network] ask_ports`, and the confinement
follows: those ports, and the resolver, are open to the supervisor.

Through the real confined `serve`: an approved name on a port no allow
entry names connects (the control: an allowed name on the allow list's
port, in the same run); a name on a port that is not askable is refused at
once, naming the key, with no question."""

import json
import os
import shutil

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import call, runtime_dir_of, serve_pids, server_params
from standins import NAMES, Canary, Standins
from test_proxy_resolver import StubDns
from test_approvals import ALL, open_question, sm
from test_escape import launch, profile
from test_proxy import sh

pytestmark = pytest.mark.anyio


@pytest.fixture
def two(tmp_path):
    both = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        both.append(Standins(tmp_path / d, names=NAMES + ["other.test"]).start())
    yield both
    for s in both:
        s.stop()


async def test_an_approved_name_on_an_askable_port_connects(ws, two):
    a, b = two
    (ws[0] / "a.pem").write_bytes(a.ca.read_bytes())
    (ws[0] / "b.pem").write_bytes(b.ca.read_bytes())
    pins = ", ".join(f'"{n}" = "127.0.0.1"' for n in NAMES + ["other.test", "ask.test"])
    net = (f'mode = "proxy"\nallow = ["files.test:{a.port}"]\nallow_private = ["127.0.0.0/8"]\n'
           f'hosts = {{ {pins} }}\nask = true\nask_ports = [{b.port}]')
    prof = profile(ws, "ask-ports", lambda t: t.replace('mode = "none"', net))
    async with launch(ws, "-p", prof, *ALL) as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        st = json.dumps(await call(c, "sandbox_status"))
        assert f"connect only to ports [{a.port}, {b.port}]" in st or f"connect only to ports [{b.port}, {a.port}]" in st, st
        # The control: the allow list's name and port.
        r = await sh(c, f"curl -sS --cacert a.pem https://files.test:{a.port}/hello.txt")
        assert "hello through the proxy" in r["output"], r
        # Asked, approved, and it connects on a port no allow entry names.
        await sh(c, f"(curl -sS --cacert b.pem https://other.test:{b.port}/hello.txt > o1 2>&1; echo END >> o1) &")
        q = await open_question(iid, f"https://other.test:{b.port}")
        assert sm("approve", iid, str(q)).returncode == 0
        r = await sh(c, "while ! grep -q END o1; do sleep 0.1; done; cat o1")
        assert "hello through the proxy" in r["output"] and "Permission denied" not in r["output"], r
        # A port no question may be about: refused at once, no question.
        r = await sh(c, f"curl -sS -i -x http://127.0.0.1:3128 http://ask.test:{a.port + 1}/")
        assert "403" in r["output"] and "ask_ports" in r["output"], r
        assert json.loads(sm("approvals", iid, "--json").stdout)["open"] == []



@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root (a private mount namespace and port 53)")
async def test_an_approved_name_resolves_when_every_allow_entry_is_pinned(ws, tmp_path):
    """Every allow entry pinned in `hosts`: the supervisor had no UDP, so an
    approved name the host's resolver must find never resolved. `serve`
    runs in a private mount namespace whose `resolv.conf` names a stub name
    server (`*.ask.example` → 127.0.0.1); the approved name resolves through
    it and its request reaches a listener. The control: nothing asked the
    stub about the name before the approval (it is asked about first)."""
    try:
        dns = StubDns("ask.example")
    except OSError as e:
        pytest.skip(f"cannot bind 127.0.0.1:53: {e}")
    listener = Canary("127.0.0.1")
    port = listener.port
    try:
        resolv = tmp_path / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        net = (f'mode = "proxy"\nallow = ["files.test:{port}"]\nallow_private = ["127.0.0.0/8"]\n'
               f'hosts = {{ "files.test" = "127.0.0.1" }}\nask = true\nask_ports = [{port}]')
        prof = profile(ws, "ask-resolve", lambda t: t.replace('mode = "none"', net))
        p = server_params(ws, "-p", prof, *ALL)
        inner = f'mount --bind {resolv} /etc/resolv.conf && exec "$@"'
        p = StdioServerParameters(command="unshare", args=["-m", "sh", "-c", inner, "sh", p.command, *p.args], env=p.env)
        async with Client(stdio_client(p, errlog=open(os.devnull, "w"))) as c:
            iid = runtime_dir_of(serve_pids(ws[0])[0]).name
            await sh(c, f"(curl -sS -m 20 -x http://127.0.0.1:3128 http://y.ask.example:{port}/ > o1 2>&1; echo END >> o1) &")
            q = await open_question(iid, f"http://y.ask.example:{port}")
            assert not any(n.startswith("y.ask.example") for n in dns.asked), dns.asked
            assert sm("approve", iid, str(q)).returncode == 0
            r = await sh(c, "while ! grep -q END o1; do sleep 0.1; done; cat o1")
            assert any(n.startswith("y.ask.example") for n in dns.asked), (dns.asked, r)
            assert any(b"y.ask.example" in s for s in listener.seen), (listener.seen, r)
            assert "does not resolve" not in r["output"], r
    finally:
        dns.close()
        listener.close()
