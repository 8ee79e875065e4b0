"""The operator surface: ps, revoke, grant, journal, stop, attach, the
endpoint's uid check, act = "on-grant", and --record replays."""

import json
import os
import pathlib
import pty
import select
import subprocess
import time

import anyio
import pyte
import pytest
from mcp.shared.exceptions import MCPError

from conftest import BIN, call, connect, runtime_dir_of, serve_pids

pytestmark = pytest.mark.anyio


def sm(*args, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30, env=env, **kw)


def instance_id(ws):
    pid = serve_pids(ws[0])[0]
    return runtime_dir_of(pid).name


async def test_revoke_takes_effect_on_the_next_call_and_grant_cannot_widen(ws):
    seen = []

    async def handler(message):
        seen.append(type(getattr(message, "root", message)).__name__ + " " + str(message)[:120])

    from mcp import Client
    from conftest import server_params

    async with Client(server_params(ws, "--toolsets", "inspect,execute"), mode="legacy", message_handler=handler) as c:
        await call(c, "run_command", {"command": "echo before"})
        iid = instance_id(ws)
        ps = json.loads(sm("ps", "--json").stdout)
        me = next(r for r in ps if r["id"] == iid)
        assert me["kind"] == "serve" and me["client_connected"] is True and me["toolsets"] == ["inspect", "execute"]
        r = sm("revoke", iid, "--toolset", "execute")
        assert r.returncode == 0, r.stderr
        with pytest.raises(MCPError, match="Unknown tool: run_command") as e:
            await c.call_tool("run_command", {"command": "echo after"})
        assert "revoked" in str(e.value) and "grant" in str(e.value), e.value
        names = {t.name for t in (await c.list_tools()).tools}
        assert "run_command" not in names and "list_panes" in names
        for _ in range(50):
            if any("ToolListChanged" in s or "list_changed" in s for s in seen):
                break
            await anyio.sleep(0.05)
        assert any("ToolListChanged" in s or "list_changed" in s for s in seen), seen
        # Grant gives back what the instance started with, never more.
        r = sm("grant", iid, "--all")
        assert r.returncode == 0 and "not granted" in r.stdout and "kill_server" in r.stdout, r.stdout
        out = await call(c, "run_command", {"command": "echo granted"})
        assert out["output"] == "granted"
        with pytest.raises(MCPError, match="Unknown tool: kill_server") as e:
            await c.call_tool("kill_server", {})
        assert "not enabled" in str(e.value) and "teardown" in str(e.value), e.value
        j = sm("journal", iid)
        assert "refused" in j.stdout and "run_command" in j.stdout, j.stdout
        jj = [json.loads(l) for l in sm("journal", iid, "--json").stdout.splitlines()]
        assert any(r["tool"] == "run_command" and r["outcome"] == "refused" for r in jj)
        assert sm("stop", iid).returncode == 0
        t0 = time.monotonic()
        while serve_pids(ws[0]) and time.monotonic() - t0 < 10:
            await anyio.sleep(0.05)
        assert not serve_pids(ws[0])


async def test_act_on_grant(ws, tmp_path):
    prof = tmp_path / "ongrant.toml"
    text = sm("profile", "show", "default").stdout
    prof.write_text(text.replace("[mcp]\n", "[mcp]\nact = \"on-grant\"\n"))
    async with connect(ws, "-p", str(prof), mode="legacy") as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert "run_command" not in names and "list_panes" in names
        assert sm("grant", instance_id(ws), "--toolset", "execute").returncode == 0
        out = await call(c, "run_command", {"command": "echo acting"})
        assert out["output"] == "acting"


async def test_endpoint_is_private(ws):
    async with connect(ws) as c:
        await call(c, "list_sessions")
        d = runtime_dir_of(serve_pids(ws[0])[0])
        sock = d / "control.sock"
        assert oct(d.stat().st_mode & 0o777) == "0o700"
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        if os.getuid() == 0:
            # Another uid cannot even reach it ...
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "python3", "-c",
                                f"import socket; s=socket.socket(socket.AF_UNIX); s.connect({str(sock)!r})"], capture_output=True, text=True)
            assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
        # ... and a peer that does reach it with another uid is refused by the
        # endpoint itself (root reaching an instance that uid 65534 runs).
    if os.getuid() == 0:
        work = pathlib.Path(subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip())
        os.chown(work, 65534, 65534)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDMUX_", "XDG_"))}
        env["HOME"] = "/nonexistent"
        p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", BIN, "serve", "-w", str(work), "--audit-log", f"/tmp/sandmux-op-{os.getpid()}.jsonl"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        try:
            base = pathlib.Path("/tmp/sandmux-65534")
            sock = None
            for _ in range(100):
                socks = [d / "control.sock" for d in base.iterdir() if (d / "owner").exists() and (d / "owner").read_text().split()[0] == str(p.pid)] if base.exists() else []
                if socks and socks[0].exists():
                    sock = socks[0]
                    break
                time.sleep(0.05)
            assert sock is not None
            import socket
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.sendall(b'{"v":1,"op":"stop"}\n')
            reply = json.loads(s.makefile().readline())
            assert reply["ok"] is False and "may not control" in reply["error"]
            assert p.poll() is None, "a foreign uid stopped the instance"
        finally:
            p.stdin.close()
            p.wait(timeout=15)
            subprocess.run(["rm", "-rf", str(work), f"/tmp/sandmux-op-{os.getpid()}.jsonl"])


async def test_endpoint_names_both_versions_and_refuses_unknown_requests(ws):
    """A request from a sandmux of another operator protocol version is
    refused naming both versions, whatever op it carries; an unknown op or
    a malformed line is refused; the instance keeps serving."""
    import socket
    async with connect(ws) as c:
        await call(c, "list_sessions")
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "control.sock"

        def ask(line):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.sendall(line + b"\n")
            reply = json.loads(s.makefile().readline())
            s.close()
            return reply

        r = ask(b'{"v":2,"op":"stop"}')
        assert r["ok"] is False and "protocol 1" in r["error"] and "version 2" in r["error"], r
        r = ask(b'{"v":2,"op":"something-new"}')
        assert r["ok"] is False and "version 2" in r["error"], r
        r = ask(b'{"v":1,"op":"nuke"}')
        assert r["ok"] is False and "unknown variant" in r["error"] and "grant" in r["error"], r
        r = ask(b'not json')
        assert r["ok"] is False and r["error"].startswith("bad request"), r
        assert ask(b'{"v":1,"op":"status"}')["ok"] is True
        out = await call(c, "run_command", {"command": "echo still"})
        assert out["output"] == "still"


def _read_pty(fd, seconds):
    out = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return out


def _attach_in_pty(iid):
    """`sandmux attach ID` (read-only) in a fresh pty: (pid, master fd)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    env["TERM"] = "xterm-256color"
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(BIN, [BIN, "attach", iid], env)
    return pid, fd


async def test_attach_read_only_cannot_type_and_osc52_never_arrives(ws):
    async with connect(ws) as c:
        s = await call(c, "list_panes")
        p = s["panes"][0]["pane_id"]
        iid = instance_id(ws)
        pid, fd = _attach_in_pty(iid)
        try:
            _read_pty(fd, 1.0)
            os.write(fd, b"echo typed-by-the-watcher\r")
            # An OSC 52 clipboard write and a DCS passthrough from inside the pane.
            # The payloads are assembled at run time, so only real output could carry them whole.
            await call(c, "run_command", {"pane_id": p, "command": "a=ZXZpbC; b=cGFz; printf '\\033]52;c;%s1jbGlw\\007' $a; printf '\\033Ptmux;\\033\\033]52;c;%scw==\\007\\033\\\\' $b; echo printed-marker"})
            seen = _read_pty(fd, 1.5)
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert b"printed-marker" in seen, seen[-500:]
        assert b"\x1b]52" not in seen and b"ZXZpbC1jbGlw" not in seen and b"cGFzcw==" not in seen
        cap = await call(c, "capture_pane", {"pane_id": p, "start": -100})
        assert "typed-by-the-watcher" not in cap["text"]


async def test_attach_read_only_leaves_the_agents_window_sizes(ws):
    """Regression (issue 10): a human's read-only attach resized the agent's
    windows to the human's terminal, and they stayed so after the detach."""
    import fcntl
    import struct
    import termios
    async with connect(ws) as c:
        made = await call(c, "create_window", {})
        iid = instance_id(ws)
        pid, fd = _attach_in_pty(iid)
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
            _read_pty(fd, 1.5)
            during = [(p["width"], p["height"]) for p in (await call(c, "list_panes"))["panes"]]
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        await anyio.sleep(0.5)
        after = [(p["width"], p["height"]) for p in (await call(c, "list_panes"))["panes"]]
        assert during == after == [(200, 50), (200, 50)], (during, after)
        # resize_window still resizes (the agent's own choice).
        await call(c, "resize_window", {"window_id": made["window_id"], "width": 120, "height": 40})
        sizes = {(p["width"], p["height"]) for p in (await call(c, "list_panes"))["panes"]}
        assert sizes == {(200, 50), (120, 40)}, sizes


async def test_recording_replays_to_the_same_screen(ws):
    cast = ws[1] / "session.cast"
    async with connect(ws, "--record", str(cast)) as c:
        p = (await call(c, "list_panes"))["panes"][0]
        # Short lines (no wrapping), so the replayed rows equal the captured lines.
        sent = await call(c, "send_keys", {"pane_id": p["pane_id"], "text": "printf 'row %s\\n' 1 2 3; tput setaf 2; echo green; tput sgr0"})
        await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^green$"], "regex": True})
        sent = await call(c, "send_keys", {"pane_id": p["pane_id"], "text": "echo secret-typed-text", "enter": False})
        await call(c, "wait_for_stable", {"pane_id": p["pane_id"], "quiet_ms": 300})
        screen = (await call(c, "capture_pane", {"pane_id": p["pane_id"]}))["text"]
        exported = await call(c, "export_replay", {})
        assert exported["mode"] == "recording"
    lines = cast.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 2
    emu = pyte.Screen(header["width"], header["height"])
    stream = pyte.ByteStream(emu)
    for l in lines[1:]:
        t, kind, data = json.loads(l)
        assert kind == "o"
        stream.feed(data.encode())
    replayed = "\n".join(row.rstrip() for row in emu.display).rstrip()
    # Row for row, but the first: a prompt the shell drew before the pane
    # took its final size can stay in front of the redrawn one in the bytes
    # (tmux's own screen was resized since; the recording is the bytes).
    rs, ss = replayed.splitlines(), screen.rstrip().splitlines()
    assert rs[1:] == ss[1:] and rs[0].endswith(ss[0]), (replayed, screen)
    # Only output is recorded: the typed text appears because the shell echoed it,
    # never as an input event.
    assert all(json.loads(l)[1] == "o" for l in lines[1:])
