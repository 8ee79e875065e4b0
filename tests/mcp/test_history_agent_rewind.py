"""Issue 43: the agent asks to rewind its workspace (`workspace_rewind`,
toolset `history`), never silently. Every call asks a human through the
approvals path first (`sandmux approvals`, `approve`, `deny`), enabled or
not and whatever an earlier answer granted: a deny changes nothing, an
approve rewinds the running instance as the operator's `sandmux rewind`
does (recorded as the door's `rewind`, by the agent), and with no one to
ask the call is refused. Through the real binary and the official MCP
client; the operator answers from the host as a human would."""

import json

import anyio
import pytest

from conftest import audit_records, call, connect, runtime_dir_of, serve_pids
from test_approvals import open_question, sm
from test_escape import profile

pytestmark = pytest.mark.anyio

TOOLSETS = ["--toolsets", "inspect,manage,execute,history"]
Q = "tool workspace_rewind"


async def sh(c, command):
    return (await call(c, "run_command", {"command": command, "timeout": 20}))["output"].strip()


async def newest(c):
    return (await call(c, "workspace_history"))["checkpoints"][-1]["n"]


async def rewind_answered(c, iid, n, *answer):
    """Calls workspace_rewind(n); the operator answers its question with
    `answer` (e.g. "approve", or "deny"). The call's result, its question
    and what the operator was told."""
    out = {}

    async def run():
        out["r"] = await c.call_tool("workspace_rewind", {"n": n})

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        q = await open_question(iid, Q, timeout=20)
        said = sm(answer[0], iid, str(q), *answer[1:])
        assert said.returncode == 0, said
    return out["r"], q, said.stdout


async def test_the_agent_asks_to_rewind_and_a_human_decides(ws):
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    async with connect(ws, "--workspace-mode", "copy-on-write", *TOOLSETS, env=env) as c:
        iid = runtime_dir_of(serve_pids(work)[0]).name
        await sh(c, "echo one > a.txt")
        one = await newest(c)
        await sh(c, "echo two > a.txt && echo new > b.txt")
        # Deny: refused, saying a human declined; nothing changed.
        r, _, _ = await rewind_answered(c, iid, one, "deny")
        assert r.is_error and "declined" in r.content[0].text, r
        assert await sh(c, "cat a.txt b.txt") == "two\nnew"
        await anyio.sleep(10.5)  # a declined question is refused unasked for 10 s
        # Approve "for the instance": this call runs, and the grant is taken
        # as once (the next call asks again).
        r, q, said = await rewind_answered(c, iid, one, "approve", "--for-instance")
        assert not r.is_error, r.content[0].text
        assert "allowed once" in said and "every call" in said, said
        w = r.structured_content
        assert w["to"] == one and w["after"] > w["before"] > one, w
        assert await sh(c, "cat a.txt; test -e b.txt || echo gone") == "one\ngone"
        # Never silently: the next call asks again (positive control of the
        # question: it is open, and its approve undoes the rewind).
        r, q2, _ = await rewind_answered(c, iid, w["before"], "approve")
        assert q2 != q and not r.is_error, r.content[0].text
        assert await sh(c, "cat a.txt b.txt") == "two\nnew"
    recs = audit_records(ws)
    rewinds = [x for x in recs if x["tool"] == "(door)" and x.get("error_type") == "rewind"]
    assert len(rewinds) == 2 and all("the agent" in x["args"]["by"] for x in rewinds), rewinds
    answered = [x["args"] for x in recs if x.get("error_type") == "question_answered" and x["args"]["name"] == Q]
    assert [a["answer"] for a in answered] == ["deny", "approve", "approve"], answered
    assert [a.get("granted") for a in answered[1:]] == ["once", "once"], answered


async def test_with_no_one_to_ask_the_agent_cannot_rewind(ws):
    """`[mcp] ask_via = ["client"]` and a client without elicitation: no
    one can be asked, so the call is refused at once and nothing changes.
    Control: the same call is allowed to run (and rewinds) when the
    operator may answer (the test above)."""
    work, host = ws
    env = {"XDG_STATE_HOME": str(host / "state")}
    prof = profile(ws, "client-only", lambda t: t.replace("wait_max_seconds = 300", 'wait_max_seconds = 300\nask_via = ["client"]'))
    async with connect(ws, "-p", prof, "--workspace-mode", "copy-on-write", *TOOLSETS, env=env) as c:
        iid = runtime_dir_of(serve_pids(work)[0]).name
        await sh(c, "echo one > a.txt")
        one = await newest(c)
        await sh(c, "echo two > a.txt")
        with anyio.fail_after(10):
            r = await c.call_tool("workspace_rewind", {"n": one})
        assert r.is_error and "no one can be asked" in r.content[0].text, r
        assert json.loads(sm("approvals", iid, "--json").stdout)["open"] == []
        assert await sh(c, "cat a.txt") == "two"
    assert not [x for x in audit_records(ws) if x.get("error_type") == "rewind"]


async def test_the_client_is_asked_for_this_call_only(ws):
    """With an elicitation callback the client's human may answer: the
    question says the tool asks before every call and offers this call or
    deny, never "for this instance"; "once" runs the call, and the next
    call asks again. Control: the same question form for a tool that is
    only askable offers "for this instance" (test_approvals.py)."""
    import mcp.types as mt
    from mcp import Client
    from conftest import server_params

    work, host = ws
    asked = []

    async def on_elicit(ctx, params):
        asked.append(params)
        return mt.ElicitResult(action="accept", content={"answer": "once"})

    env = {"XDG_STATE_HOME": str(host / "state")}
    p = server_params(ws, "--workspace-mode", "copy-on-write", *TOOLSETS, env=env)
    async with Client(p, mode="legacy", elicitation_callback=on_elicit) as c:
        await sh(c, "echo one > a.txt")
        one = await newest(c)
        await sh(c, "echo two > a.txt")
        w = await call(c, "workspace_rewind", {"n": one})
        assert await sh(c, "cat a.txt") == "one"
        await call(c, "workspace_rewind", {"n": w["before"]})
        assert await sh(c, "cat a.txt") == "two"
    assert len(asked) == 2, asked
    q = asked[0]
    assert "asks a human before every call" in q.message and "for this instance" not in q.message, q.message
    enum = q.requested_schema["properties"]["answer"]["enum"]
    assert enum == ["once", "deny"], enum
