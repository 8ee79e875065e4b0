"""`sandmux attach`'s notice: the attach process runs the tmux client in a
pty one row shorter than the terminal and draws the bottom row itself: the
instance, the mode and the open approval questions. The agent's tmux server
never addresses that row, so nothing a pane prints can forge it. The
terminal is emulated by pyte, fed every byte the attach process writes."""

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time

import pyte
import pytest

from conftest import BIN, call, runtime_dir_of, serve_pids
from test_approvals import ask_net, open_question
from test_escape import launch, profile
from test_proxy import sh

pytestmark = pytest.mark.anyio

ALL = ["--toolsets", "inspect,manage,execute,teardown"]
# No stand-in serves it: a question is asked before the name is resolved,
# and every question here is denied.
PORT = 8443


def sm(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30, env=env)


def ask_profile(ws):
    """`[network] ask` with questions that wait a minute (not the 5 s of
    test_approvals.py): here only a human's answer closes one."""
    edit = ask_net(PORT)
    return profile(ws, "ask-attach", lambda t: edit(t).replace("ask_seconds = 5", "ask_seconds = 60"))


class Term:
    """A program in a fresh pty of `rows` x `cols` (set before it starts),
    its output fed to a pyte screen of the same size."""

    def __init__(self, argv, rows=24, cols=80):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_") and k != "TMUX"}
        env["TERM"] = "xterm-256color"
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            os.execve(argv[0], argv, env)
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""

    def pump(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r, _, _ = select.select([self.fd], [], [], 0.05)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                self.raw += data
                self.stream.feed(data)

    def last(self):
        return self.screen.display[-1].rstrip()

    def until(self, pred, seconds):
        """Pumps until `pred(last row)`; the last row."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.pump(0.2)
            if pred(self.last()):
                return self.last()
        raise AssertionError(f"last row {self.last()!r}; screen:\n" + "\n".join(self.screen.display))

    def resize(self, rows, cols):
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.screen.resize(rows, cols)

    def wait(self, seconds):
        """The program's wait status once it exits."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.pump(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                return status
        raise AssertionError("still running")

    def close(self):
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def iid_of(ws):
    return runtime_dir_of(serve_pids(ws[0])[0]).name


async def test_the_notice_is_the_last_row_and_follows_the_questions(ws):
    async with launch(ws, "-p", ask_profile(ws), *ALL) as c:
        iid = iid_of(ws)
        t = Term([BIN, "attach", iid])
        try:
            row = t.until(lambda l: "no questions" in l, 10)
            assert row == f"sandmux {iid} read-only: no questions", row
            # The agent's screen is there, above it.
            assert any(l.strip() for l in t.screen.display[:-1]), t.screen.display
            name = f"http://ask.test:{PORT}"
            await sh(c, f"(curl -sS -i -x http://127.0.0.1:3128 {name}/ > o1 2>&1; echo END >> o1) &")
            q = await open_question(iid, name)
            row = t.until(lambda l: name in l, 5)
            assert row.startswith(f"sandmux {iid} read-only: 1 question: #{q} {name} "), row
            r = sm("deny", iid, str(q))
            assert r.returncode == 0, r
            row = t.until(lambda l: "no questions" in l, 5)
            assert row == f"sandmux {iid} read-only: no questions", row
            r = await sh(c, "while ! grep -q END o1; do sleep 0.1; done; cat o1")
            assert "a human declined" in r["output"], r
        finally:
            t.close()
    # Read-write says so; the terminal is raw while attached and restored
    # when the tmux client exits (a detach), with the client's exit code.
    async with launch(ws, *ALL):
        iid = iid_of(ws)
        t = Term([BIN, "attach", "--read-write", iid])
        try:
            t.until(lambda l: l == f"sandmux {iid} read-write: no questions", 10)
            assert not termios.tcgetattr(t.fd)[3] & termios.ICANON
            os.write(t.fd, b"\x02d")
            status = t.wait(10)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
            lflag = termios.tcgetattr(t.fd)[3]
            assert lflag & termios.ICANON and lflag & termios.ECHO, lflag
        finally:
            t.close()


async def test_a_pane_cannot_forge_the_notice_and_plain_tmux_shows_it_can(ws):
    async with launch(ws, "-p", ask_profile(ws), *ALL) as c:
        iid = iid_of(ws)
        p = (await call(c, "list_panes"))["panes"][0]
        # The agent sizes its window to the human's terminal, so a row it
        # addresses is a row of the terminal.
        await call(c, "resize_window", {"window_id": p["window_id"], "width": 80, "height": 24})
        # Names the agent chooses, with escapes in them: refused before any
        # question (the proxy admits only canonical host names), and one that
        # is asked, spelled to look like a notice.
        probe = (
            "import socket\n"
            "for req in [b'CONNECT \\x1b[24;1HFAKE-Q.test:443 HTTP/1.1\\r\\n\\r\\n', b'GET http://x\\x1b[24;1HFAKE-Q.test/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n', b'CONNECT sandmux-FAKE-Q.test\\xe2\\x80\\xae:443 HTTP/1.1\\r\\n\\r\\n']:\n"
            "    s = socket.create_connection(('127.0.0.1', 3128)); s.sendall(req); print(s.recv(200)[:40])\n"
        )
        (ws[0] / "probe.py").write_text(probe)
        r = await sh(c, "python3 probe.py")
        assert r["output"].count("403") + r["output"].count("400") == 3, r
        await sh(c, f"(curl -sS -x http://127.0.0.1:3128 http://Sandmux-FAKE.test:{PORT}/ > o1 2>&1) &")
        asked = await open_question(iid, f"http://sandmux-fake.test:{PORT}")
        opened = json.loads(sm("approvals", iid, "--json").stdout)["open"]
        assert len(opened) == 1 and all("\x1b" not in q["name"] for q in opened), opened
        # The pane aims at the bottom row and writes a notice of its own, then holds still.
        await call(c, "send_keys", {"pane_id": p["pane_id"], "text": "clear; printf '\\033[999;1HFAKE-NOTICE\\033[24;1Hsandmux FAKE'; sleep 600"})
        t = Term([BIN, "attach", iid])
        try:
            row = t.until(lambda l: "sandmux-fake.test" in l, 10)
            t.pump(1.0)
            row = t.last()
            assert row.startswith(f"sandmux {iid} read-only: 1 question: "), row
            assert f"#{asked} http://sandmux-fake.test:{PORT}" in row, row
            assert "FAKE" not in row, row
            # The pane's text did reach the screen, above the notice.
            assert any("sandmux FAKE" in l for l in t.screen.display[:-1]), "\n".join(t.screen.display)
        finally:
            t.close()
        # Control: plain tmux in the same terminal puts the pane's text on the last row.
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        ctl = Term(["/usr/bin/env", "tmux", "-N", "-S", str(sock), "attach", "-r"])
        try:
            row = ctl.until(lambda l: "FAKE" in l, 10)
            assert row.startswith("sandmux FAKE"), row
            # tmux keeps no cursor of its own in the terminal's one save
            # slot, which the notice's ESC 7 / ESC 8 use.
            assert b"\x1b7" not in ctl.raw and b"\x1b[s" not in ctl.raw, ctl.raw
        finally:
            ctl.close()
        assert sm("deny", iid, str(asked)).returncode == 0


async def test_the_notice_follows_a_resize(ws):
    async with launch(ws, *ALL) as c:
        iid = iid_of(ws)
        await call(c, "list_panes")
        t = Term([BIN, "attach", iid])
        try:
            t.until(lambda l: "no questions" in l, 10)
            t.resize(30, 100)
            row = t.until(lambda l: "no questions" in l, 5)
            assert len(t.screen.display) == 30 and row == f"sandmux {iid} read-only: no questions", row
            # The client got the rows above it: its pty is 29 x 100.
            await sh(c, "true")
            sizes = subprocess.run(
                ["tmux", "-N", "-S", str(runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"), "list-clients", "-F", "#{client_width}x#{client_height}"],
                capture_output=True, text=True, timeout=10,
            ).stdout.split()
            assert "100x29" in sizes, sizes
            # The endpoint out of reach: the line says so, the attach goes on.
            ctl = runtime_dir_of(serve_pids(ws[0])[0]) / "control.sock"
            ctl.rename(ctl.with_name("control.sock.away"))
            try:
                row = t.until(lambda l: "questions unknown" in l, 5)
                assert row.startswith(f"sandmux {iid} read-only: questions unknown: ") and "control.sock" in row, row
            finally:
                ctl.with_name("control.sock.away").rename(ctl)
            t.until(lambda l: "no questions" in l, 5)
        finally:
            t.close()
