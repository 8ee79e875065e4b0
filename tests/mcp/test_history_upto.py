"""Issue 43, the attack review of `apply/diff ID --upto N` and
`workspace_history` (docs/workspace-guard.md, "Up to a call"): a view of a
checkpoint is bounded before it is written (each content once, linked;
zeros as holes; refused past the layer's free space and `kept_bytes`) and
counts in `ps --all`; the human's files an `apply --upto N` set aside are
protected like a plain apply's (kept by `keep_days`, `applied` in `ps`,
the undo hints name `--upto N`); the last review wins across views; the
agent's `workspace_history` is bounded as serialised and names no host
path."""

import json
import os
import re
import subprocess
import time

import pytest

from conftest import call, connect
from test_history import layer_of, sandmux

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def layer_dir(env, lid):
    return os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid)


def kept_row(env, lid):
    out = sandmux(env, "ps", "--all", "--json")
    assert out.returncode == 0, out.stderr
    return next(r for r in json.loads(out.stdout) if r.get("kind") == "layer" and r["id"] == lid)


def views_of(env, lid):
    return sorted(n for n in os.listdir(layer_dir(env, lid)) if "upto-" in n)


def config(host, text):
    cfg = host / "cfg"
    (cfg / "sandmux").mkdir(parents=True, exist_ok=True)
    (cfg / "sandmux" / "config.toml").write_text(text)
    return str(cfg)


async def test_a_view_writes_repeated_content_once_as_holes_and_counts_in_ps(ws):
    """The agent makes 60 copies (and a hard link) of one 1 MiB sparse file:
    the history keeps one object; `diff --upto 1` writes them as one inode,
    holes kept, and `ps --all` counts the view once. Control: the names'
    apparent sizes are what a view written name by name would hold."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        cmd = "truncate -s 1M z && for i in $(seq 60); do cp --sparse=always z z$i; done && ln z h"
        await call(c, "run_command", {"command": cmd, "timeout": 60})
    before = kept_row(env, lid)["bytes"]
    d = sandmux(env, "diff", lid, "--upto", "1", "--names-only")
    assert d.returncode == 1 and "A z60" in d.stdout, d
    view = os.path.join(layer_dir(env, lid), "upto-1", "upper")
    st = [os.lstat(os.path.join(view, n)) for n in os.listdir(view)]
    assert len(st) == 62
    assert len({s.st_ino for s in st}) == 1, "repeated content not linked"
    assert st[0].st_blocks * 512 < 64 * 1024, "the holes were written"
    apparent = sum(s.st_size for s in st)
    assert apparent == 62 * MiB  # control: what a name-by-name view writes
    after = kept_row(env, lid)["bytes"]
    assert MiB <= after - before < 2 * MiB, (before, after)


async def test_a_view_past_kept_bytes_is_refused_before_anything_is_written(ws):
    """Checkpoint 2 names one 20 MiB sparse content under three modes (three
    inodes: 60 MiB apparent); with `kept_bytes = 60MiB` and the layer's
    20 MiB, `diff`/`apply --upto 2` refuse naming `kept_bytes`, write no
    view (not even half made), and the workspace is unchanged. Control:
    checkpoint 1 (20 MiB) fits and its view is made."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "truncate -s 20M a", "timeout": 20})
        cp = "cp --sparse=always a b && chmod 600 b && cp --sparse=always a c && chmod 640 c"
        await call(c, "run_command", {"command": cp, "timeout": 30})
        await call(c, "run_command", {"command": "rm b c", "timeout": 20})
    env["XDG_CONFIG_HOME"] = config(host, '[workspace]\nkept_bytes = "60MiB"\n')
    for verb in ("diff", "apply"):
        r = sandmux(env, verb, lid, "--upto", "2")
        assert r.returncode == 2 and "kept_bytes" in r.stderr and "nothing written" in r.stderr, r
        assert views_of(env, lid) == [], views_of(env, lid)
    assert sorted(os.listdir(work)) == []
    d = sandmux(env, "diff", lid, "--upto", "1", "--names-only")
    assert d.returncode == 1 and "A a" in d.stdout, d
    assert views_of(env, lid) == ["upto-1"]


async def test_the_last_review_wins_across_views(ws):
    """`diff ID`, then `diff ID --upto 1`, then a plain `apply ID`: the
    whole layer's older review no longer counts; refused, nothing applied
    (and the other way round). Control: `diff --upto 1`, then `diff ID`,
    then `apply ID` applies the whole layer."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo good > a.txt", "timeout": 20})
        await call(c, "run_command", {"command": "echo ruin > a.txt && echo more > b.txt", "timeout": 20})
    assert sandmux(env, "diff", lid).returncode == 1
    assert sandmux(env, "diff", lid, "--upto", "1").returncode == 1
    r = sandmux(env, "apply", lid)
    assert r.returncode == 2 and "nothing applied" in r.stderr and f"diff {lid}`" in r.stderr, r
    assert sorted(os.listdir(work)) == []
    assert sandmux(env, "diff", lid).returncode == 1
    r = sandmux(env, "apply", lid, "--upto", "1")
    assert r.returncode == 2 and "nothing applied" in r.stderr and "--upto 1" in r.stderr, r
    assert sorted(os.listdir(work)) == []
    # Control: the whole layer reviewed last applies.
    r = sandmux(env, "apply", lid)
    assert r.returncode == 0, r
    assert (work / "a.txt").read_text() == "ruin\n" and (work / "b.txt").exists()


async def test_files_an_apply_upto_set_aside_are_kept_and_the_hints_name_upto(ws):
    """`apply --upto 1` replaces the human's file (set aside in the view):
    its hint names `--upto 1 --undo`; a plain `--undo` names it too and
    changes nothing; `--upto 2 --undo` (never applied) writes no view; `ps`
    says applied; the layer rewound to 0 (an empty `upper/`) and 20 days
    old survives an instance's start (`keep_days`); the hinted undo gives
    the file back. Control: the view's journal aged 20 days, the layer is
    removed."""
    work, host = ws
    (work / "kept.txt").write_text("the human's\n")
    time.sleep(0.1)  # a host change within 20 ms of the layer's start is a conflict (coarse ctime)
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo agent > kept.txt", "timeout": 20})
        await call(c, "run_command", {"command": "echo two > two.txt", "timeout": 20})
    r = sandmux(env, "apply", lid, "--upto", "1")
    assert r.returncode == 0 and (work / "kept.txt").read_text() == "agent\n", r
    assert f"sandmux apply {lid} --upto 1 --undo" in r.stdout, r.stdout
    u = sandmux(env, "apply", lid, "--undo")
    assert u.returncode == 2 and f"sandmux apply {lid} --upto 1 --undo" in u.stderr, u
    assert (work / "kept.txt").read_text() == "agent\n"
    u = sandmux(env, "apply", lid, "--upto", "2", "--undo")
    assert u.returncode == 2 and "nothing to undo" in u.stderr, u
    assert views_of(env, lid) == ["upto-1"]
    assert kept_row(env, lid)["applied"] is True
    assert sandmux(env, "rewind", lid, "0").returncode == 0
    top = layer_dir(env, lid)
    assert os.listdir(os.path.join(top, "upper")) == []
    meta = os.path.join(top, "meta.json")
    m = json.load(open(meta))
    m["created_ns"] -= 20 * 86_400 * 10**9
    open(meta, "w").write(json.dumps(m))
    cfg = config(host, "[workspace]\nkeep_days = 14\n")
    other = host / "other"
    other.mkdir()
    start = {**env, "XDG_CONFIG_HOME": cfg}
    async with connect((other, host), "--workspace-mode", "copy-on-write", env=start) as c:
        await call(c, "sandbox_status")
    assert os.path.isdir(top), "keep_days removed the layer holding the human's file"
    u = sandmux(env, "apply", lid, "--upto", "1", "--undo")
    assert u.returncode == 0 and (work / "kept.txt").read_text() == "the human's\n", u
    # Control: the same layer, its view's journal and taken/ 20 days old.
    assert sandmux(env, "apply", lid, "--upto", "1").returncode == 0
    for n in ("apply.jsonl", "taken"):
        p = os.path.join(top, "upto-1", n)
        subprocess.run(["touch", "-h", "-d", "20 days ago", p], check=True)
    async with connect((other, host), "--workspace-mode", "copy-on-write", env=start) as c:
        await call(c, "sandbox_status")
    assert not os.path.exists(top)


async def test_workspace_history_bounds_escaped_names_and_says_no_host_path(ws):
    """The agent names 200 files with 250 control bytes each (six bytes
    each once JSON-escaped): one checkpoint's result stays under 40 KB.
    A delta the history cannot read (a directory in its place): the error
    says so without the layer's host path. Control: the delta holds the
    200 whole names (300 KB escaped)."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    cmd = "for i in $(seq 100 299); do touch \"$(printf '\\001%.0s' $(seq 247))$i\"; done"
    async with connect(ws, "--workspace-mode", "copy-on-write", "--toolsets", "inspect,manage,execute,history", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": cmd, "timeout": 60})
        r = await c.call_tool("workspace_history", {"n": 1})
        assert not r.is_error, r
        text = json.dumps(r.structured_content)
        assert len(text) < 40_000 and r.structured_content["truncated"], len(text)
        hist = os.path.join(layer_dir(env, lid), "history")
        delta = json.load(open(os.path.join(hist, "deltas", "1.json")))
        names = [bytes.fromhex(h).decode() for h in delta["changed"]]
        assert len(names) == 200 and len(json.dumps(names)) > 250_000  # control
        d = os.path.join(hist, "deltas", "1.json")
        os.rename(d, d + ".away")
        os.mkdir(d)
        e = await call(c, "workspace_history", {"n": 1}, ok=False)
        assert "could not be read" in e and str(host) not in e and "layers" not in e, e
        os.rmdir(d)
        os.rename(d + ".away", d)
        assert not (await c.call_tool("workspace_history", {"n": 1})).is_error


async def test_a_view_carries_no_set_id_bit_and_follows_no_link(ws):
    """Before call 1 ends the agent tries a set-ID file and makes links to
    a host file (absolute, and through `..`); `apply --upto 1` brings the
    file without a set-ID bit and neither link's target's bytes (a link
    stays a link, or is held back), and no file of the view holds them.
    Control: the layer holds both links, which the host resolves to its
    file. (The sandbox refuses the set-ID bit itself: the layer has none.)"""
    work, host = ws
    secret = host / "secret.txt"
    secret.write_text("host secret\n")
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        cmd = f"echo x > s; chmod 4755 s; ln -s {secret} abs; ln -s ../{host.name}/secret.txt rel"
        await call(c, "run_command", {"command": cmd, "timeout": 20})
        await call(c, "run_command", {"command": "echo later > later.txt", "timeout": 20})
    up = os.path.join(layer_dir(env, lid), "upper")
    assert not os.lstat(os.path.join(up, "s")).st_mode & 0o7000
    for n in ("abs", "rel"):  # control: the links are there and reach the host's file
        assert open(os.path.join(work, os.readlink(os.path.join(up, n)))).read() == "host secret\n"
    r = sandmux(env, "apply", lid, "--upto", "1")
    assert r.returncode in (0, 3), r
    assert (work / "s").read_text() == "x\n" and not os.lstat(work / "s").st_mode & 0o7000
    for n in ("abs", "rel"):
        p = work / n
        assert not os.path.lexists(p) or os.path.islink(p), n
    view = os.path.join(layer_dir(env, lid), "upto-1", "upper")
    for d, _, files in os.walk(view):
        for f in files:
            p = os.path.join(d, f)
            assert os.path.islink(p) or b"host secret" not in open(p, "rb").read(), p
    assert not (work / "later.txt").exists() and secret.read_text() == "host secret\n"
