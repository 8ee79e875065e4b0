"""P8 through MCP: the agent attacks what host programs obey from its panes
(run_command in the first pane, a shell command in a split pane), then the
host runs real git in the workspace. A positive control shows the same calls
reach the host when the guard is off."""

import json
import os
import pathlib
import re
import subprocess

import anyio
import pytest

from conftest import BIN, audit_records, call, connect

pytestmark = pytest.mark.anyio


def host_git(d, *args):
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}
    return subprocess.run(["git", "-C", str(d), "-c", "safe.directory=*", "-c", "user.name=h", "-c", "user.email=h@example.invalid", *args],
                          capture_output=True, text=True, env=env)


def make_repo(d):
    d.mkdir(parents=True, exist_ok=True)
    for a in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first commit"]):
        r = host_git(d, *a)
        assert r.returncode == 0, r.stderr


def unguarded_profile(ws):
    base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text = re.sub(r"(?ms)^protected = \[.*?^\]$", "protected = []", base).replace('git = "read-only"', 'git = "unguarded"')
    assert text != base
    p = ws[1] / "unguarded.toml"
    p.write_text(text)
    return str(p)


ATTACK = (
    'P="touch {m}"; git config core.fsmonitor "$P"; printf "[core]\\n\\tfsmonitor = %s\\n" "$P" >> .git/config; '
    'git -C lib/inner config core.fsmonitor "$P"; git init -q newrepo && git -C newrepo config core.fsmonitor "$P"; '
    'echo "$P" > .envrc.local; echo attacked'
)


async def attack(c, marker):
    r = await call(c, "run_command", {"command": ATTACK.format(m=marker), "timeout": 20})
    assert "attacked" in r["output"], r
    # A second spawn path: a split pane running a shell command.
    await call(c, "split_window", {"shell": f"git config core.hooksPath /tmp/h; printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit"})
    status = await call(c, "sandbox_status")
    return r, status


async def test_p8_git_and_tool_configuration_through_mcp(ws):
    work, host = ws
    make_repo(work)
    make_repo(work / "lib" / "inner")
    marker = host / "MARKER"
    config = (work / ".git" / "config").read_bytes()
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, env=env) as c:
        r, status = await attack(c, marker)
        assert "Read-only file system" in r["output"], r
        g = status["workspace_guard"]
        assert g["git"] == "read-only" and g["git_kernel_enforced"], g
        assert "git repository" in g["trees"][0]["kind"], g
        assert ".git" in g["trees"][0]["read_only"] and "lib/inner/.git" in g["trees"][0]["read_only"], g
        assert g["reverted"] >= 1, g  # .envrc.local, taken the moment it appeared
        layer = next(l for l in status["layers"] if l["layer"] == "git")
        assert layer["enforced"], layer
        # The agent learns its limits where it looks (issue 10).
        lim = status["limits"]
        assert lim["writable"] == [str(work)] and "/tmp" in lim["vanishes_at_end"], lim
        assert lim["wait_max_seconds"] == 300 and lim["output_ring_bytes"] > 0, lim
        assert any("network" in x for x in lim["impossible"]) and any("git" in x for x in lim["impossible"]), lim
        assert status["network"] == "none", status["network"]
    # The client is gone: the instance ended and its end sweep ran.
    for d in (work, work / "lib" / "inner", work / "newrepo"):
        host_git(d, "status")
    host_git(work, "commit", "-q", "--allow-empty", "-m", "host")
    assert not marker.exists(), "agent code ran on the host"
    assert (work / ".git" / "config").read_bytes() == config
    assert not (work / "newrepo" / ".git").exists() and not (work / ".envrc.local").exists()
    kept = [str(p) for p in (host / "state" / "sandmux" / "quarantine").rglob("*")]
    assert any(k.endswith("newrepo_.git") for k in kept) and any(k.endswith(".envrc.local") for k in kept), kept
    reverts = [x for x in audit_records(ws) if x.get("tool") == "(workspace-revert)"]
    paths = json.dumps(reverts)
    assert "newrepo/.git" in paths and ".envrc.local" in paths, reverts
    v = subprocess.run([BIN, "audit", "verify", str(host / "audit.jsonl")], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


async def test_p8_positive_control_unguarded(ws):
    work, host = ws
    make_repo(work)
    make_repo(work / "lib" / "inner")
    marker = host / "MARKER"
    async with connect(ws, "-p", unguarded_profile(ws), env={"XDG_STATE_HOME": str(host / "state")}) as c:
        r, status = await attack(c, marker)
        assert status["workspace_guard"]["git"] == "unguarded", status
        assert status["workspace_mode"] == "live", status
        layer = next(l for l in status["layers"] if l["layer"] == "git")
        assert not layer["enforced"] and "UNGUARDED" in layer["detail"], layer
    host_git(work, "status")
    assert marker.exists(), f"positive control: host git should obey the agent here\n{r}"
    assert (work / "newrepo" / ".git").is_dir()


def tree(root):
    return sorted((str(p.relative_to(root)), p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
                  for p in root.rglob("*"))


@pytest.mark.parametrize("mode", ["copy-on-write", "copy"])
async def test_p8_copy_on_write_through_mcp(ws, mode):
    """The same attack from panes (run_command and a split pane) in the
    default profile's copy-on-write workspace: it all works inside, the host's tree does not
    change while the instance runs nor after it, host git runs nothing,
    sandbox_status says where the work goes, and the door brings the work in
    with the control held back. Control: test_p8_positive_control_unguarded
    (the same attack, live and unguarded, reaches host git)."""
    work, host = ws
    make_repo(work)
    make_repo(work / "lib" / "inner")
    marker = host / "MARKER"
    before = tree(work)
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", mode, env=env) as c:
        r, status = await attack(c, marker)
        assert "Read-only file system" not in r["output"], r  # the agent's own work is unrestricted
        r2 = await call(c, "run_command", {"command": "echo work > notes.txt && git config core.fsmonitor && echo ok", "timeout": 20})
        assert "touch" in r2["output"] and "ok" in r2["output"], r2
        lim = status["limits"]["impossible"]
        said = "copy-on-write" if mode == "copy-on-write" else "a private copy"
        line = next(x for x in lim if said in x)
        layer_id = re.search(r"sandmux diff (\w+)", line).group(1)
        assert status["workspace_mode"] == mode, status
        assert f"refs/sandmux/{layer_id}" in line, line
        assert tree(work) == before, "the host tree changed while the instance ran"
    assert tree(work) == before, "the host tree changed"
    for d in (work, work / "lib" / "inner"):
        host_git(d, "status")
    assert not marker.exists(), "agent code ran on the host"
    kept = [x for x in audit_records(ws) if "sandmux apply" in json.dumps(x)]
    assert kept, "the layer is named in the audit log"
    # Issue 46: its own record, not a revert.
    assert [(x["tool"], x.get("error_type")) for x in kept] == [("(workspace-layer)", "workspace_layer")], kept
    a = subprocess.run([BIN, "apply", layer_id], capture_output=True, text=True, env={**os.environ, **env})
    assert a.returncode == 0, a.stdout + a.stderr
    assert "applied notes.txt" in a.stdout and "held back .git/ (version-control data" in a.stdout, a.stdout
    assert "held back .envrc.local (tool configuration)" in a.stdout, a.stdout
    assert (work / "notes.txt").read_text() == "work\n"
    for d in (work, work / "lib" / "inner"):
        host_git(d, "status")
    host_git(work, "commit", "-q", "--allow-empty", "-m", "host")
    assert not marker.exists(), "apply carried control"
    # A copy made as root lives outside the test's state directory.
    d = subprocess.run([BIN, "discard", layer_id], capture_output=True, text=True, env={**os.environ, **env})
    assert d.returncode == 0, d.stdout + d.stderr


async def test_a_layer_over_its_bound_freezes_the_instance(ws):
    """`[workspace] layer_bytes`: the agent writes past the bound from a
    pane; within a few seconds the instance is frozen, the next call is
    refused saying which bound and what the operator can do, the freeze is
    an audit event by "layer bound", and the host's tree is unchanged.
    Control: the same write under the built-in bound answers."""
    work, host = ws
    base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text = base.replace('new_repositories = "quarantine"', 'new_repositories = "quarantine"\nlayer_bytes = "1MiB"')
    assert text != base
    prof = host / "small.toml"
    prof.write_text(text)
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", "-p", str(prof), env=env) as c:
        await call(c, "run_command", {"command": "head -c 4000000 /dev/zero > big && echo wrote"})
        refused = None
        for _ in range(60):
            r = await c.call_tool("run_command", {"command": "echo alive"})
            # A call in flight as the freeze lands is interrupted (it may
            # have reached tmux), not refused: the next one is refused.
            if r.is_error and not r.content[0].text.startswith("interrupted:"):
                refused = r.content[0].text
                break
            await anyio.sleep(0.25)
        assert refused and "layer_bytes" in refused and "sandmux stop" in refused, refused
        status = await call(c, "sandbox_status")
        assert status["frozen"] is True, status
    assert not (work / "big").exists()
    ev = [x for x in audit_records(ws) if x.get("tool") == "(freeze)"]
    assert ev and ev[0]["args"]["by"] == "layer bound", ev
    # Control: the built-in bound.
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        await call(c, "run_command", {"command": "head -c 4000000 /dev/zero > big && echo wrote"})
        await anyio.sleep(2.5)
        assert (await call(c, "run_command", {"command": "echo alive"}))["output"] == "alive"
