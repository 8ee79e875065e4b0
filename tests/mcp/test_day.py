"""An agent's working day, through MCP with the official SDK, on the
built-in profiles and the real binary: a Python project whose pytest comes
from PyPI through the `registries` profile, a Rust crate with a registry
dependency built with the host's own toolchain, `git init` and commits that
reach the human through the door while the human's `git status` runs
nothing, a dev server and its client on the sandbox's own loopback, a
5-minute command collected in at most three calls, `seq 1 300000` with true
counters and a bounded result, and `exit` under `core` with work going on.

The only change to a built-in profile is the one this network needs: where
a registry's name resolves to a refused range (a mirror on a reserved
address), its `allow` entry gets that address as its own range. As uid
65534 the host's Rust toolchain (under a home that uid cannot read) is
refused with a clear error, which the test asserts instead of the build."""

import json
import os
import re
import socket
import subprocess
import ipaddress

import anyio
import pytest

from conftest import BIN, call, connect
from test_workspace import host_git

pytestmark = pytest.mark.anyio

REGISTRY_NAMES = ["pypi.org", "files.pythonhosted.org", "index.crates.io", "static.crates.io"]
LONG = 300  # seconds: the long command of the day


def registries_here(ws):
    """The built-in `registries` profile, plus a range for each registry
    name that resolves, on this host, to an address the proxy refuses by
    default — nothing else."""
    text = subprocess.run([BIN, "profile", "show", "registries"], capture_output=True, text=True, check=True).stdout
    for name in REGISTRY_NAMES:
        try:
            addrs = {a[4][0] for a in socket.getaddrinfo(name, 443, socket.AF_INET)}
        except socket.gaierror:
            continue
        refused = sorted(a for a in addrs if not ipaddress.ip_address(a).is_global)
        if refused:
            ranges = ", ".join(f'"{a}/32"' for a in refused)
            new = text.replace(f'"{name}"', f'{{ name = "{name}", ranges = [{ranges}] }}', 1)
            assert new != text, name
            text = new
    path = ws[1] / "registries-here.toml"
    path.write_text(text)
    v = subprocess.run([BIN, "profile", "validate", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return str(path)


async def sh(c, cmd, timeout=60, **kw):
    return await call(c, "run_command", {"command": cmd, "timeout": timeout, **kw})


async def long_command(c, pane, out):
    """A 5-minute command: one run_command that times out, one
    wait_for_command that collects it."""
    r = await sh(c, f"sleep {LONG}; echo long-done", timeout=120, pane_id=pane)
    calls = 1
    while r["status"] == "timeout" and calls < 3:
        assert r.get("command_id"), r
        r = await call(c, "wait_for_command", {"command_id": r["command_id"], "timeout": 300})
        calls += 1
    out.update(result=r, calls=calls)


async def python_project(c):
    r = await sh(c, "mkdir -p pyproj && cd pyproj && python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check pytest "
                    "&& printf 'def test_add():\\n    assert 1 + 1 == 2\\n' > test_add.py && .venv/bin/pytest -q; cd ..", timeout=300)
    assert r["status"] == "completed" and "1 passed" in r["output"], r


async def rust_crate(c):
    r = await sh(c, "cargo new -q --vcs none daycrate && cd daycrate && cargo add -q itoa@1 && "
                    "printf 'fn main() { println!(\"{}\", itoa::Buffer::new().format(42u8)); }\\n' > src/main.rs && "
                    "cargo run -q; cd ..", timeout=300)
    assert r["status"] == "completed" and r["output"].strip().endswith("42"), r


async def git_repository(c, marker):
    r = await sh(c, "mkdir proj && cd proj && git init -q -b main && git config user.email a@example.invalid && git config user.name agent "
                    f"&& git config core.fsmonitor 'touch {marker} #' && echo one > a.txt && git add a.txt && git commit -qm 'agent one' "
                    "&& echo two >> a.txt && git commit -qam 'agent two' && git log --format=%s; cd ..")
    assert r["exit_status"] == 0 and "agent two" in r["output"] and "agent one" in r["output"], r


async def loopback_server(c):
    # (In a subshell: no job of the pane's shell reports its end later.)
    r = await sh(c, "(python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & s=$!; "
                    "for i in $(seq 50); do curl -s 127.0.0.1:8765/ >/dev/null && break; sleep 0.1; done; "
                    "curl -s -o /dev/null -w 'status %{http_code}\\n' http://127.0.0.1:8765/; kill $s)")
    assert "status 200" in r["output"], r


async def big_output(c):
    r = await sh(c, "seq 1 300000")
    assert (r["bytes"], r["lines"], r["exit_status"]) == (1988895, 300000, 0), {k: r[k] for k in ("bytes", "lines", "truncated")}
    assert r["truncated"] and len(r["output"].encode()) <= 32 * 1024 + 200, len(r["output"])
    assert r["output"].startswith("1\n2\n") and r["output"].endswith("300000"), r["output"][-40:]


def toolchain_refused_here():
    """Whether this uid cannot read the host's rustup home."""
    home = os.environ.get("RUSTUP_HOME") or os.path.expanduser("~/.rustup")
    return not os.access(home, os.R_OK | os.X_OK)


async def test_an_agents_day_on_the_registries_and_default_profiles(ws):
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    marker = host / "MARKER"
    prof = registries_here(ws)
    if toolchain_refused_here():
        r = subprocess.run([BIN, "run", "-q", "-w", str(work), "-p", prof, "--toolchain", "rust", "--", "true"],
                           capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
        assert r.returncode == 2 and "toolchain 'rust'" in r.stderr and "RUSTUP_HOME" in r.stderr, r.stderr
        lend = []
    else:
        lend = ["--toolchain", "rust"]
    long = {}
    async with connect(ws, "-p", prof, "--workspace-mode", "copy-on-write", *lend, env=env) as c:
        pane = (await call(c, "split_window", {}))["pane_id"]
        async with anyio.create_task_group() as tg:
            tg.start_soon(long_command, c, pane, long)
            await python_project(c)
            if lend:
                st = await call(c, "sandbox_status")
                assert any(t["name"] == "rust" for t in st["toolchains"]), st["toolchains"]
                await rust_crate(c)
            await git_repository(c, marker)
            await loopback_server(c)
            await big_output(c)
            st = await call(c, "sandbox_status")
            line = next(x for x in st["limits"]["impossible"] if "copy-on-write" in x)
            layer_id = re.search(r"sandmux diff (\w+)", line).group(1)
    assert long["result"]["status"] == "completed" and "long-done" in long["result"]["output"], long
    assert long["calls"] <= 3, long
    assert list(work.iterdir()) == [], "the host's tree changed while the instance ran"
    a = subprocess.run([BIN, "apply", layer_id], capture_output=True, text=True, env={**os.environ, **env})
    assert a.returncode == 0, a.stdout + a.stderr
    assert (work / "pyproj" / "test_add.py").exists() and (work / "proj" / "a.txt").read_text() == "one\ntwo\n", a.stdout
    log = host_git(work / "proj", "log", "--format=%s")
    assert log.stdout.split() == ["agent", "two", "agent", "one"], log.stdout + log.stderr + a.stdout
    st = host_git(work / "proj", "status", "--porcelain")
    assert st.returncode == 0 and st.stdout == "", st.stdout + st.stderr
    assert not marker.exists(), "the agent's git config ran on the host"


async def test_exit_under_core_and_work_goes_on(ws):
    async with connect(ws, "--toolsets", "core") as c:
        r = await sh(c, "exit")
        assert r["status"] == "pane_exited", r
        r = await sh(c, "echo still-working")
        assert r["exit_status"] == 0 and "still-working" in r["output"], r
        assert "fresh session" in r.get("note", "") or "session" in r.get("note", ""), r
