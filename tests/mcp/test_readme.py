"""The README's first five minutes, as written: step 3's smoke test is taken
from README.md and run by bash exactly as it stands there, in a directory
where its `target/release/sandmux` is the binary under test; then every
other block of the section: step 2's client configuration starts the
instances (as a client does, with the binary and a project put in), step 4's
tool counts, step 6's door and its "Oops" block run line by line with `ID`
filled in (`sandmux` on PATH is the binary under test), step 7's audit log
where it says and `audit verify`. Step 1's `cargo install` (a release build,
minutes) is the one thing not run. A block added to the section fails the
test until it is walked here."""

import json
import os
import re
import subprocess
import tempfile

import pytest

from conftest import BIN, ROOT


def smoke_block():
    text = (ROOT / "README.md").read_text()
    step = text.index("**A smoke test with a real tool call**")
    m = re.search(r"```sh\n(.*?)```", text[step:], re.S)
    assert m, "README's step 3 has no sh block"
    return m.group(1)


def test_the_readme_smoke_test_runs_as_written():
    block = smoke_block()
    assert "target/release/sandmux" in block, block
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as state:
        os.makedirs(os.path.join(d, "target", "release"))
        os.symlink(BIN, os.path.join(d, "target", "release", "sandmux"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        env["XDG_STATE_HOME"] = state
        r = subprocess.run(["bash", "-c", block], cwd=d, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    result = json.loads(last["result"]["content"][0]["text"])
    # What the README says the last line holds.
    assert result["output"] == "hello from sandmux" and result["exit_status"] == 0, last


# The rest of the first five minutes: every fenced block of the section is
# one of these, in this order, or the test fails (a new block needs a walk).
SECTION = "### From an MCP client: the first five minutes"
BLOCKS = ["json", "sh", "sh", "text", ""]


def section():
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n**An agent's day", start)
    return text[start:end]


def blocks():
    """(language, body) of each fenced block in the section, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^ *```(\w*)\n(.*?)^ *```", section(), re.S | re.M)]


def commands(body):
    """The command lines of a block: comments cut, blank lines dropped."""
    return [l.split("#", 1)[0].strip() for l in body.splitlines() if l.split("#", 1)[0].strip()]


class Walk:
    """A human at a shell: `sandmux` on PATH is the binary under test, the
    state directory private; each README command runs with ID (and an
    optional `[PATHS]`) filled in."""

    def __init__(self, d, state):
        self.bin = os.path.join(d, "bin")
        os.makedirs(self.bin)
        os.symlink(BIN, os.path.join(self.bin, "sandmux"))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDMUX_", "OTEL_"))}
        self.env.update(XDG_STATE_HOME=state, PATH=f"{self.bin}:{self.env.get('PATH', '/usr/bin:/bin')}")

    def run(self, line, iid, ws):
        cmd = re.sub(r"\bID\b", iid, line).replace("[PATHS]", "").strip()
        assert cmd.startswith("sandmux "), cmd
        return subprocess.run(["bash", "-c", cmd], cwd=ws, capture_output=True, text=True, timeout=120, env=self.env)


async def client_session(walk, ws, calls, *extra):
    """Step 2 as written: the client configuration's command and args (the
    binary and the project put in), started as a client starts it; `calls`
    files written by the agent one call each. The instance id, from the
    audit log's name as step 7 gives it."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    cfg = json.loads(blocks()[0][1])["mcpServers"]["sandmux"]
    assert cfg["command"].endswith("/sandmux"), cfg
    args = [ws if a == "/path/to/project" else a for a in cfg["args"]] + list(extra)
    assert ws in args, args
    before = set(audit_logs(walk))
    async with Client(StdioServerParameters(command=BIN, args=args, env=walk.env), mode="auto") as c:
        tools = [t.name for t in (await c.list_tools()).tools]
        for i in range(1, calls + 1):
            r = await c.call_tool("run_command", {"command": f"echo {i} > f{i}.txt"})
            assert not r.is_error, r
    (new,) = set(audit_logs(walk)) - before
    m = re.fullmatch(r"[0-9TZ:.-]+-([0-9a-f]+)\.jsonl", os.path.basename(new))
    assert m, new
    return m.group(1), new, tools


def audit_logs(walk):
    d = os.path.join(walk.env["XDG_STATE_HOME"], "sandmux", "audit")
    return [os.path.join(d, f) for f in os.listdir(d)] if os.path.isdir(d) else []


def files(ws):
    return sorted(f for f in os.listdir(ws) if f.startswith("f"))


@pytest.mark.anyio
async def test_the_readme_first_five_minutes_run_as_written():
    found = blocks()
    assert [lang for lang, _ in found] == BLOCKS, "a block was added to or removed from the first five minutes: walk it here"
    door, oops = commands(found[2][1]), commands(found[4][1])
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as state:
        walk = Walk(d, state)
        # Steps 2, 4 and 7: the configuration starts an instance; the tools
        # the README counts; the audit log where it says, and it verifies.
        ws = os.path.join(d, "project")
        os.makedirs(ws)
        iid, log, tools = await client_session(walk, ws, 7)
        assert len(tools) == int(re.search(r"(\d+) tools by default", section()).group(1)), tools
        verify = walk.run(f"sandmux audit verify {log}", iid, ws)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        core = re.search(r"narrows\s+it to ten tools of daily work \(\d+ KB\): (.*?);\n", section(), re.S).group(1)
        _, _, core_tools = await client_session(walk, ws, 0, "--toolsets", "core")
        assert sorted(core_tools) == sorted(re.findall(r"`(\w+)`", core)), core_tools
        # Step 6's door, line by line: diff, diff, apply, undo, discard.
        assert [l.split()[1] for l in door] == ["diff", "diff", "apply", "apply", "discard"], door
        names = walk.run(door[0], iid, ws)
        assert names.returncode == 1 and all(f"A f{i}.txt" in names.stdout for i in range(1, 8)), names
        full = walk.run(door[1], iid, ws)
        assert full.returncode == 1 and "+7" in full.stdout and "# digest" in full.stdout, full
        assert files(ws) == [], "nothing reached the workspace before apply"
        applied = walk.run(door[2], iid, ws)
        assert applied.returncode == 0 and files(ws) == [f"f{i}.txt" for i in range(1, 8)], applied
        undone = walk.run(door[3], iid, ws)
        assert undone.returncode == 0 and files(ws) == [], undone
        gone = walk.run(door[4], iid, ws)
        assert gone.returncode == 0, gone
        assert iid not in walk.run("sandmux ps --all --json", iid, ws).stdout
        # "Oops": another instance, seven calls; the block as written.
        ws2 = os.path.join(d, "project2")
        os.makedirs(ws2)
        iid2, _, _ = await client_session(walk, ws2, 7)
        assert [" ".join(l.split()[1:2]) for l in oops] == ["log", "diff", "rewind", "diff", "apply"], oops
        out = [walk.run(l, iid2, ws2) for l in oops]
        assert out[0].returncode == 0 and out[0].stdout.count("run_command") == 7, out[0]
        assert out[1].returncode == 1 and "f7.txt" in out[1].stdout and "f6.txt" not in out[1].stdout, out[1]
        assert out[2].returncode == 0, out[2]
        assert out[3].returncode == 1 and "f6.txt" in out[3].stdout and "f7.txt" not in out[3].stdout, out[3]
        assert out[4].returncode == 0 and files(ws2) == [f"f{i}.txt" for i in range(1, 7)], out[4]
