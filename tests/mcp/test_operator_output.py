"""The operator's terminal is an asset: strings the agent chooses (tool names,
resource URIs, request ids, its client name) and the names a workspace
carries reach `sandmux journal` and `ps`. Run through the real CLI in a pty,
none of their bytes may act on the terminal; `--json` stays valid JSON that
round-trips the exact strings."""

import json
import os
import pathlib
import pty
import select
import subprocess
import tempfile
import time

from conftest import BIN, runtime_dir_of

# A clipboard write, a cleared screen, a cursor move up, a carriage return
# (overwrites the row), an 8-bit CSI, a right-to-left override, DEL, a bell.
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[1A\rforged\u009b31m\u202egpj.exe\x7f"
# A tool name that, printed as it is, wraps into a row of the journal's own.
FAKE_ROW = "list_panes" + " " * 70 + "    9 2026-12-07T10:00:00Z (workspace-layer) event"
FORBIDDEN = [b"\x1b", b"\x07", b"\xc2\x9b", "\u202e".encode(), b"\x7f"]


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}


def _in_pty(*args):
    """Runs `sandmux ARGS` with a pty as its terminal; every byte it wrote."""
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, *args], stdin=slave, stdout=slave, stderr=slave, env=_env())
    os.close(slave)
    out = b""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=10)
    os.close(master)
    return p.returncode, out


def _assert_inert(out):
    for b in FORBIDDEN:
        assert b not in out, (b, out)
    # The pty turns each newline into \r\n; any other \r came from a string.
    assert b"\r" not in out.replace(b"\r\n", b""), out


def _rpc(p, msg):
    p.stdin.write((json.dumps(msg) + "\n").encode())
    p.stdin.flush()


def _reply(p, want_id):
    while True:
        line = p.stdout.readline()
        assert line, "serve ended"
        m = json.loads(line)
        if m.get("id") == want_id:
            return m


def test_hostile_strings_never_reach_the_operators_terminal():
    # Positive control: this pty reader sees the hostile bytes when they are
    # written raw (so their absence below is the guard's doing).
    rc, raw = _in_pty("__tools-doc")  # any command, to prove the reader works
    assert rc == 0 and raw
    master, slave = pty.openpty()
    os.write(slave, HOSTILE.encode())
    time.sleep(0.1)
    seen = os.read(master, 65536)
    os.close(slave), os.close(master)
    assert b"\x1b]52" in seen and b"\xc2\x9b" in seen, seen

    with tempfile.TemporaryDirectory(prefix="sandmux-term-") as d:
        d = pathlib.Path(os.path.realpath(d))
        work = d / ("ws" + "\x1b[2J\u202e")
        work.mkdir()
        log = d / "host" / "audit.jsonl"
        p = subprocess.Popen(
            [BIN, "serve", "-w", str(work), "--audit-log", str(log)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(),
        )
        try:
            _rpc(p, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": HOSTILE, "version": "1"}}})
            _reply(p, 1)
            _rpc(p, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            _rpc(p, {"jsonrpc": "2.0", "id": HOSTILE, "method": "tools/call",
                     "params": {"name": HOSTILE, "arguments": {}}})
            assert "error" in _reply(p, HOSTILE)
            # A name that draws a row of the journal's own with spaces
            # (issue 41's class 3, on the journal).
            _rpc(p, {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                     "params": {"name": FAKE_ROW, "arguments": {}}})
            assert "error" in _reply(p, 4)
            _rpc(p, {"jsonrpc": "2.0", "id": 3, "method": "resources/read",
                     "params": {"uri": "sandmux://" + HOSTILE}})
            _reply(p, 3)
            iid = runtime_dir_of(p.pid).name

            recs = [json.loads(l) for l in log.read_text().splitlines()]
            assert any(r["tool"] == HOSTILE and r["request_id"] == HOSTILE for r in recs), recs
            assert any(r.get("client_id") == HOSTILE for r in recs), recs

            rc, out = _in_pty("journal", iid)
            assert rc == 0, out
            _assert_inert(out)
            assert b"\\x1b]52;c;" in out, out  # shown, escaped
            # The agent's name is quoted, its spaces escaped: no second row.
            assert FAKE_ROW.encode() not in out and b"    9 2026" not in out, out
            assert b'?"list_panes\\u0020\\u0020' in out, out

            rc, out = _in_pty("journal", iid, "--json")
            assert rc == 0, out
            _assert_inert(out)
            lines = [json.loads(l) for l in out.decode().splitlines() if l.strip()]
            assert any(r["tool"] == HOSTILE and r["request_id"] == HOSTILE for r in lines)

            rc, out = _in_pty("ps")
            assert rc == 0, out
            _assert_inert(out)
            assert iid.encode() in out and b"ws\\x1b[2J\\u{202e}" in out, out

            rc, out = _in_pty("ps", "--json")
            _assert_inert(out)
            rows = json.loads(out.decode())
            assert any(r["workspace"] == str(work) for r in rows), rows

            # Errors quote what they were given, escaped.
            rc, out = _in_pty("journal", HOSTILE)
            assert rc != 0
            _assert_inert(out)
        finally:
            p.stdin.close()
            p.wait(timeout=20)
