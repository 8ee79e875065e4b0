"""Issue 43: `sandmux rewind ID N` on a RUNNING copy-on-write instance.
The workspace as the agent's panes see it goes back to how it was after
checkpoint N: serve freezes the instance, a rewinder the broker starts in
the sandbox's namespaces (confined: Landlock on the workspace) writes
through the merged view, the checkpoint after is taken while still frozen,
then serve thaws. Everything is checked through the real binary and the
official MCP client: a following `run_command` sees exactly the state
after N. Attacks, each with a positive control: a pane loop writing during
the rewind, a link planted where a rewound directory goes, a name the
terminal would obey."""

import json
import os
import re
import subprocess
import time

import pytest

from conftest import BIN, audit_records, call, connect

pytestmark = pytest.mark.anyio


def sandmux(env, *args, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], capture_output=True, text=True, env={**e, **env}, timeout=timeout)


def layer_of(status):
    line = next(x for x in status["limits"]["impossible"] if "sandmux diff" in x)
    return re.search(r"sandmux diff (\w+)", line).group(1)


def layer_dir(env, lid):
    return os.path.join(env["XDG_STATE_HOME"], "sandmux", "layers", lid)


def history_log(env, lid):
    p = os.path.join(layer_dir(env, lid), "history", "log.jsonl")
    return [json.loads(x) for x in open(p) if x.strip()]


async def sh(c, command, timeout=20):
    r = await call(c, "run_command", {"command": command, "timeout": timeout})
    return r["output"] if "output" in r else json.dumps(r)


def rewind_records(ws):
    return [r for r in audit_records(ws) if r.get("tool") == "(door)" and r.get("error_type") == "rewind"]


async def test_a_running_instance_rewinds_and_the_rewind_is_undone(ws):
    """Calls write, rename and delete files and directories (checkpoints
    1..3), one of them the human's workspace directory; `rewind ID 2` while
    serve runs; the next call sees exactly the state after 2 (contents,
    absence, a link, the human's directory back); `rewind ID <before>`
    undoes it; the instance's own audit log records both."""
    work, host = ws
    (work / "kept.txt").write_text("the human's\n")
    (work / "src").mkdir()
    (work / "src" / "main.c").write_text("int main;\n")
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, "echo one > a.txt && mkdir -p d/e && echo two > d/b.txt && echo mv > d/e/m.txt")
        await sh(c, "echo three >> d/b.txt && mv d/e/m.txt d/moved.txt && rm kept.txt && ln -s /etc/hostname l")
        await sh(c, "rm -rf d a.txt src && echo oops > ruined.txt && chmod 500 . 2>/dev/null; true")
        look = "for f in a.txt d/b.txt d/moved.txt src/main.c ruined.txt kept.txt; do printf '%s=' $f; cat $f 2>/dev/null | tr '\\n' '|'; echo; done; readlink l; ls d/e | wc -l"
        broken = await sh(c, look)
        assert "ruined.txt=oops|" in broken and "src/main.c=\n" in broken, broken

        rw = sandmux(env, "rewind", lid, "2")
        assert rw.returncode == 0, rw.stderr
        assert "running instance" in rw.stdout, rw.stdout
        undo = re.search(r"sandmux rewind \w+ (\d+)` undoes it", rw.stdout).group(1)

        seen = await sh(c, look)
        assert "a.txt=one|" in seen and "d/b.txt=two|three|" in seen, seen
        assert "d/moved.txt=mv|" in seen and "src/main.c=int main;|" in seen, seen
        assert "ruined.txt=\n" in seen and "kept.txt=\n" in seen, seen
        assert "/etc/hostname" in seen, seen
        # Tool calls are served again (thawed), and the layer's checkpoint
        # after the rewind is the state after 2 (serve checked it).
        log = history_log(env, lid)
        tools = [x["tool"] for x in log]
        assert "(before rewind)" in tools and "(rewind)" in tools, tools

        rw2 = sandmux(env, "rewind", lid, undo)
        assert rw2.returncode == 0, rw2.stderr
        again = await sh(c, look)
        assert again == broken, (again, broken)
    recs = rewind_records(ws)
    assert [r["args"]["to"] for r in recs] == [2, int(undo)], recs
    assert all(r["args"]["exit_status"] == 0 and r["args"]["running"] for r in recs), recs
    assert (work / "kept.txt").read_text() == "the human's\n"  # the workspace itself untouched
    assert (work / "src" / "main.c").exists()


def lines_of(path):
    try:
        return open(path).read().split()
    except OSError:
        return []


async def test_a_pane_writing_during_the_rewind_never_interleaves_with_it(ws):
    """Attack: a pane loop appends its count to `log` as fast as it can
    while the operator rewinds to before the loop. The instance is frozen
    from before the checkpoint that undoes the rewind to after the
    checkpoint that ends it: the checkpoint after holds no `log`, and once
    thawed the loop goes on from the count the checkpoint before holds (the
    next one, or the one after it when the freeze caught the loop between
    opening the old file and writing to it); not one write landed during
    the rewind. Positive control: the same loop's writes reach the layer
    while nothing is frozen."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, "echo base > base.txt")
        await sh(c, "(i=0; while :; do i=$((i+1)); echo $i >> log; sleep 0.002; done) >/dev/null 2>&1 &")
        up = os.path.join(layer_dir(env, lid), "upper", "log")
        a = len(lines_of(up))
        time.sleep(0.5)
        b = len(lines_of(up))
        assert b > a + 10, (a, b)  # control: unfrozen, the loop's writes land

        rw = sandmux(env, "rewind", lid, "1")
        assert rw.returncode == 0, rw.stderr
        before = int(re.search(r"sandmux rewind \w+ (\d+)` undoes it", rw.stdout).group(1))
        hist = os.path.join(layer_dir(env, lid), "history")
        node = json.load(open(os.path.join(hist, "deltas", f"{before}.json")))["changed"]["6c6f67"]
        k = int(open(os.path.join(hist, "objects", node["object"])).read().split()[-1])
        after = json.load(open(os.path.join(hist, "deltas", f"{before + 1}.json")))
        assert "6c6f67" in after["removed"] and "6c6f67" not in after["changed"], after
        time.sleep(0.3)
        first = int((await sh(c, "head -1 log")).split()[0])
        assert first in (k + 1, k + 2), (k, first)
        # The loop's writes after the thaw are the next checkpoint's.
        log = history_log(env, lid)
        assert log[-1]["n"] > before + 1 and "6c6f67" in log[-1]["paths"], log[-1]
        await sh(c, "kill %1 2>/dev/null; pkill -f 'echo \\$i' 2>/dev/null; true")


async def test_a_link_planted_where_a_rewound_directory_goes_writes_nothing_outside(ws):
    """Attack: after checkpoint 1 the agent replaces the directory `d` (the
    human's, which call 1 wrote into) with a link to /etc, and plants a
    directory whose entry is a link to a host directory holding the
    human's file. The rewind to 1 writes `d` back as a directory, removes
    the links (never what they point to) and writes nothing outside the
    workspace: /etc and the host directory are as they were. Positive
    control: through the planted link the agent does reach /etc."""
    work, host = ws
    (work / "d").mkdir()
    (work / "d" / "f.txt").write_text("human\n")
    out = host / "out"
    out.mkdir()
    (out / "keep.txt").write_text("the human's other file\n")
    probe = f"sandmux-rewind-probe-{os.getpid()}.txt"
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, f"echo agent > d/{probe} && echo v1 > d/f.txt")
        await sh(c, f"rm -rf d && ln -s /etc d && mkdir e && ln -s {out} e/sub && ln -s /etc e/etc")
        control = await sh(c, "ls d/ | tr '\\n' ' '")
        assert "passwd" in control or "hostname" in control, control
        rw = sandmux(env, "rewind", lid, "1")
        assert rw.returncode == 0, rw.stderr
        seen = await sh(c, f"test -L d && echo LINK; test -d d && echo DIR; cat d/{probe} d/f.txt; test -e e && echo E")
        assert "LINK" not in seen and "DIR" in seen, seen
        assert "agent" in seen and "v1" in seen and "\nE" not in seen, seen
    assert not os.path.exists(f"/etc/{probe}")
    assert sorted(os.listdir(out)) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "the human's other file\n"
    assert (work / "d" / "f.txt").read_text() == "human\n"


async def test_a_name_the_terminal_would_obey_is_escaped_when_a_rewind_refuses_it(ws):
    """Attack: the workspace holds a FIFO whose name carries a newline, a
    colour and a title sequence; the agent removes it; a rewind to before
    would have to bring a FIFO back, which a running rewind does not: it
    refuses before writing anything, naming the path escaped (one line, no
    control byte), records the refusal, and thaws. Positive control: the
    name on the host really holds those bytes."""
    work, host = ws
    name = "fifo\n\x1b[31mRED\x1b]0;owned\x07"
    os.mkfifo(work / name)
    assert any("\x1b" in n and "\n" in n for n in os.listdir(work))  # control
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, "echo x > a.txt && rm -f fifo*")
        rw = sandmux(env, "rewind", lid, "0")
        assert rw.returncode == 2, rw.stdout
        assert "FIFO" in rw.stderr and "nothing was written" in rw.stderr, rw.stderr
        assert "RED" in rw.stderr and rw.stderr.count("\n") == 1, repr(rw.stderr)
        assert not any(ch in rw.stderr for ch in "\x1b\x07"), repr(rw.stderr)
        # Nothing written, and thawed: the next call is served and sees a.txt.
        assert "x" in await sh(c, "cat a.txt")
    recs = rewind_records(ws)
    assert len(recs) == 1 and recs[0]["args"]["exit_status"] == 2, recs


SNAP = ("python3 -c \"import os,hashlib\n"
        "for d,ds,fs in os.walk('.'):\n"
        " for n in sorted(ds+fs):\n"
        "  p=os.path.join(d,n);s=os.lstat(p)\n"
        "  k='l '+os.readlink(p) if os.path.islink(p) else 'd '+oct(s.st_mode&0o7777) if os.path.isdir(p) else 'f '+oct(s.st_mode&0o777)+' '+hashlib.sha1(open(p,'rb').read()).hexdigest()[:12]\n"
        "  print('E',p,k)\"")


def undo_of(rw):
    return int(re.search(r"sandmux rewind \w+ (\d+)` undoes it", rw.stdout).group(1))


async def snapshot(c):
    out = await sh(c, SNAP)
    return sorted(x for x in out.splitlines() if x.startswith("E ./"))


@pytest.mark.parametrize("seed", [43, 7, 2026, 11])
async def test_rewinding_a_running_instance_to_any_checkpoint_gives_what_the_panes_saw_then(ws, seed):
    """Property, through serve: seeded random calls write, append, move,
    remove, link, chmod, and turn files into directories and back, over a
    workspace with the human's own files and directories; after each call
    the panes' view is recorded. Rewinding the running instance to
    checkpoints in random order (and undoing) gives, each time, exactly the
    view recorded after that call (kinds, modes, contents, link targets).
    Control: the recorded views differ from each other (the calls changed
    what the rewind must put back)."""
    import random
    work, host = ws
    (work / "src").mkdir()
    (work / "src" / "x.c").write_text("x\n")
    (work / "src" / "deep").mkdir()
    (work / "src" / "deep" / "y.c").write_text("y\n")
    (work / "top.txt").write_text("top\n")
    env = {"XDG_STATE_HOME": str(host / "state")}
    rng = random.Random(seed)
    names = ["a", "b", "src/x.c", "src/deep", "src/deep/y.c", "d", "d/e", "top.txt", "src"]
    ops = [
        lambda p, q: f"mkdir -p $(dirname {p}) && echo {rng.randrange(1000)} > {p}",
        lambda p, q: f"echo more >> {p}",
        lambda p, q: f"rm -rf {p}",
        lambda p, q: f"mkdir -p {p}/sub && echo in > {p}/sub/f",
        lambda p, q: f"mv -T {p} {q}",
        lambda p, q: f"ln -sfn {q} {p}",
        lambda p, q: f"chmod {rng.choice(['600', '755', '700'])} {p}",
    ]
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        views = {0: await snapshot(c)}
        cps = [0]
        for k in range(1, 9):
            cmd = " ; ".join(rng.choice(ops)(rng.choice(names), rng.choice(names)) for _ in range(3))
            await sh(c, f"{{ {cmd} ; }} 2>/dev/null; true")
            cps.append(history_log(env, lid)[-1]["n"])  # this call's checkpoint
            views[cps[-1]] = await snapshot(c)
        assert len({tuple(v) for v in views.values()}) > 4, views  # control
        order = list(cps)
        rng.shuffle(order)
        now = views[cps[-1]]
        for n in order:
            rw = sandmux(env, "rewind", lid, str(n))
            assert rw.returncode == 0, (n, rw.stderr)
            got = await snapshot(c)
            assert got == views[n], (n, sorted(set(got) - set(views[n])), sorted(set(views[n]) - set(got)))
            undo = undo_of(rw)
            was, now = now, views[n]
        # The last rewind undone: back to the view it started from.
        rw = sandmux(env, "rewind", lid, str(undo))
        assert rw.returncode == 0, rw.stderr
        assert await snapshot(c) == was
    assert (work / "src" / "deep" / "y.c").read_text() == "y\n"


async def test_a_workspace_path_redirected_through_a_renamed_parent_is_refused(ws):
    """Attack (review of issue 43, finding 1): the workspace is
    `.../code/proj`, so its grandparent is a plain directory of the
    sandbox's writable /tmp. From a pane the agent renames that directory
    (the overlay's mount moves with it: only the mount point itself is
    busy) and plants a link in its place to a decoy `code/proj` inside the
    overlay. A rewinder that followed the link would rewind the decoy and
    report success while the real workspace stays as the agent left it.
    The rewind must refuse, naming why, write nothing in the decoy or the
    real workspace, and thaw. Positive control: through the planted link
    the panes do see the decoy, not the workspace."""
    work, host = ws
    proj = work / "code" / "proj"
    proj.mkdir(parents=True)
    (proj / "keep.txt").write_text("the human's\n")
    env = {"XDG_STATE_HOME": str(host / "state")}
    real = (proj, host)
    async with connect(real, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, "echo one > a.txt")
        await sh(c, "echo evil > b.txt && rm keep.txt")
        moved = f"{work}.moved"
        decoy = f"{moved}/code/proj/decoy"
        await sh(c, f"mv {work} {moved} && mkdir -p {decoy}/code/proj && "
                    f"echo decoy > {decoy}/code/proj/a.txt && ln -s {decoy} {work}")
        control = await sh(c, f"cat {proj}/a.txt; ls {proj}; readlink {work}")
        assert "decoy" in control and "keep.txt" not in control, control  # control: the link redirects
        rw = sandmux(env, "rewind", lid, "1")
        assert rw.returncode == 2, (rw.stdout, rw.stderr)
        assert "nothing was written" in rw.stderr, rw.stderr
        # Served again (thawed); neither the workspace nor the decoy written.
        seen = await sh(c, f"cat a.txt b.txt; ls; ls {decoy}/code/proj; cat {decoy}/code/proj/a.txt")
        assert seen.split() == ["one", "evil", "a.txt", "b.txt", "decoy", "a.txt", "decoy"], seen
    recs = rewind_records(real)
    assert len(recs) == 1 and recs[0]["args"]["exit_status"] == 2, recs


# Opens, maps and closes `m.txt` at once (the close is the last event the
# file makes), then writes through the mapping later, in the background.
MMAP_WRITE = ("python3 -c \"import mmap,time\n"
              "f=open('m.txt','r+b')\n"
              "m=mmap.mmap(f.fileno(),0)\n"
              "f.close()\n"
              "time.sleep(1.5)\n"
              "m[:3]=b'NEW'\n"
              "m.flush()\n"
              "time.sleep(600)\" >/dev/null 2>&1 &")


async def test_a_file_written_through_a_shared_mapping_is_rewound_by_its_content(ws):
    """Attack (review of issue 43, finding 2): a pane process writes a
    file through a shared memory mapping (`mmap` + `msync`), which makes
    no inotify event, so the change feed's checkpoints still hold the old
    content. A rewind to the checkpoint that wrote the old content must
    give it back (the rewinder compares contents, the checkpoints before
    and after list the whole layer), and undoing the rewind gives the
    mapped write back. Positive control: the mapped write really changed
    the file as the panes see it, and no checkpoint names it."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, "printf 'old content\\n' > m.txt")
        k = history_log(env, lid)[-1]["n"]
        await sh(c, MMAP_WRITE)
        time.sleep(2.5)
        out = await sh(c, "cat m.txt")
        assert "NEW content" in out, out  # control: the mapped write landed
        log = history_log(env, lid)
        assert not any("6d2e747874" in x["paths"] for x in log if x["n"] > k), log  # ... and no checkpoint saw it
        rw = sandmux(env, "rewind", lid, str(k))
        assert rw.returncode == 0, rw.stderr
        assert (await sh(c, "cat m.txt")).strip() == "old content"
        rw2 = sandmux(env, "rewind", lid, str(undo_of(rw)))
        assert rw2.returncode == 0, rw2.stderr
        assert (await sh(c, "cat m.txt")).strip() == "NEW content"
        await sh(c, "pkill -f time.sleep 2>/dev/null; true")


async def test_the_operators_thaw_waits_for_a_running_rewind(ws):
    """While a rewind runs, `sandmux thaw` is refused (it would let the
    agent's processes run while the rewinder writes); a second rewind waits
    for the first. Positive control: the thaw attempts did overlap the
    rewind (at least one was refused saying so), and after it the instance
    runs again."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", env=env) as c:
        lid = layer_of(await call(c, "sandbox_status"))
        await sh(c, "mkdir many && cd many && seq 1 4000 | xargs touch && cd .. && echo one > a.txt")
        one = history_log(env, lid)[-1]["n"]
        await sh(c, "rm -rf many && echo two > a.txt")
        e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        first = subprocess.Popen([BIN, "rewind", lid, str(one)], env={**e, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        second = subprocess.Popen([BIN, "rewind", lid, str(one)], env={**e, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        refused = 0
        while first.poll() is None or second.poll() is None:
            t = sandmux(env, "thaw", lid, timeout=30)
            refused += "a rewind of the workspace is running" in t.stderr + t.stdout
            time.sleep(0.02)
        out1, err1 = first.communicate()
        out2, err2 = second.communicate()
        assert first.returncode == 0 and second.returncode == 0, (err1, err2)
        assert refused >= 1, "no thaw overlapped the rewinds"
        seen = await sh(c, "cat a.txt; ls many | wc -l")
        assert seen.split() == ["one", "4000"], seen
