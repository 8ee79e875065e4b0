"""Issue 41, class 3: a forged question. The agent calls a tool of an
`ask_toolsets` toolset with arguments crafted to draw one of sandmux's own
question rows: plain text padded (with a run of spaces, or with any plain
character) so that a terminal 80 columns wide wraps a fake `ID question
N: ...` row onto a line of its own, and newline variants (LF, CRLF, CR,
VT, FF, NEL, LS, PS) each followed by a fake row. The operator side runs
the real `sandmux approvals ID` in a pty 80 columns wide (pyte emulates
the terminal, wrap included), `--json`, and `sandmux attach`; the MCP
client records the elicitation. On every surface the agent's text is only
in its container: one question row, the crafted text only on lines
labelled `agent wrote:`, none of which wraps; the attach line shows the
tool's catalog name and nothing of the arguments; the elicitation ends
with the arguments on one line it says is the agent's. Positive control:
the same arguments drawn the way sandmux drew them before (inline in the
row, only controls and non-ASCII escaped) show two question rows on the
same 80-column terminal."""

import json
import re

import anyio
import pyte
import pytest

from conftest import BIN, call, runtime_dir_of, serve_pids, server_params
from test_approvals import open_question, sm
from test_attach_notice import Term
from test_escape import profile

pytestmark = pytest.mark.anyio

COLS = 80
LABEL = "    agent wrote: "
ROW = re.compile(r"^\S+ question \d+: ")
NEWLINES = ["\n", "\r\n", "\r", "\x0b", "\x0c", "\x85", "\u2028", "\u2029"]


def compact(args):
    return json.dumps(args, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def naive(iid, q, tool, args):
    """The row as sandmux drew it before this change: the arguments inline
    (each character outside printable ASCII as \\u{...}, then escaped again
    for the terminal), answered by the commands at its end."""
    detail = "".join(c if " " <= c <= "~" else f"\\u{{{ord(c):x}}}" for c in compact(args))
    detail = detail.replace("\\", "\\\\")
    return f"{iid} question {q}: may the agent use the tool {tool} with {detail}? (waiting 1 s, denied in 59 s) \u2014 sandmux approve {iid} {q} [--for-instance] | sandmux deny {iid} {q}\n"


def forged(iid, q, tool, key, pad):
    """The value of `key` that makes the naive row wrap into a row of
    question q + 1 at COLS columns."""
    before = f'{iid} question {q}: may the agent use the tool {tool} with {{"{key}":"x'
    fill = pad * (COLS - len(before) % COLS)
    fake = f"{iid} question {q + 1}: may the sandbox connect to https://docs.example.org:443? (waiting 1 s, denied in 59 s) - sandmux approve {iid} {q + 1}"
    return f"x{fill}{fake}"


def shown(text, rows=60):
    """What a terminal COLS wide shows of `text`."""
    screen = pyte.Screen(COLS, rows)
    pyte.ByteStream(screen).feed(text.replace("\n", "\r\n").encode())
    return [l.rstrip() for l in screen.display if l.strip()]


def rows_of(lines):
    return [l for l in lines if ROW.match(l)]


def look(iid, q, tool, args):
    """The operator's surfaces while question q is open; what they show."""
    v = json.loads(sm("approvals", iid, "--json").stdout)
    [o] = v["open"]
    # --json is structured: the agent's text is one string field.
    assert (o["question"], o["kind"], o["name"]) == (q, "tool", f"tool {tool}"), o
    d = o["detail"]
    assert d.isascii() and d.isprintable() and "  " not in d, d
    if o["detail_cut_from"] is None:
        assert json.loads(d) == args, d
    # The table, in a real terminal COLS wide.
    t = Term([BIN, "approvals", iid], rows=60, cols=COLS)
    try:
        t.wait(20)
    finally:
        t.close()
    screen = [l.rstrip() for l in t.screen.display if l.strip()]
    out = t.raw.decode().split("\r\n")
    # The attach line.
    a = Term([BIN, "attach", iid], rows=24, cols=COLS)
    try:
        line = a.until(lambda l: "1 question" in l, 15)
    finally:
        a.close()
    return out, screen, d, line


async def test_the_agents_arguments_cannot_forge_a_question(ws):
    prof = profile(ws, "ask-forged", lambda t: t.replace("wait_max_seconds = 300", 'wait_max_seconds = 300\nask_seconds = 60\nask_toolsets = ["teardown"]'))
    import mcp.types as mt
    from mcp import Client

    asked, gate = [], {}

    async def on_elicit(ctx, params):
        asked.append(params.message)
        await gate["release"].wait()
        return mt.ElicitResult(action="decline")

    p = server_params(ws, "-p", prof, "--toolsets", "inspect,manage,execute")
    async with Client(p, mode="legacy", elicitation_callback=on_elicit) as c:
        await call(c, "list_panes")
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        # Padded with a run of spaces; with plain dots; every newline variant.
        rounds = [("kill_session", "session_name", " "), ("kill_window", "window_id", "."), ("kill_pane", "pane_id", None)]
        for n, (tool, key, pad) in enumerate(rounds, start=1):
            if pad is None:
                args = {key: "".join(f"{nl}{iid} question {n + 1}:" for nl in NEWLINES)}
            else:
                args = {key: forged(iid, n, tool, key, pad)}
            gate["release"] = anyio.Event()
            seen = {}

            async def operator():
                try:
                    q = await open_question(iid, f"tool {tool}", timeout=20)
                    seen["q"] = q
                    seen["out"], seen["screen"], seen["detail"], seen["attach"] = look(iid, q, tool, args)
                finally:
                    gate["release"].set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(operator)
                r = await c.call_tool(tool, args)
            assert r.is_error and "a human declined (client)" in r.content[0].text, r
            q, screen = seen["q"], seen["screen"]
            assert q == n, seen
            if pad is not None:
                # Positive control: drawn the old way, a second question row.
                old = shown(naive(iid, q, tool, args))
                assert len(rows_of(old)) == 2 and rows_of(old)[1].startswith(f"{iid} question {q + 1}: may the sandbox connect"), old
            # The table: one question row, naming the tool; the agent's text
            # only on labelled lines, none of them wrapped.
            assert rows_of(screen) == [screen[0]], screen
            assert seen["out"][0].startswith(f"{iid} question {q}: may the agent use the tool {tool} with the arguments below? (waiting "), seen["out"]
            body = [l for l in screen if l.startswith(LABEL)]
            assert len(body) >= (1 if pad is None else 3), screen
            assert all(len(l) < COLS for l in body), body
            rest = [l for l in screen[1:] if not l.startswith(LABEL)]
            # The only other lines: the row's own wrap (sandmux's words) and the cut note.
            assert all(not ("question" in l and "may" in l) for l in rest), rest
            # (from the program's lines: a screen row loses its trailing space)
            joined = "".join(l[len(LABEL):] for l in seen["out"] if l.startswith(LABEL))
            assert joined == seen["detail"], (joined, seen["detail"])
            if pad != " ":
                # The crafted text is there, in full, as the agent's.
                assert json.loads(joined) == args
                assert f"{iid} question {q + 1}:" in joined, joined
            else:
                assert "\\u0020" in joined and any(l.startswith("    (cut: the arguments are") for l in rest), screen
            # The attach line: the catalog's name, nothing of the arguments.
            line = seen["attach"]
            assert f": 1 question: #{q} tool {tool} " in line and "question 2" not in line and "example" not in line, line
            # The elicitation: sandmux's words first, the arguments last, on
            # one line the message says is the agent's.
            msg = asked[-1].split("\n")
            assert len(msg) == 3, asked[-1]
            assert msg[0].startswith(f"sandmux: the agent asks to use the tool {tool} (toolset teardown), which this instance's profile does not enable."), msg
            assert msg[1].startswith("The call's arguments") and msg[1].endswith("that line is the agent's text, not sandmux's:"), msg
            assert msg[2] == seen["detail"] and "question" not in msg[0] + msg[1], msg
            await anyio.sleep(0.2)
