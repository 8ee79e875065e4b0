"""Refusals the agent can read, and ranges per allowed name, driven through
MCP as an agent would. Two names on the list resolve to the same loopback
stand-in: the one whose entry says its addresses may be in 127.0.0.0/8 is
reached (the positive control), the other is refused by its address's range
— and the reason, which curl never shows, reaches the agent in the
`run_command` result and in `sandbox_status`; `sandmux check` dials each
name as the proxy would and reports which fail and why."""

import ipaddress
import json
import os
import shlex
import subprocess

import pytest

from conftest import BIN, call
from standins import Canary, Standins
from test_escape import host_ipv4, launch, profile

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


def mirror_ip():
    """A host interface address in a range the proxy refuses but a mirror may
    have (private, documentation, shared...): the stand-in mirror's."""
    ip = ipaddress.ip_address(host_ipv4())
    if ip.is_global or ip.is_loopback or ip.is_link_local:
        pytest.skip(f"no host interface address in a refused, non-loopback range (found {ip})")
    return str(ip)


def mirrored(allow, pins):
    """The default profile in proxy mode with `allow`, each name of `pins`
    pinned (the stand-in resolver: `[network] hosts`, as /etc/hosts)."""
    a = "[" + ", ".join(f'"{n}"' for n in allow) + "]"
    h = "{ " + ", ".join(f'"{n}" = "{ip}"' for n, ip in pins.items()) + " }"
    return lambda t: t.replace('mode = "none"', f'mode = "proxy"\nallow = {a}\nhosts = {h}')


def as_printed(line, env, cwd):
    """Runs a command line exactly as sandmux printed it (`sandmux` being
    the binary under test)."""
    argv = shlex.split(line)
    assert argv[0] == "sandmux", line
    return subprocess.run([BIN, *argv[1:]], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_check_on_a_mirror_network_goes_green_after_the_printed_fix(ws):
    """A newcomer on a network whose registries resolve to a mirror on a
    reserved range: `check` fails naming each name, prints the entries and
    one command; that command, run as printed, writes a local profile whose
    ranges are each the mirror's address alone; `check` with it, run as
    printed, is green. The proxy's refusal is real (the stand-in mirror sees
    no connection before the fix) and the fix opens only those names."""
    ip = mirror_ip()
    mirror = Canary(ip)
    port = mirror.port
    names = [f"pypi.mirror.test:{port}", f"files.mirror.test:{port}"]
    prof = profile(ws, "mirror-net", mirrored(names, {"pypi.mirror.test": ip, "files.mirror.test": ip}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}, "XDG_CONFIG_HOME": str(ws[1] / "config")}
    try:
        r = subprocess.run([BIN, "check", "-p", prof], capture_output=True, text=True, env=env, cwd=ws[0], timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        for n in names:
            assert f"FAILED  {n}" in r.stdout, r.stdout
            assert f'{{ name = "{n}", ranges = ["{ip}/32"] }},' in r.stdout, r.stdout
        assert "a probe did not match" not in r.stdout and "the fix is above" in r.stdout, r.stdout
        assert mirror.seen == [], "the proxy's dial reached a refused address"
        fix = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("sandmux profile mirror ")]
        assert fix == [f"sandmux profile mirror {prof} --write"], r.stdout
        w = as_printed(fix[0], env, ws[0])
        assert w.returncode == 0, w.stdout + w.stderr
        written = ws[1] / "config" / "sandmux" / "profiles" / "mirror-net-mirror.toml"
        text = written.read_text()
        assert text.count(f'ranges = ["{ip}/32"]') == 4 and "allow_private = []" not in text, text  # 2 entries + 2 in the note
        assert "ranges" not in (ws[1] / "mirror-net.toml").read_text(), "the profile checked was changed"
        use = [l.split("use it: ", 1)[1].split("   ")[0] for l in w.stdout.splitlines() if l.startswith("use it: ")]
        assert use == ["sandmux check -p mirror-net-mirror"], w.stdout
        g = as_printed(use[0], env, ws[0])
        assert g.returncode == 0 and "enforceable; every probe matched the profile" in g.stdout, g.stdout + g.stderr
        for n in names:
            assert f"ok      {n}: connected to {ip}:{port}" in g.stdout, g.stdout
        assert len(mirror.seen) == 2, mirror.seen
        # The same command again rewrites its own file (the mirror moved), once.
        again = as_printed(fix[0], env, ws[0])
        assert again.returncode == 0 and written.read_text().count("Written by `sandmux profile mirror`") == 1, again.stderr
    finally:
        mirror.close()


def test_a_name_this_network_lacks_is_a_warning_not_a_mismatch(ws):
    """An allowed name that resolves nowhere (`.invalid`, RFC 6761) is a
    warning with exit status 4 — a CI gate tells it from a sandbox that
    does not match (1) — and `profile mirror` leaves it as it is. Control:
    without that name the same check exits 0."""
    ip = mirror_ip()
    mirror = Canary(ip)
    port = mirror.port
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}, "XDG_CONFIG_HOME": str(ws[1] / "config")}
    ok = f'{{ name = "pypi.mirror.test:{port}", ranges = ["{ip}/32"] }}'
    pin = f'hosts = {{ "pypi.mirror.test" = "{ip}" }}'
    try:
        for name, allow, want in [("lacking", f'[{ok}, "gone.sandmux.invalid:{port}"]', 4), ("whole", f"[{ok}]", 0)]:
            prof = profile(ws, name, lambda t: t.replace('mode = "none"', f'mode = "proxy"\nallow = {allow}\n{pin}'))
            r = subprocess.run([BIN, "check", "-p", prof], capture_output=True, text=True, env=env, cwd=ws[0], timeout=120)
            assert r.returncode == want, (name, r.returncode, r.stdout + r.stderr)
            assert "a probe did not match" not in r.stdout, r.stdout
            j = subprocess.run([BIN, "check", "--json", "-p", prof], capture_output=True, text=True, env=env, cwd=ws[0], timeout=120)
            rep = json.loads(j.stdout)
            assert j.returncode == want and rep["all_passed"], rep
            if want == 4:
                assert f"WARNING gone.sandmux.invalid:{port}" in r.stdout and "exit status 4" in r.stdout, r.stdout
                assert [w.split(":")[0] for w in rep["warnings"]] == ["gone.sandmux.invalid"], rep["warnings"]
                m = subprocess.run([BIN, "profile", "mirror", prof, "--write"], capture_output=True, text=True, env=env, timeout=120)
                assert m.returncode == 0 and "nothing to add" in m.stdout and "warning  gone.sandmux.invalid" in m.stdout, m.stdout
                assert not (ws[1] / "config" / "sandmux" / "profiles").exists()
            else:
                assert rep["warnings"] == [] and "WARNING" not in r.stdout, r.stdout
    finally:
        mirror.close()


async def test_repeated_refusals_read_once_with_a_count(ws, standins):
    """A client's retries of one refused name read as one line, "refused
    7×", in the `run_command` result; a second name keeps its own line
    (the count does not merge different refusals)."""
    port = standins.port
    prof = profile(ws, "repeats", ranged(port))
    async with launch(ws, "-p", prof) as c:
        loop = f"for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null https://pypi.test:{port}/; done; curl -s -o /dev/null https://other.test:{port}/; true"
        r = await call(c, "run_command", {"command": loop})
        note = r.get("note", "")
        lines = note.split("the network proxy refused while this ran: ", 1)[1].split(" | ")
        assert len(lines) == 2, note
        assert lines[0].startswith(f"pypi.test:{port}") and lines[0].endswith(" — refused 7×"), note
        assert lines[1].startswith(f"other.test:{port}") and "×" not in lines[1], note
        assert note.count(f"pypi.test:{port}: ") == 1, note
        st = await call(c, "sandbox_status")
        assert sum("pypi.test" in x for x in st["network_refusals"]) == 1, st
    assert standins.requests == [], standins.requests
