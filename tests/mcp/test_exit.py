"""How `serve` ends: it reaps its own children before it exits, and a
termination signal at any moment of start-up gives exit status 0 and leaves
nothing behind (no process, runtime directory, mount or cgroup).

Each run happens in a small helper process that is a child subreaper
(PR_SET_CHILD_SUBREAPER) and reaps nothing itself: whatever serve leaves
behind when it exits, a zombie it did not collect or a process still running,
is re-parented to the helper and listed from /proc. That is exactly what
"left as zombies for the parent to collect" looks like from serve's parent.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import pytest

from conftest import BIN, connect

HELPER = r'''
import ctypes, json, os, pathlib, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
binp, work, audit, base, how, delay = sys.argv[1:7]
delay = float(delay)
env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
err = open(audit + ".stderr", "wb")
p = subprocess.Popen([binp, "serve", "-w", work, "--audit-log", audit], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=err, env=env)

def send(m):
    p.stdin.write((json.dumps(m) + "\n").encode()); p.stdin.flush()

def reply(i):
    while True:
        line = p.stdout.readline()
        if not line:
            return None
        m = json.loads(line)
        if m.get("id") == i:
            return m

def reached():
    """Waits (at most 10 s) until serve has reached its own code: SIGTERM is
    blocked in its mask from its first instruction on."""
    end = time.monotonic() + 10
    while not blocked() and p.poll() is None and time.monotonic() < end:
        time.sleep(0.001)

def blocked():
    try:
        for l in pathlib.Path(f"/proc/{p.pid}/status").read_text().splitlines():
            if l.startswith("SigBlk:"):
                return int(l.split()[1], 16) & (1 << (signal.SIGTERM - 1)) != 0
    except OSError:
        pass
    return False

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
        "capabilities": {}, "clientInfo": {"name": "exit-test", "version": "0"}}}
seen = set()
def note():
    seen.update(d.name for d in pathlib.Path(base).glob("*") if not d.name.startswith("."))

if how in ("eof", "sigterm", "stop", "handshake"):
    send(INIT)
    assert reply(1) is not None
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    # A tool call, so the hub's command client has done work.
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_panes", "arguments": {}}})
    assert "result" in reply(2)
    note()
    if how == "eof":
        p.stdin.close()
    elif how in ("sigterm", "handshake"):
        os.kill(p.pid, signal.SIGTERM)
    else:
        ids = [d for d in seen]
        assert len(ids) == 1, ids
        subprocess.run([binp, "stop", ids[0]], env=env, check=True, timeout=30)
elif how == "during-handshake":
    reached()
    send(INIT)
    time.sleep(delay / 1000)
    note()
    os.kill(p.pid, signal.SIGTERM)
else:  # early: a signal `delay` ms after serve reached its own code ("raw": after the exec)
    sig = {"early": signal.SIGTERM, "raw": signal.SIGTERM, "sigint": signal.SIGINT, "sighup": signal.SIGHUP}[how]
    if how != "raw":
        reached()
    time.sleep(delay / 1000)
    note()
    os.kill(p.pid, sig)
rc = p.wait(timeout=60)
note()
time.sleep(0.2)  # anything serve's exit set off (a parent-death signal) has happened
left = []
for d in pathlib.Path("/proc").iterdir():
    if not d.name.isdigit():
        continue
    try:
        st = (d / "stat").read_text()
        fields = st[st.rfind(")") + 2:].split()
        if int(fields[1]) == os.getpid():
            left.append({"pid": int(d.name), "state": fields[0], "comm": st[st.find("(") + 1:st.rfind(")")],
                         "cmdline": (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")})
    except (OSError, ValueError):
        pass
for x in left:  # clean up after a failure: nothing outlives the helper
    try:
        os.kill(x["pid"], signal.SIGKILL)
    except OSError:
        pass
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print(json.dumps({"rc": rc, "left": left, "ids": sorted(seen)}))
'''


def own_cgroup_dir():
    line = next((l for l in pathlib.Path("/proc/self/cgroup").read_text().splitlines() if l.startswith("0::")), None)
    return pathlib.Path("/sys/fs/cgroup") / line[3:].lstrip("/") if line else None


def run_helper(ws, how, delay=0):
    """Runs serve under the subreaper helper with a private runtime base;
    returns (exit status, processes left behind, runtime entries left, ids)."""
    work, host = ws
    with tempfile.TemporaryDirectory(prefix="sandmux-xdg-", dir=host) as xdg:
        os.chmod(xdg, 0o700)
        base = pathlib.Path(xdg) / "sandmux"
        audit = pathlib.Path(tempfile.mkdtemp(prefix="audit-", dir=host)) / f"{how}-{delay}.jsonl"
        env = {**os.environ, "XDG_RUNTIME_DIR": xdg}
        out = subprocess.run([sys.executable, "-c", HELPER, BIN, str(work), str(audit), str(base), how, str(delay)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        r = json.loads(out.stdout)
        r["rundirs"] = sorted(p.name for p in base.iterdir()) if base.exists() else []
        r["stderr"] = pathlib.Path(f"{audit}.stderr").read_text()
        r["audit"] = audit
        return r


def assert_clean(r, ids_cgroup_dir):
    assert r["left"] == [], f"serve left these to its parent: {r['left']}\n{r['stderr']}"
    assert r["rundirs"] == [], f"runtime directories left: {r['rundirs']}"
    if ids_cgroup_dir is not None:
        stale = [i for i in r["ids"] if (ids_cgroup_dir / f"sandmux-{i}").exists()]
        assert not stale, f"cgroups left: {stale}"
    if r["audit"].exists():
        v = subprocess.run([BIN, "audit", "verify", str(r["audit"])], capture_output=True, text=True, timeout=30)
        assert v.returncode == 0, f"the audit log of a clean stop is sealed: {v.stdout}{v.stderr}"


@pytest.mark.parametrize("how", ["eof", "sigterm", "stop"])
def test_serve_reaps_its_children_before_it_exits(ws, how):
    """After a stop by stdin EOF, SIGTERM or `sandmux stop ID`, serve exits 0
    and hands no zombie and no process to its parent."""
    r = run_helper(ws, how)
    assert r["rc"] == 0, r["stderr"]
    assert_clean(r, own_cgroup_dir())


def test_sigterm_at_every_point_of_start_up_gives_0_and_leaves_nothing(ws):
    """SIGTERM 0, 5, ... 300 ms after serve reached its own code (before the
    sandbox exists, while it starts, before the MCP handshake), during the
    handshake, and after it: always status 0, nothing left on the host."""
    cg = own_cgroup_dir()
    statuses = {}
    for d in range(0, 301, 5):
        r = run_helper(ws, "early", d)
        statuses[d] = r["rc"]
        assert r["rc"] == 0, (d, r["rc"], r["stderr"])
        assert_clean(r, cg)
    for d in (0, 20, 100):
        r = run_helper(ws, "during-handshake", d)
        assert r["rc"] == 0, (d, r["rc"], r["stderr"])
        assert_clean(r, cg)
    r = run_helper(ws, "handshake")
    assert r["rc"] == 0, r["stderr"]
    assert_clean(r, cg)
    # No mount of the host's namespace names the workspace or a runtime dir
    # (other mounts come and go with whatever else runs on the machine).
    ours = [l for l in pathlib.Path("/proc/self/mountinfo").read_text().splitlines() if str(ws[0]) in l or str(ws[1]) in l]
    assert not ours, ours


@pytest.mark.parametrize("how", ["sigint", "sighup"])
def test_sigint_and_sighup_during_start_up_are_clean_stops_too(ws, how):
    for d in (0, 50, 150):
        r = run_helper(ws, how, d)
        assert r["rc"] == 0, (d, r["rc"], r["stderr"])
        assert_clean(r, own_cgroup_dir())


def test_sigterm_right_after_the_exec_leaves_nothing(ws):
    """A SIGTERM that arrives before sandmux's first instruction (in the
    dynamic loader) can only have the kernel's default action (status 143,
    seen here as -15): nothing exists yet, so nothing is left. From sandmux's
    first instruction on, it is a clean stop (0)."""
    for _ in range(5):
        r = run_helper(ws, "raw", 0)
        assert r["rc"] in (0, -signal.SIGTERM), (r["rc"], r["stderr"])
        assert_clean(r, own_cgroup_dir())


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [["--profile", "defualt"], ["--toolsets", "inspect,nosuch"]])
async def test_a_configuration_error_is_the_answer_to_initialize(ws, bad):
    """Issue 26: the client used to see "Connection closed"; now the error
    answer to `initialize` carries the text the CLI prints on stderr."""
    from mcp.shared.exceptions import MCPError
    work, host = ws
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    cli = subprocess.run([BIN, "serve", "-w", str(work), *bad], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, env=env)
    assert cli.returncode == 2, cli.stderr
    said = cli.stderr.strip().removeprefix("sandmux: ")
    def errors(e):
        if isinstance(e, BaseExceptionGroup):
            return [x for sub in e.exceptions for x in errors(sub)]
        return [e]

    try:
        async with connect(ws, *bad):
            pass
        raise AssertionError("the client connected")
    except BaseException as e:  # the SDK raises it inside a task group
        found = [x for x in errors(e) if isinstance(x, MCPError)]
        assert found, e
        msg = str(found[0])
    assert "sandmux could not start" in msg and said[:60] in msg, (msg, said)


def test_stdin_closed_before_initialize_is_a_clean_stop(ws):
    """A client that goes away before `initialize` (stdin closed at once):
    status 0, as README's exit table says, and stderr says what happened."""
    work, host = ws
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    env["XDG_STATE_HOME"] = str(host / "state")
    r = subprocess.run([BIN, "serve", "-w", str(work), "--audit-log", str(host / "a.jsonl")],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "connection closed: initialize request" in r.stderr, r.stderr
