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
