"""Refusals the agent can read, and ranges per allowed name, driven through
MCP as an agent would. Two names on the list resolve to the same loopback
stand-in: the one whose entry says its addresses may be in 127.0.0.0/8 is
reached (the positive control), the other is refused by its address's range
— and the reason, which curl never shows, reaches the agent in the
`run_command` result and in `sandbox_status`; `sandmux check` dials each
name as the proxy would and reports which fail and why."""

import json
import subprocess

import pytest

from conftest import BIN, call
from standins import Standins
from test_escape import launch, profile

pytestmark = pytest.mark.anyio


@pytest.fixture
def standins(tmp_path):
    s = Standins(tmp_path).start()
    yield s
    s.stop()


def ranged(port):
    """files.test may resolve to loopback (its entry says so); pypi.test,
    pinned to the same address, may not: nothing in allow_private."""
    allow = f'[{{ name = "files.test:{port}", ranges = ["127.0.0.0/8"] }}, "pypi.test:{port}"]'
    pins = '{ "files.test" = "127.0.0.1", "pypi.test" = "127.0.0.1" }'
    return lambda t: t.replace('mode = "none"', f'mode = "proxy"\nallow = {allow}\nhosts = {pins}')


async def test_a_ranged_entry_opens_only_its_name_and_refusals_reach_the_agent(ws, standins):
    (ws[0] / "ca.pem").write_bytes(standins.ca.read_bytes())
    port = standins.port
    prof = profile(ws, "ranged", ranged(port))
    async with launch(ws, "-p", prof) as c:
        # Positive control: the ranged name, at the same address, is reached.
        r = await call(c, "run_command", {"command": f"curl -sS --cacert ca.pem https://files.test:{port}/hello.txt"})
        assert r["exit_status"] == 0 and "hello through the proxy" in r["output"], r
        assert "note" not in r, r
        # The same address under a name without the range: refused, and
        # curl shows only its own error, so the result carries the reason.
        r = await call(c, "run_command", {"command": f"curl -sS --cacert ca.pem https://pypi.test:{port}/simple/"})
        assert r["exit_status"] != 0 and "127.0.0.1" not in r["output"], r
        note = r.get("note", "")
        assert f"pypi.test:{port}" in note and "127.0.0.1 is loopback" in note, r
        assert "allow entry" in note and "decides" in note, note
        st = await call(c, "sandbox_status")
        assert any(f"pypi.test:{port}" in x and "loopback" in x for x in st["network_refusals"]), st
        assert not any("files.test" in x for x in st["network_refusals"]), st
        # A name not on the list: the key that decides is named too.
        r = await call(c, "run_command", {"command": f"curl -sS https://unlisted.test:{port}/"})
        assert "unlisted.test" in r.get("note", "") and "allow list" in r["note"], r
    hosts = {h.split(":")[0] for h, _, _ in standins.requests}
    assert hosts == {"files.test"}, standins.requests


def test_check_dials_each_name_and_says_which_fail(ws, standins):
    port = standins.port
    prof = profile(ws, "ranged-check", ranged(port))
    r = subprocess.run([BIN, "check", "--json", "-p", prof, "-w", str(ws[0])], capture_output=True, text=True, timeout=120)
    rep = json.loads(r.stdout)
    reach = {x["name"]: x for x in rep["network"]["reach"]}
    assert reach[f"files.test:{port}"]["ok"], reach
    assert f"127.0.0.1:{port}" in reach[f"files.test:{port}"]["detail"], reach
    bad = reach[f"pypi.test:{port}"]
    assert not bad["ok"] and "loopback" in bad["detail"] and "allow entry" in bad["detail"], reach
    assert not rep["all_passed"] and r.returncode != 0, (r.returncode, rep["all_passed"])
    human = subprocess.run([BIN, "check", "-p", prof, "-w", str(ws[0])], capture_output=True, text=True, timeout=120)
    assert f"FAILED  pypi.test:{port}" in human.stdout and f"ok      files.test:{port}" in human.stdout, human.stdout


@pytest.mark.parametrize("entry, says", [
    ('{ name = "a.test" }', "at least one range"),
    ('{ name = "a.test", ranges = [] }', "at least one range"),
    ('{ name = "a.test", ranges = ["10.0.0.1/8"] }', "range"),
    ('{ name = "a.test", ranges = ["10.0.0.0/8"], port = 1 }', "table { name"),
])
def test_a_bad_entry_is_a_clear_error(ws, entry, says):
    path = ws[1] / "bad.toml"
    base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    path.write_text(base.replace('mode = "none"', f'mode = "proxy"\nallow = [{entry}]'))
    v = subprocess.run([BIN, "profile", "validate", str(path)], capture_output=True, text=True)
    out = v.stdout + v.stderr
    # A key the table does not know is a parse error: it shows the line.
    where = "allow = [" if "port" in entry else "network.allow"
    assert v.returncode != 0 and where in out and says in out, out
