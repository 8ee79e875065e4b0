"""`[network] ask`: a name off the allow list is held while the operator is
asked (`sandmux approvals`, `approve`, `deny`), instead of refused at once.
From a pane, as an agent would: curl to a name the profile does not list;
on the host, the operator answers. Approve once, approve for the instance,
deny, silence (denied when `[mcp] ask_seconds` pass), a flood of questions
(bounded: the ninth is refused at once), an IP literal (never asked), and
the instance's end with a question open. Every question and answer is an
audit record. The stand-ins are local HTTPS servers (test_proxy.py)."""

import json
import subprocess
import time

import anyio
import pytest

from conftest import BIN, audit_records, call, runtime_dir_of, serve_pids
from standins import NAMES, Standins
from test_escape import launch, profile
from test_proxy import sh

pytestmark = pytest.mark.anyio

ALL = ["--toolsets", "inspect,manage,execute,teardown"]


def ask_net(port):
    pins = ", ".join(f'"{n}" = "127.0.0.1"' for n in NAMES + ["ask.test", "other.test", "gone.test"])
    net = f'mode = "proxy"\nallow = ["files.test:{port}"]\nallow_private = ["127.0.0.0/8"]\nhosts = {{ {pins} }}\nask = true\nask_ports = [{port}, 443, 80]'
    return lambda t: t.replace('mode = "none"', net).replace("wait_max_seconds = 300", "wait_max_seconds = 300\nask_seconds = 5")


@pytest.fixture
def standins(tmp_path):
    s = Standins(tmp_path, names=NAMES + ["other.test"]).start()
    yield s
    s.stop()


def sm(*a):
    return subprocess.run([BIN, *a], capture_output=True, text=True, timeout=30)


async def open_question(iid, name, timeout=10):
    """Waits for the open question about `name`; its number."""
    end = time.time() + timeout
    while time.time() < end:
        v = json.loads(sm("approvals", iid, "--json").stdout)
        for q in v["open"]:
            if q["name"] == name:
                return q["question"]
        await anyio.sleep(0.1)
    raise AssertionError(f"no question about {name}: {v}")


def proxy_records(ws):
    """The proxy's and the approvals' records (for a failure's message)."""
    return [r for r in audit_records(ws) if r["tool"] in ("(proxy)", "(approvals)")]


async def test_a_name_off_the_list_asks_the_operator(ws, standins):
    (ws[0] / "ca.pem").write_bytes(standins.ca.read_bytes())
    port = standins.port
    prof = profile(ws, "ask", ask_net(port))
    if "ask_seconds = 5" not in open(prof).read():
        pytest.fail("the profile edit did not set ask_seconds")
    async with launch(ws, "-p", prof, *ALL) as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        curl = f"curl -sS --cacert ca.pem https://pypi.test:{port}/simple/sandmuxdemo/"
        # Once: the held connection goes on; the next within the window too.
        await sh(c, f"({curl} > o1 2>&1; echo END >> o1) &")
        q = await open_question(iid, f"https://pypi.test:{port}")
        r = sm("approvals", iid)
        assert f"may the sandbox connect to https://pypi.test:{port}?" in r.stdout, r.stdout
        me = next(x for x in json.loads(sm("ps", "--json").stdout) if x["id"] == iid)
        assert me["questions_open"] == 1, me
        assert any(l.startswith(iid) and " asking " in l for l in sm("ps").stdout.splitlines()), sm("ps").stdout
        r = sm("approve", iid, str(q))
        assert r.returncode == 0 and "allowed once" in r.stdout, r
        r = await sh(c, "while ! grep -q END o1; do sleep 0.1; done; cat o1; " + curl)
        assert r["output"].count("<a href") == 2, (r, proxy_records(ws), standins.accepted, standins.errors)
        # A second answer to the same question: refused, nothing changes.
        assert sm("deny", iid, str(q)).returncode != 0
        # Deny: the reason reaches the agent.
        await sh(c, f"(curl -sS -i -x http://127.0.0.1:3128 http://npm.test:{port}/ > o2 2>&1; echo END >> o2) &")
        q = await open_question(iid, f"http://npm.test:{port}")
        assert sm("deny", iid, str(q)).returncode == 0
        r = await sh(c, "while ! grep -q END o2; do sleep 0.1; done; cat o2")
        assert "403" in r["output"] and "a human declined (operator uid" in r["output"], r
        # Declined a moment ago: refused without asking again.
        r = await sh(c, f"curl -sS -i -x http://127.0.0.1:3128 http://npm.test:{port}/")
        assert "a human declined it a moment ago" in r["output"], r
        # Two connections to one name wait on one question; one answer
        # releases both.
        await sh(c, f"for i in 1 2; do (curl -sS --cacert ca.pem https://files.test:{port}/hello.txt > /dev/null; curl -sS --cacert ca.pem https://other.test:{port}/hello.txt > o6_$i 2>&1; echo END >> o6_$i) & done")
        q = await open_question(iid, f"https://other.test:{port}")
        v = json.loads(sm("approvals", iid, "--json").stdout)
        assert [x["connections"] for x in v["open"]] == [2], v
        assert sm("approve", iid, str(q)).returncode == 0
        r = await sh(c, "while ! grep -q END o6_1 || ! grep -q END o6_2; do sleep 0.1; done; cat o6_1 o6_2")
        assert r["output"].count("hello through the proxy") == 2, r
        # For the instance: listed, and not asked again.
        await sh(c, f"(curl -sS --cacert ca.pem https://files.test:{port}/hello.txt -o /dev/null; curl -sS --cacert ca.pem https://git.test:{port}/repo.git/info/refs > o3 2>&1; echo END >> o3) &")
        q = await open_question(iid, f"https://git.test:{port}")
        assert sm("approve", iid, str(q), "--for-instance").returncode == 0
        r = await sh(c, "while ! grep -q END o3; do sleep 0.1; done; cat o3")
        assert "refs/heads/main" in r["output"], r
        st = await call(c, "sandbox_status")
        assert st["approvals"]["granted_for_instance"] == [f"https://git.test:{port}"] and st["approvals"]["open"] == [], st["approvals"]
        # The operator takes the grant back: the name asks again.
        r = sm("revoke", iid, "--approval", f"https://git.test:{port}")
        assert r.returncode == 0 and "no longer allowed" in r.stdout, r
        assert sm("revoke", iid, "--approval", f"https://git.test:{port}").returncode != 0
        assert json.loads(sm("approvals", iid, "--json").stdout)["granted_for_instance"] == []
        # Silence: denied after ask_seconds, saying so.
        t0 = time.time()
        r = await sh(c, f"curl -sS -i -x http://127.0.0.1:3128 http://ask.test:{port}/", timeout=30)
        assert "no human answered within 5 s" in r["output"] and 4.5 < time.time() - t0 < 15, r
        # An IP literal is never asked.
        r = await sh(c, f"curl -sS -i --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{port}/")
        assert "403" in r["output"], r
        assert json.loads(sm("approvals", iid, "--json").stdout)["open"] == []
        # A flood: 8 questions open at once, the rest refused at once.
        probe = "import socket,sys,time\nss=[]\nfor i in range(12):\n    s=socket.create_connection(('127.0.0.1',3128)); s.sendall(f'CONNECT n{i}.flood.test:443 HTTP/1.1\\r\\n\\r\\n'.encode()); ss.append(s)\ntime.sleep(1)\nfast=0\nfor s in ss:\n    s.setblocking(False)\n    try:\n        fast+=b'already waiting' in s.recv(4096)\n    except BlockingIOError:\n        pass\nprint('FAST', fast)\ntime.sleep(6)\n"
        (ws[0] / "flood.py").write_text(probe)
        await sh(c, "(python3 flood.py > o4 2>&1; echo END >> o4) &")
        await anyio.sleep(0.8)
        n_open = len(json.loads(sm("approvals", iid, "--json").stdout)["open"])
        r = await sh(c, "while ! grep -q END o4; do sleep 0.1; done; cat o4", timeout=30)
        assert n_open == 8 and "FAST 4" in r["output"], (n_open, r)
        # A client that gives up: its question is withdrawn.
        await sh(c, f"curl -sS --max-time 1 --cacert ca.pem https://gone.test:{port}/ ; true")
        await anyio.sleep(0.3)
        assert json.loads(sm("approvals", iid, "--json").stdout)["open"] == []
        # Left open at the end: denied, on the record.
        await sh(c, f"(curl -sS --cacert ca.pem https://npm.test:{port}/x > o5 2>&1) &")
        await open_question(iid, f"https://npm.test:{port}")
    recs = [x for x in audit_records(ws) if x["tool"] == "(approvals)"]
    kinds = [x["error_type"] for x in recs]
    assert kinds.count("question_asked") >= 13 and "question_refused" not in kinds, kinds
    answered = [x["args"] for x in recs if x["error_type"] == "question_answered"]
    assert any(a["answer"] == "approve" and a["granted"] == "once" and a["by"].startswith("operator uid") for a in answered), answered
    assert any(a["by"] == "timeout" for a in answered) and any(a["by"] == "the instance ended" for a in answered), answered
    assert any(a["by"].startswith("withdrawn") and "gone.test" in a["name"] for a in answered), answered
    assert kinds.count("grant_revoked") == 1, kinds


def tool_ask(ws, name, via=None):
    extra = "" if via is None else f"\nask_via = {json.dumps(via)}"
    return profile(ws, name, lambda t: t.replace("wait_max_seconds = 300", f'wait_max_seconds = 300\nask_seconds = 5\nask_toolsets = ["teardown"]{extra}'))


def elicitor(answers, asked):
    """An elicitation callback that records each question and gives the
    next of `answers` ("once", "for this instance", or "decline")."""
    import mcp.types as mt

    async def on_elicit(ctx, params):
        asked.append(params.message)
        a = answers.pop(0)
        if a == "decline":
            return mt.ElicitResult(action="decline")
        return mt.ElicitResult(action="accept", content={"answer": a})

    return on_elicit


async def test_a_tool_not_enabled_asks_the_client_or_the_operator(ws):
    """kill_session (teardown, not enabled) is listed as asking first. With
    an elicitation callback: once runs the call and the next asks again;
    for this instance enables it; decline refuses, saying a human declined.
    Without one, the operator answers. With ask_via = ["client"] and no
    callback, the call is refused at once. Controls: an enabled tool never
    asks; a tool revoked at runtime is not askable."""
    from mcp import Client
    from conftest import server_params

    answers, asked = [], []
    on_elicit = elicitor(answers, asked)

    prof = tool_ask(ws, "ask-tools")
    p = server_params(ws, "-p", prof, "--toolsets", "inspect,manage,execute")
    async with Client(p, mode="legacy", elicitation_callback=on_elicit) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["kill_session"].description.startswith("[asks a human first"), tools["kill_session"].description
        assert not tools["list_panes"].description.startswith("[asks"), tools["list_panes"]
        for n in ("a1", "a2", "a3", "a4"):
            await call(c, "create_session", {"session_name": n})
        answers[:] = ["once", "once"]
        await call(c, "kill_session", {"session_name": "a1"})
        await call(c, "kill_session", {"session_name": "a2"})
        assert len(asked) == 2 and "kill_session" in asked[0] and "teardown" in asked[0], asked
        answers[:] = ["decline"]
        r = await c.call_tool("kill_session", {"session_name": "a3"})
        assert r.is_error and "a human declined (client)" in r.content[0].text, r
        await anyio.sleep(10.5)  # a declined question is not asked again for 10 s
        answers[:] = ["for this instance"]
        await call(c, "kill_session", {"session_name": "a3"})
        await call(c, "kill_session", {"session_name": "a4"})
        assert len(asked) == 4, asked
        await call(c, "list_panes")
        assert len(asked) == 4
    # No elicitation: the operator answers.
    async with launch(ws, "-p", prof, "--toolsets", "inspect,manage,execute") as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        await call(c, "create_session", {"session_name": "b1"})

        async def approve():
            q = await open_question(iid, "tool kill_session")
            assert sm("approve", iid, str(q)).returncode == 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(approve)
            await call(c, "kill_session", {"session_name": "b1"})
        # Revoked at runtime is a human's no: not askable, whether it was
        # enabled (list_panes) or asked for (kill_session).
        from mcp.shared.exceptions import MCPError

        assert sm("revoke", iid, "--tool", "list_panes").returncode == 0
        with pytest.raises(MCPError, match="revoked at runtime"):
            await c.call_tool("list_panes", {})
        await call(c, "create_session", {"session_name": "b2"})
        assert sm("revoke", iid, "--tool", "kill_session").returncode == 0
        with pytest.raises(MCPError, match="Unknown tool: kill_session"):
            await c.call_tool("kill_session", {"session_name": "b2"})
        assert json.loads(sm("approvals", iid, "--json").stdout)["open"] == []
    # The client only, and it cannot be asked: refused at once.
    prof2 = tool_ask(ws, "ask-tools-client", via=["client"])
    async with launch(ws, "-p", prof2, "--toolsets", "inspect,manage,execute") as c:
        await call(c, "create_session", {"session_name": "c1"})
        t0 = time.time()
        r = await c.call_tool("kill_session", {"session_name": "c1"})
        assert r.is_error and "no one can be asked" in r.content[0].text and time.time() - t0 < 3, r
    recs = [x for x in audit_records(ws) if x["tool"] == "(approvals)"]
    bys = [x["args"].get("by", "") for x in recs if x["error_type"] == "question_answered"]
    assert bys.count("client") == 4 and any(b.startswith("operator uid") for b in bys), bys


async def test_on_2026_07_28_a_tool_asks_by_input_required_and_the_state_is_the_servers(ws):
    """Protocol 2026-07-28 has no requests from server to client: the call
    answers input_required with the elicitation, and the client calls again
    with the answer and the requestState (the official SDK drives the
    rounds through its elicitation callback). Once runs that call; decline
    refuses. Attacks on the state the client echoes: a forged one, and a
    real one replayed for another call (other arguments), are no grant
    (the session they name still exists); a real one answered twice runs
    once. Control: the same forged answer on a question the server holds
    for that call runs it."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    import mcp.types as mt
    from conftest import http_client, http_server

    answers, asked = [], []
    on_elicit = elicitor(answers, asked)

    once = {"sandmux_approval": {"action": "accept", "content": {"answer": "once"}}}
    prof = tool_ask(ws, "ask-rounds")
    with http_server(ws, "-p", prof, "--toolsets", "inspect,manage,execute") as (url, token, proc):
        async with http_client(token) as h, Client(streamable_http_client(url, http_client=h), mode="2026-07-28", elicitation_callback=on_elicit) as c:
            for n in ("r1", "r2", "r3", "r4"):
                await call(c, "create_session", {"session_name": n})
            answers[:] = ["once"]
            await call(c, "kill_session", {"session_name": "r1"})
            assert len(asked) == 1 and "kill_session" in asked[0] and '{"session_name":"r1"}' in asked[0], asked
            answers[:] = ["decline"]
            r = await c.call_tool("kill_session", {"session_name": "r2"})
            assert r.is_error and "a human declined (client)" in r.content[0].text, r
            await anyio.sleep(10.5)  # a declined question is not asked again for 10 s
            # A state the server never gave.
            r = await c.session.call_tool("kill_session", {"session_name": "r2"}, input_responses=once, request_state="0" * 32, allow_input_required=True)
            assert getattr(r, "is_error", False) and "not open here" in r.content[0].text, r
            # A real state, replayed for another call.
            first = await c.session.call_tool("kill_session", {"session_name": "r3"}, allow_input_required=True)
            assert isinstance(first, mt.InputRequiredResult) and first.request_state, first
            r = await c.session.call_tool("kill_session", {"session_name": "r2"}, input_responses=once, request_state=first.request_state, allow_input_required=True)
            assert getattr(r, "is_error", False) and "not open here" in r.content[0].text, r
            names = {s["session_name"] for s in (await call(c, "list_sessions"))["sessions"]}
            assert {"r2", "r3", "r4"} <= names, names
            # Control: answered for the call it was asked for, it runs, once.
            r = await c.session.call_tool("kill_session", {"session_name": "r3"}, input_responses=once, request_state=first.request_state, allow_input_required=True)
            assert not r.is_error, r
            again = await c.session.call_tool("kill_session", {"session_name": "r3"}, input_responses=once, request_state=first.request_state, allow_input_required=True)
            assert again.is_error and "not open here" in again.content[0].text, again
            names = {s["session_name"] for s in (await call(c, "list_sessions"))["sessions"]}
            assert "r3" not in names and {"r2", "r4"} <= names, names
            # The operator answers a question a 2026-07-28 call left open;
            # the retry collects it and runs (control) ...
            iid = runtime_dir_of(serve_pids(ws[0])[0]).name
            first = await c.session.call_tool("kill_session", {"session_name": "r4"}, allow_input_required=True)
            q = await open_question(iid, "tool kill_session")
            assert sm("approve", iid, str(q)).returncode == 0
            r = await c.session.call_tool("kill_session", {"session_name": "r4"}, input_responses={}, request_state=first.request_state, allow_input_required=True)
            assert not r.is_error, r
            # ... but not past a freeze: an answer given before it is gone.
            first = await c.session.call_tool("kill_session", {"session_name": "r2"}, allow_input_required=True)
            q = await open_question(iid, "tool kill_session")
            assert sm("approve", iid, str(q)).returncode == 0
            assert sm("freeze", iid).returncode == 0 and sm("thaw", iid).returncode == 0
            r = await c.session.call_tool("kill_session", {"session_name": "r2"}, input_responses=once, request_state=first.request_state, allow_input_required=True)
            assert r.is_error and "not open here" in r.content[0].text, r
            names = {s["session_name"] for s in (await call(c, "list_sessions"))["sessions"]}
            assert "r4" not in names and "r2" in names, names
    recs = [x for x in audit_records(ws) if x["tool"] == "(approvals)"]
    bys = [x["args"].get("by", "") for x in recs if x["error_type"] == "question_answered"]
    assert bys.count("client") == 3, bys
    # Each call that ran after a round trip names the round that asked.
    redeemed = [x["args"] for x in recs if x["error_type"] == "question_redeemed"]
    assert len(redeemed) == 3 and all(r["request_id"] != r["retry_request_id"] for r in redeemed), redeemed


async def test_a_waiting_tool_call_hears_progress_and_the_operator_answers(ws):
    """A call waiting for the operator (the client has no elicitation) is
    told so by progress notifications, on stdio and on 2026-07-28 (where
    only the operator can be asked without elicitation)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from conftest import http_client, http_server

    prof = profile(ws, "ask-progress", lambda t: t.replace("wait_max_seconds = 300", 'wait_max_seconds = 300\nask_seconds = 30\nask_toolsets = ["teardown"]'))
    for http in (False, True):
        heard = []

        async def on_progress(done, total, message):
            heard.append((done, total, message))

        async def approve(iid):
            q = await open_question(iid, "tool kill_session")
            await anyio.sleep(6)  # long enough for two notifications
            assert sm("approve", iid, str(q)).returncode == 0

        async def run(c):
            iid = runtime_dir_of(serve_pids(ws[0])[0]).name
            await call(c, "create_session", {"session_name": "p1"})
            async with anyio.create_task_group() as tg:
                tg.start_soon(approve, iid)
                r = await c.call_tool("kill_session", {"session_name": "p1"}, progress_callback=on_progress)
                assert not r.is_error, r

        if http:
            with http_server(ws, "-p", prof, "--toolsets", "inspect,manage,execute") as (url, token, proc):
                async with http_client(token) as h, Client(streamable_http_client(url, http_client=h), mode="2026-07-28") as c:
                    await run(c)
        else:
            async with launch(ws, "-p", prof, "--toolsets", "inspect,manage,execute") as c:
                await run(c)
        assert len(heard) >= 2 and all("waiting for a human" in m for _, _, m in heard), (http, heard)
        done = [d for d, _, _ in heard]
        assert done == sorted(set(done)), done  # progress only ever increases
        assert heard[0][1] == 30 and heard[-1][0] >= 5, heard


async def test_the_dev_profile_asks_for_teardown_and_the_operator_answers(ws):
    """The README's example: on the built-in dev profile, kill_session is
    listed as asking first; a client without elicitation waits while the
    operator lists the question and approves it once; the next call asks
    again, and the operator's deny is the agent's answer."""
    async with launch(ws, "-p", "dev") as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["kill_session"].description.startswith("[asks a human first"), tools["kill_session"]
        for n in ("d1", "d2"):
            await call(c, "create_session", {"session_name": n})

        async def answer(verb):
            q = await open_question(iid, "tool kill_session")
            listed = sm("approvals", iid)
            assert f"question {q}: may the agent use the tool kill_session with the arguments below?" in listed.stdout, listed.stdout
            assert "\n    agent wrote: {" in listed.stdout, listed.stdout
            assert sm(verb, iid, str(q)).returncode == 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer, "approve")
            await call(c, "kill_session", {"session_name": "d1"})
        async with anyio.create_task_group() as tg:
            tg.start_soon(answer, "deny")
            r = await c.call_tool("kill_session", {"session_name": "d2"})
        assert r.is_error and "a human declined (operator uid" in r.content[0].text, r
        # The arguments the human is shown are the agent's, escaped.
        await anyio.sleep(10.5)  # declined a moment ago: not asked again for 10 s

        async def look_and_revoke():
            q = await open_question(iid, "tool kill_session")
            listed = sm("approvals", iid).stdout
            assert '    agent wrote: {"session_name":"d2\\u202e\\u001b[2J"}' in listed and "\u202e" not in listed and "\x1b" not in listed, listed
            # A revoke while the question is open denies it: no later yes
            # can undo the revoke.
            assert sm("revoke", iid, "--tool", "kill_session").returncode == 0
            assert sm("approve", iid, str(q)).returncode != 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(look_and_revoke)
            r = await c.call_tool("kill_session", {"session_name": "d2\u202e\x1b[2J"})
        assert r.is_error and "revoked by operator uid" in r.content[0].text, r
        names = {x["session_name"] for x in (await call(c, "list_sessions"))["sessions"]}
        assert "d1" not in names and "d2" in names, names


def act_on_grant(ws, name):
    """execute held until a grant (act = "on-grant") and askable; teardown
    askable; the operator answers (the launch client has no elicitation)."""
    return profile(ws, name, lambda t: t.replace("wait_max_seconds = 300", 'wait_max_seconds = 300\nask_seconds = 30\nact = "on-grant"\nask_toolsets = ["teardown", "execute"]'))


async def test_approve_racing_freeze_and_stop(ws):
    """The operator's approve and freeze at the same moment, four times: a
    call that ran is one whose question was approved before the freeze,
    a call refused left its session alone, no question stays open, and
    an approve after the freeze closed the question is refused. A question
    asked while frozen is refused at once. Then approve racing stop: the
    instance ends, the question is on the record with an answer, and the
    audit chain verifies. Also [mcp] act = "on-grant" with execute in
    ask_toolsets: run_command is held, listed as asking, and an approve
    runs that one call (the next asks again)."""
    from mcp.shared.exceptions import MCPError

    prof = act_on_grant(ws, "ask-race")
    async with launch(ws, "-p", prof, "--toolsets", "inspect,manage,execute") as c:
        iid = runtime_dir_of(serve_pids(ws[0])[0]).name
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["run_command"].description.startswith("[asks a human first"), tools["run_command"].description

        async def approving(q_name, then=None):
            q = await open_question(iid, q_name)
            procs = [subprocess.Popen([BIN, "approve", iid, str(q)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
            if then:
                procs.append(subprocess.Popen([BIN, then, iid], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for p in procs:
                p.wait(timeout=30)
            return procs[0]

        async with anyio.create_task_group() as tg:
            tg.start_soon(approving, "tool run_command")
            r = await call(c, "run_command", {"command": "echo approved-once"})
        assert "approved-once" in r["output"], r
        assert sm("grant", iid, "--toolset", "execute").returncode == 0
        for i in range(4):
            await call(c, "create_session", {"session_name": f"f{i}"})
        ran = []
        for i in range(4):
            got = {}

            async def race():
                got["approve"] = await approving("tool kill_session", then="freeze")

            async with anyio.create_task_group() as tg:
                tg.start_soon(race)
                r = await c.call_tool("kill_session", {"session_name": f"f{i}"})
            # Frozen now: a new question is refused at once, not asked.
            t0 = time.time()
            r2 = await c.call_tool("kill_session", {"session_name": f"f{i}"})
            assert r2.is_error and time.time() - t0 < 3, r2
            assert json.loads(sm("approvals", iid, "--json").stdout)["open"] == []
            assert sm("thaw", iid).returncode == 0
            names = {x["session_name"] for x in (await call(c, "list_sessions"))["sessions"]}
            text = r.content[0].text if r.is_error else ""
            if "interrupted" in text:
                # The freeze landed while tmux had the command: the result
                # says it may have taken effect, never that it was refused.
                assert "may have taken effect" in text and "refused" not in text, r
            else:
                assert (f"f{i}" in names) == r.is_error, (i, r, names)
            if r.is_error:
                assert "froze" in text or "withdrawn" in text, r
            ran.append(not r.is_error)
        # Approve after the question closed: refused, nothing runs.
        await call(c, "create_session", {"session_name": "late"})

        async def freeze_then_approve():
            q = await open_question(iid, "tool kill_session")
            assert sm("freeze", iid).returncode == 0
            late = sm("approve", iid, str(q))
            assert late.returncode != 0, late

        async with anyio.create_task_group() as tg:
            tg.start_soon(freeze_then_approve)
            r = await c.call_tool("kill_session", {"session_name": "late"})
        assert r.is_error, r
        assert sm("thaw", iid).returncode == 0
        assert "late" in {x["session_name"] for x in (await call(c, "list_sessions"))["sessions"]}
        # Approve racing stop.
        await call(c, "create_session", {"session_name": "s0"})
        got = {}

        async def race_stop():
            got["approve"] = await approving("tool kill_session", then="stop")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(race_stop)
                await c.call_tool("kill_session", {"session_name": "s0"})
        except (MCPError, Exception):
            pass  # the instance may end before it answers
    recs = [x for x in audit_records(ws) if x["tool"] == "(approvals)"]
    asked = [x["args"]["question"] for x in recs if x["error_type"] == "question_asked"]
    answered = [x["args"]["question"] for x in recs if x["error_type"] == "question_answered"]
    assert sorted(asked) == sorted(set(answered)), (asked, answered)
    # The call run under a once and its question share the request id.
    q = next(x["args"] for x in recs if x["error_type"] == "question_asked" and x["args"]["name"] == "tool run_command")
    ran_once = [x for x in audit_records(ws) if x["tool"] == "run_command" and x["outcome"] == "ok"]
    assert [x["request_id"] for x in ran_once] == [q["request_id"]], (q, ran_once)
    log = ws[1] / "audit.jsonl"
    v = sm("audit", "verify", str(log))
    assert v.returncode == 0, v.stdout + v.stderr


async def test_a_pane_asking_in_a_loop_cannot_spend_the_audit_budget(ws, standins):
    """The smallest audit budget (64 KiB); from a pane, connections to new
    names off the list, each dropped at once, for 8 s: every question and
    its withdrawal is a pane's record, written in the proxy's eighth of the
    budget and counted past it. Tool calls are still admitted after. The
    supervisor does not grow with the questions: its resident memory after
    a second run of the flood is within 2 MiB of that after the first."""
    prof = profile(ws, "ask-flood", lambda t: ask_net(standins.port)(t).replace('audit_max_bytes = "256MiB"', 'audit_max_bytes = "64KiB"'))
    probe = "import socket,sys,time\nend=time.time()+float(sys.argv[1])\nn=0\nwhile time.time()<end:\n    s=socket.create_connection(('127.0.0.1',3128)); s.sendall(f'CONNECT n{sys.argv[2]}{n}.flood.test:443 HTTP/1.1\\r\\n\\r\\n'.encode()); time.sleep(0.005); s.close(); n+=1\nprint('SENT', n)\n"
    (ws[0] / "askflood.py").write_text(probe)

    def rss_kib(pid):
        line = next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:"))
        return int(line.split()[1])

    async with launch(ws, "-p", prof, *ALL) as c:
        serve = serve_pids(ws[0])[0]
        r = await sh(c, "python3 askflood.py 8 a", timeout=30)
        sent = int(r["output"].split("SENT")[1].split()[0])
        assert sent > 300, r
        first = rss_kib(serve)
        r = await sh(c, "python3 askflood.py 8 b", timeout=30)
        second = rss_kib(serve)
        assert second - first < 2048, (first, second, r["output"])
        await sh(c, "echo still-admitted")
    lines = (ws[1] / "audit.jsonl").read_text().splitlines(keepends=True)
    recs = [json.loads(l) for l in lines]
    pane = sum(len(l) for l, x in zip(lines, recs) if x["tool"] in ("(proxy)", "(approvals)"))
    assert 0 < pane <= 64 * 1024 // 8 + 4096, pane
    assert recs[-1]["tool"] == "(sealed)" and recs[-1]["args"]["refused_calls"] == 0, recs[-1]
