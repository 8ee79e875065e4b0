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

import pytest

from conftest import call, runtime_dir_of, serve_pids
from standins import NAMES, Standins
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

