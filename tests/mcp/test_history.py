"""Issue 43: the workspace's history through the real `serve` and the
official MCP client. Each call that can change the workspace ends with a
checkpoint its audit record names; `sandmux log` lists them, `diff --call`
shows what one call changed, `rewind` puts the layer back (and is undone by
rewinding to the checkpoint it names). Attacks: a link planted where a
checkpoint reads (the store holds the link, never what it points to), and
names the terminal would obey."""

import json
import os
import re
import subprocess
import time

import pytest

from conftest import BIN, audit_records, call, connect

pytestmark = pytest.mark.anyio


def sandmux(env, *args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60)


def layer_of(status):
    line = next(x for x in status["limits"]["impossible"] if "sandmux diff" in x)
    return re.search(r"sandmux diff (\w+)", line).group(1)


def upper(env, lid):
    return os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid, "upper")


def door_records(env, lid):
    """The door's records of instance `lid` (a serve with its own
    --audit-log: the door writes a log of its own in the state directory)."""
    out = []
    for d, _, files in os.walk(env["XDG_STATE_HOME"]):
        for n in files:
            if n.endswith(f"-{lid}.jsonl"):
                out += [json.loads(x) for x in open(os.path.join(d, n)) if x.strip()]
    return [r for r in out if r.get("tool") == "(door)"]


def tree(root):
    """Every entry below root: kind and content (links by target)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir", None)
            elif os.stat(p).st_rdev:
                out[rel] = ("dev", None)
            elif not os.path.isfile(p):
                out[rel] = ("whiteout", None)
            else:
                out[rel] = ("file", open(p, "rb").read())
    return out


async def test_each_changing_call_is_a_checkpoint_and_rewind_puts_the_layer_back(ws):
    work, host = ws
    (work / "kept.txt").write_text("the human's\n")
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        status = await call(c, "sandbox_status")
        lid = layer_of(status)
        await call(c, "run_command", {"command": "echo one > a.txt && mkdir -p d && echo two > d/b.txt", "timeout": 20})
        await call(c, "list_panes")  # reads: no checkpoint
        await call(c, "run_command", {"command": "echo three >> d/b.txt && rm kept.txt && ln -s /etc/hostname l", "timeout": 20})
        await call(c, "run_command", {"command": "rm -rf d a.txt && echo oops > ruined.txt", "timeout": 20})
    recs = [r for r in audit_records(ws) if r.get("tool") in ("run_command", "list_panes")]
    cps = [r.get("checkpoint") for r in recs]
    assert [cp["n"] if cp else None for cp in cps] == [1, None, 2, 3], recs
    assert len({cp["digest"] for cp in cps if cp}) == 3

    log = sandmux(env, "log", lid)
    assert log.returncode == 0, log.stderr
    lines = log.stdout.splitlines()
    assert len(lines) == 4 and lines[0].split()[0] == "0" and "(start)" in lines[0], log.stdout
    assert "run_command" in lines[2] and "kept.txt" in lines[2], log.stdout
    js = [json.loads(x) for x in sandmux(env, "log", lid, "--json").stdout.splitlines()]
    assert [x["digest"] for x in js[1:]] == [cp["digest"] for cp in cps if cp]

    d2 = sandmux(env, "diff", lid, "--call", "2")
    assert d2.returncode == 1, d2.stderr
    assert "M d/b.txt" in d2.stdout and "+three" in d2.stdout, d2.stdout
    assert "D kept.txt" in d2.stdout and "-the human's" in d2.stdout, d2.stdout
    assert "A l" in d2.stdout and "a.txt" not in d2.stdout, d2.stdout

    before = tree(upper(env, lid))
    assert "ruined.txt" in before and "d" not in before
    rw = sandmux(env, "rewind", lid, "2")
    assert rw.returncode == 0, rw.stderr
    after = tree(upper(env, lid))
    assert after["d/b.txt"] == ("file", b"two\nthree\n") and after["a.txt"] == ("file", b"one\n"), after
    assert after["l"] == ("link", "/etc/hostname") and "ruined.txt" not in after, after
    assert "kept.txt" in after and after["kept.txt"][0] in ("dev", "whiteout"), after
    # The door sees the rewound layer: diff shows call 1 and 2's work.
    d = sandmux(env, "diff", lid, "--names-only")
    assert "a.txt" in d.stdout and "ruined.txt" not in d.stdout, d.stdout
    # A rewind of the rewind is the identity.
    undo = re.search(r"sandmux rewind \w+ (\d+)", rw.stdout).group(1)
    assert sandmux(env, "rewind", lid, undo).returncode == 0
    assert tree(upper(env, lid)) == before
    door = [r for r in door_records(env, lid) if r.get("error_type") == "rewind"]
    assert len(door) == 2 and all(r["args"]["exit_status"] == 0 for r in door), door
    assert (work / "kept.txt").read_text() == "the human's\n"  # the workspace itself untouched


async def test_a_link_swapped_in_during_a_checkpoint_stores_the_link_never_its_target(ws):
    """The agent races the checkpoint's read: a file it wrote becomes a link
    to a host file in a tight loop. The store must only ever hold the link
    or the agent's bytes; a rewind writes back nothing of the host's.
    Control: the same target read by following links has the host's
    bytes (what a naive walk would store)."""
    work, host = ws
    secret = host / "secret.txt"
    secret.write_text("HOST-SECRET-VALUE\n")
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": f"(for i in $(seq 4000); do echo agent > f.new && mv -f f.new f; ln -sfn {secret} f; done) >/dev/null 2>&1 &", "timeout": 20})
        for _ in range(15):
            await call(c, "send_keys", {"text": "true", "keys": ["Enter"]})
        await call(c, "run_command", {"command": "wait; echo done", "timeout": 60})
    objects = os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid, "history", "objects")
    stored = [open(os.path.join(objects, n), "rb").read() for n in os.listdir(objects)]
    assert stored, "no object stored"
    assert not any(b"HOST-SECRET" in s for s in stored), "a host file's bytes were stored"
    # Control: the checkpoints ran while the swap did (they saw `f` both as
    # the agent's file and as the link), and following that link reaches
    # the host's bytes: what a walk that follows links would have stored.
    deltas = os.path.join(os.path.dirname(objects), "deltas")
    kinds = set()
    for n in os.listdir(deltas):
        node = json.load(open(os.path.join(deltas, n)))["changed"].get("66")  # "f" in hex
        if node:
            kinds.add(node["kind"])
    assert kinds == {"file", "link"}, kinds
    assert open(secret).read() == "HOST-SECRET-VALUE\n"


async def test_names_the_terminal_would_obey_are_escaped_in_log_and_diff(ws):
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "printf 'x\\n' > \"$(printf 'e\\033]0;PWNED\\007')\"", "timeout": 20})
    out = subprocess.run(["script", "-qec", f"{BIN} log {lid}; {BIN} diff {lid} --call 1", "/dev/null"],
                         capture_output=True, env={**os.environ, **env}, timeout=60).stdout
    assert b"\x1b]0;PWNED" not in out and b"PWNED" in out, out
    # Control: the name in the layer holds the escape the terminal obeys.
    assert any("\x1b]0;PWNED" in n for n in os.listdir(upper(env, lid)))


def profile_with(ws, **workspace):
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    extra = "".join(f'{k} = "{v}"\n' for k, v in workspace.items())
    text = text.replace("[workspace]\n", "[workspace]\n" + extra, 1)
    p = ws[1] / "history.toml"
    p.write_text(text)
    return str(p)


async def test_a_sparse_file_past_the_bound_is_not_kept_and_a_rewind_to_it_refuses(ws):
    """The agent makes a 700 MiB sparse file (4 KiB on disk): the history
    keeps no 700 MiB object (its apparent size is past history_bytes), says
    so in diff, and a rewind to that checkpoint refuses, writing nothing.
    Control: a 100 KiB file under the bound is kept and rewinds."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    prof = profile_with(ws, history_bytes="1MiB")
    async with connect(ws, "--workspace-mode", "copy-on-write", "-p", prof, env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "head -c 102400 /dev/zero | tr '\\0' k > small", "timeout": 20})
        await call(c, "run_command", {"command": "truncate -s 700M big", "timeout": 20})
        await call(c, "run_command", {"command": "rm big small", "timeout": 20})
    hist = os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid, "history")
    sizes = [os.path.getsize(os.path.join(hist, "objects", n)) for n in os.listdir(os.path.join(hist, "objects"))]
    assert max(sizes) <= 1 << 20, sizes
    assert json.load(open(os.path.join(hist, "deltas", "2.json")))["changed"]["626967"]["kind"] == "unkept"
    d = sandmux(env, "diff", lid, "--call", "2")
    assert "A big" in d.stdout and "not kept" in d.stdout, d.stdout
    before = tree(upper(env, lid))
    r = sandmux(env, "rewind", lid, "2")
    assert r.returncode == 2 and "big" in r.stderr and "history_bytes" in r.stderr, r
    after = tree(upper(env, lid))
    assert {k: v for k, v in after.items()} == before, "a refused rewind wrote"
    # Control: checkpoint 1 (the small file) rewinds.
    assert sandmux(env, "rewind", lid, "1").returncode == 0
    assert tree(upper(env, lid))["small"] == ("file", b"k" * 102400)


async def test_a_name_with_a_newline_cannot_forge_diff_lines_and_a_new_file_shows_its_text(ws):
    """A file named `x<LF>A forged-line`: `diff --call`, piped, has no line
    the agent wrote. Control: the name is in the layer with its newline.
    And a new file's text is shown (not `not text`)."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo hook > \"$(printf 'x\\nA forged-line')\" && printf '#!/bin/sh\\necho new\\n' > script.sh", "timeout": 20})
    out = sandmux(env, "diff", lid, "--call", "1").stdout
    assert not any(l.startswith("A forged-line") for l in out.splitlines()), out
    assert "+echo new" in out and "+hook" in out, out
    assert any("\n" in n for n in os.listdir(upper(env, lid)))


async def test_fork_and_resume_go_on_from_a_kept_layer_with_every_door_rule(ws):
    """`serve --fork ID` starts on a copy of a kept layer (the original
    stays as it was), `serve --resume ID` on the layer itself (it moves, its
    history goes on); sandbox_status says the panes did not come; the door
    still holds back control written after the fork. Control: a fresh
    serve of the same workspace does not see the agent's file."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        first = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo day-one > notes.txt", "timeout": 20})
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        fresh = layer_of(await call(c, "sandbox_status"))
        r = await call(c, "run_command", {"command": "cat notes.txt 2>&1 || true", "timeout": 20})
        assert "day-one" not in r["output"], r  # control
    sandmux(env, "discard", fresh)
    async with connect(ws, "--workspace-mode", "copy-on-write", "--fork", first, env=env) as c:
        st = await call(c, "sandbox_status")
        forked = layer_of(st)
        assert any(f"forked the layer of instance {first}" in x for x in st["limits"]["impossible"]), st
        r = await call(c, "run_command", {"command": "cat notes.txt && echo fork > forked.txt && echo 'echo pwned' > .envrc", "timeout": 20})
        assert "day-one" in r["output"], r
    assert "forked.txt" not in tree(upper(env, first)), "the fork wrote the original"
    names = sandmux(env, "diff", forked, "--names-only").stdout
    assert "forked.txt" in names and "notes.txt" in names, names
    assert re.search(r"^H .*\.envrc", names, re.M), names
    async with connect(ws, "--workspace-mode", "copy-on-write", "--resume", first, env=env) as c:
        st = await call(c, "sandbox_status")
        resumed = layer_of(st)
        assert any(f"resumed the layer of instance {first}" in x for x in st["limits"]["impossible"]), st
        r = await call(c, "run_command", {"command": "cat notes.txt && echo more >> notes.txt", "timeout": 20})
        assert "day-one" in r["output"], r
    assert not os.path.exists(os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", first)), "resume left the old layer"
    log = [json.loads(x) for x in sandmux(env, "log", resumed, "--json").stdout.splitlines()]
    assert [x["n"] for x in log] == list(range(len(log))) and len(log) >= 3, log
    # A running or missing source is refused, naming it.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    r = subprocess.run([BIN, "serve", "-w", str(work), "--resume", first], capture_output=True, text=True,
                       env={**clean, **env}, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode != 0 and first in r.stderr, r.stderr


async def test_a_refused_resume_or_fork_exits_with_the_usage_status(ws):
    """`serve --resume ID` / `--fork ID` that the user's input makes
    impossible exits 2 (the usage status of the README's table), naming the
    id, not 125 (sandmux failing): the instance still runs, no layer of that
    id, not an id, a live workspace. Control: the same `--fork ID` once the
    instance has ended starts (a clean stop, 0), so the refusals are the
    input's, not the channel's."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}

    def serve(*args):
        return subprocess.run([BIN, "serve", "-w", str(work), *args], capture_output=True, text=True,
                              env={**clean, **env}, stdin=subprocess.DEVNULL, timeout=60)

    cow = ("--workspace-mode", "copy-on-write")
    async with connect(ws, *cow, env=env) as c:
        first = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo day-one > notes.txt", "timeout": 20})
        running = serve(*cow, "--fork", first)
        assert running.returncode == 2 and first in running.stderr, (running.returncode, running.stderr)
        assert "still running" in running.stderr, running.stderr
    for args, names in [
        ((*cow, "--resume", "zz0000000000"), "zz0000000000"),
        ((*cow, "--fork", "../" + first), first),
        (("--workspace-mode", "live", "--resume", first), "--resume"),
    ]:
        r = serve(*args)
        assert r.returncode == 2 and names in r.stderr, (args, r.returncode, r.stderr)
    control = serve(*cow, "--fork", first)
    assert control.returncode == 0, (control.returncode, control.stderr)


async def test_apply_upto_brings_the_work_up_to_a_call_through_every_door_rule(ws):
    """`apply ID --upto N` is the ordinary door on checkpoint N written out
    whole: control the agent wrote before N is held back, what `diff
    --upto N` showed is what is applied (a review of another state refuses,
    a digest of another state refuses), the human's replaced file comes
    back with `--undo`, the record names it, and `--resume` is refused
    while the view keeps the human's file. Refused on a running instance
    and an unknown N. Controls: the held-back file is in the view (the
    channel carried it), the expected digest applies, work after N exists
    in the layer."""
    work, host = ws
    (work / "kept.txt").write_text("the human's\n")
    time.sleep(0.1)  # a host change within 20 ms of the layer's start is a conflict (coarse ctime)
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo good > a.txt && mkdir -p src ro && echo v1 > src/m.txt && echo agent > kept.txt && echo r > ro/f && chmod 555 ro", "timeout": 20})
        await call(c, "run_command", {"command": "echo 'echo pwned' > .envrc && echo v2 > src/m.txt && echo x > b.txt", "timeout": 20})
        await call(c, "run_command", {"command": "rm a.txt && echo oops > ruined.txt", "timeout": 20})
        for args in (("apply", lid, "--upto", "2"), ("diff", lid, "--upto", "2")):
            r = sandmux(env, *args)
            assert r.returncode == 2 and "running" in r.stderr, (args, r)
    assert (work / "kept.txt").read_text() == "the human's\n" and not (work / "a.txt").exists()
    r = sandmux(env, "apply", lid, "--upto", "9")
    assert r.returncode == 2 and "no checkpoint 9" in r.stderr, r
    d2 = sandmux(env, "diff", lid, "--upto", "2")
    assert d2.returncode == 1, d2.stderr
    assert re.search(r"^A a\.txt", d2.stdout, re.M) and "+v2" in d2.stdout and "ruined" not in d2.stdout, d2.stdout
    assert re.search(r"^H \.envrc", d2.stdout, re.M), d2.stdout
    dig2 = re.search(r"--upto 2 --expect ([0-9a-f]+)", d2.stdout).group(1)
    view = os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid, "upto-2", "upper")
    assert open(os.path.join(view, ".envrc")).read() == "echo pwned\n"  # control: the channel carried it
    assert "ruined.txt" in tree(upper(env, lid))  # control: the work after call 2 is in the layer
    # Reviewed one state, applying another: refused, nothing written.
    dig1 = re.search(r"--expect ([0-9a-f]+)", sandmux(env, "diff", lid, "--upto", "1").stdout).group(1)
    for args in (("--upto", "2", "--expect", dig1), ("--expect", dig2), ("--upto", "3")):
        r = sandmux(env, "apply", lid, *args)
        assert r.returncode == 2 and "nothing applied" in r.stderr, (args, r)
        assert not (work / "a.txt").exists() and (work / "kept.txt").read_text() == "the human's\n"
    # Control: the digest `diff --upto 2` showed applies exactly that.
    r = sandmux(env, "apply", lid, "--upto", "2", "--expect", dig2)
    assert r.returncode == 0, r
    assert (work / "a.txt").read_text() == "good\n" and (work / "src/m.txt").read_text() == "v2\n", r.stdout
    assert (work / "kept.txt").read_text() == "agent\n" and (work / "b.txt").exists()
    assert not (work / ".envrc").exists() and not (work / "ruined.txt").exists(), r.stdout
    recs = [x for x in door_records(env, lid) if str(x.get("error_type", "")).startswith("apply --upto 2")]
    # Refused ones are recorded too: one applied, one refused (digest 1).
    assert sorted(x["args"]["exit_status"] for x in recs) == [0, 2], recs
    # The view keeps the human's replaced file: a resume would remove it.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    r = subprocess.run([BIN, "serve", "-w", str(work), "--resume", lid], capture_output=True, text=True,
                       env={**clean, **env}, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode != 0 and "apply" in r.stderr, r.stderr
    u = sandmux(env, "apply", lid, "--upto", "2", "--undo")
    assert u.returncode == 0, u
    assert (work / "kept.txt").read_text() == "the human's\n" and not (work / "a.txt").exists(), u.stdout
    # The views (a directory the agent made read-only among them) go with the layer.
    assert oct(os.stat(os.path.join(view, "ro")).st_mode & 0o777) == "0o555"
    d = sandmux(env, "discard", lid)
    assert d.returncode == 0 and not os.path.exists(os.path.dirname(os.path.dirname(view))), d


async def test_workspace_history_is_off_by_default_read_only_and_bounded(ws):
    """The agent reads its own history with `workspace_history` (toolset
    `history`, not on by default). Attack: one call makes 400 files and a
    path of ~3,000 bytes; another 55 calls follow: the result stays
    bounded (50 checkpoints, 200 paths, names cut at 256 bytes) and says
    it cut. Controls: the layer's history holds all 400 and the long path;
    without the toolset the tool is absent and refused; reading makes no
    checkpoint."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        assert "workspace_history" not in {t.name for t in (await c.list_tools()).tools}
        with pytest.raises(Exception, match="history toolset"):  # refused, naming the fix
            await c.call_tool("workspace_history", {})
    on = ("--workspace-mode", "copy-on-write", "--toolsets", "inspect,manage,execute,history")
    async with connect(ws, *on, env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        t = next(t for t in (await c.list_tools()).tools if t.name == "workspace_history")
        assert t.annotations.read_only_hint is True, t.annotations
        deep = "/".join(["d" * 250] * 12)
        await call(c, "run_command", {"command": f"mkdir -p many {deep} && for i in $(seq 400); do : > many/f$i; done && echo x > {deep}/leaf", "timeout": 60})
        one = await call(c, "workspace_history", {"n": 1})
        cp = one["checkpoints"][0]
        assert cp["n"] == 1 and cp["tool"] == "run_command" and cp["changed"] >= 400, cp
        assert len(cp["paths"]) == 200 and one["truncated"] is True, len(cp["paths"])
        assert all(len(p.encode()) <= 256 + 3 for p in cp["paths"]), max(len(p) for p in cp["paths"])
        for _ in range(55):
            await call(c, "send_keys", {"text": "", "keys": ["Enter"]})
        listing = await call(c, "workspace_history")
        ns = [x["n"] for x in listing["checkpoints"]]
        assert len(ns) == 50 and ns[-1] == 56 and ns == sorted(ns) and listing["truncated"] is True, ns
        assert len(json.dumps(listing)) < 20_000, len(json.dumps(listing))
        r = await call(c, "workspace_history", {"n": 999}, ok=False)
        assert "checkpoint 999" in r, r
    # Control: the history holds every file and the whole long path.
    hist = os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid, "history")
    d1 = json.load(open(os.path.join(hist, "deltas", "1.json")))["changed"]
    names = {bytes.fromhex(k).decode() for k in d1}
    assert sum(n.startswith("many/f") for n in names) == 400 and f"{deep}/leaf" in names
    # Reading is not a changing call: its records name no checkpoint.
    recs = [r for r in audit_records(ws) if r.get("tool") == "workspace_history"]
    assert recs and not any(r.get("checkpoint") for r in recs), recs


async def test_workspace_history_in_live_mode_says_there_is_none(ws):
    async with connect(ws, "--toolsets", "inspect,history") as c:
        r = await call(c, "workspace_history", ok=False)
        assert "live" in r and "no history" in r, r


async def test_a_start_keeps_a_layer_whose_upto_view_holds_the_humans_file(ws):
    """`apply --upto 1` replaces the human's file (kept in the view's
    `taken/`), then `rewind 0` empties the layer: the next start, which
    clears away ended layers with no change, keeps this one, and `apply
    --upto 1 --undo` gives the human's file back. Control: another ended
    layer rewound to 0, with no apply, is cleared by the same start."""
    work, host = ws
    (work / "kept.txt").write_text("the human's\n")
    time.sleep(0.1)  # a host change within 20 ms of the layer's start is a conflict (coarse ctime)
    env = {"XDG_STATE_HOME": str(host / "state")}
    cow = ("--workspace-mode", "copy-on-write")
    async with connect(ws, *cow, env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo agent > kept.txt", "timeout": 20})
    async with connect(ws, *cow, env=env) as c:
        other = layer_of(await call(c, "sandbox_status"))
        await call(c, "run_command", {"command": "echo x > other.txt", "timeout": 20})
    r = sandmux(env, "apply", lid, "--upto", "1")
    assert r.returncode == 0 and (work / "kept.txt").read_text() == "agent\n", r
    for l in (lid, other):
        assert sandmux(env, "rewind", l, "0").returncode == 0
        assert tree(upper(env, l)) == {}
    async with connect(ws, *cow, env=env) as c:  # a start clears ended layers with no change
        await call(c, "sandbox_status")
    layers = os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers")
    assert not os.path.exists(os.path.join(layers, other))  # control
    assert os.path.exists(os.path.join(layers, lid)), "the human's file went with the layer"
    u = sandmux(env, "apply", lid, "--upto", "1", "--undo")
    assert u.returncode == 0 and (work / "kept.txt").read_text() == "the human's\n", u
