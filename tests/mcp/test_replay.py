"""Recordings are bounded and safe to replay (`serve --record`, `export_replay`).

The agent prints hostile escape sequences inside its pane; the recording is
then replayed by the real `asciinema play` in a pty, and the test reads what
reached that pty (the viewer's terminal). A cast holding the same bytes raw is
the positive control: asciinema passes them through, so the test can see them.
The cap, the cut marker and export_replay's paging are checked on the real
file and the real tool answers."""

import json
import os
import pty
import re
import select
import subprocess
import time

import pytest

from conftest import BIN, call, connect, serve_pids

ASCIINEMA = "/usr/bin/asciinema"
needs_asciinema = pytest.mark.skipif(not os.path.exists(ASCIINEMA), reason="asciinema is not installed (.ci/run installs it)")
pytestmark = pytest.mark.anyio
CUT_MARKER = "sandmux: recording cut at max_bytes"

# (name, bytes the pane writes, what must never reach the viewer). The payloads
# are distinctive, so a leak shows even if a terminal-side parser mangled it.
HOSTILE = [
    ("OSC 52 clipboard write", b"\x1b]52;c;SE9TVElMRS1DTElQ\x07", b"\x1b]52"),
    ("OSC 0 title", b"\x1b]0;HOSTILE-TITLE\x07", b"\x1b]0;"),
    ("OSC 2 title, ST", b"\x1b]2;HOSTILE-TITLE2\x1b\\", b"\x1b]2;"),
    ("OSC 8 hyperlink", b"\x1b]8;;https://hostile.invalid/\x1b\\", b"\x1b]8;"),
    ("DCS DECRQSS", b"\x1bP$qm\x1b\\", b"\x1bP$q"),
    ("DCS XTGETTCAP", b"\x1bP+q436f\x1b\\", b"\x1bP+q"),
    ("DCS tmux passthrough", b"\x1bPtmux;\x1b\x1b]52;c;UEFTU1RIUlU=\x07\x1b\\", b"\x1bPtmux"),
    ("APC", b"\x1b_HOSTILE-APC\x1b\\", b"\x1b_"),
    ("DSR cursor report", b"\x1b[6n", b"\x1b[6n"),
    ("DSR status", b"\x1b[5n", b"\x1b[5n"),
    ("DA", b"\x1b[c", b"\x1b[c"),
    ("DA2", b"\x1b[>c", b"\x1b[>c"),
    ("window title report", b"\x1b[21t", b"\x1b[21t"),
    ("window resize", b"\x1b[8;5;5t", b"\x1b[8;5;5t"),
    ("mouse reporting", b"\x1b[?1000h", b"\x1b[?1000h"),
    ("SGR mouse", b"\x1b[?1006h", b"\x1b[?1006h"),
    ("focus events", b"\x1b[?1004h", b"\x1b[?1004h"),
    ("mouse mode in a list", b"\x1b[?1003;2004h", b"1003"),
    ("DECID", b"\x1bZ", b"\x1bZ"),
]
PAYLOADS = [b"SE9TVElMRS1DTElQ", b"HOSTILE-TITLE", b"hostile.invalid", b"HOSTILE-APC", b"UEFTU1RIUlU="]
# Split between two writes (two %output chunks): an OSC 52 and a DSR query.
SPLIT = [(b"\x1b]5", b"2;c;U1BMSVQtQ0xJUA==\x07"), (b"\x1b[", b"6n")]
SPLIT_LEAKS = [b"U1BMSVQtQ0xJUA==", b"\x1b[6n"]
# Kept: text and colours.
KEPT = [b"VISIBLE-TEXT", b"\x1b[31mRED-TEXT\x1b[0m", b"AFTER-FLOOD"]


def printf(data):
    """A printf line writing `data` exactly (every byte as an octal escape)."""
    return "printf '" + "".join(f"\\{b:03o}" for b in data) + "'"


def hostile_script():
    lines = [printf(b"VISIBLE-TEXT\r\n\x1b[31mRED-TEXT\x1b[0m\r\n")]
    lines += [printf(raw) for _, raw, _ in HOSTILE]
    for a, b in SPLIT:
        lines += [printf(a), "sleep 0.3", printf(b)]
    # An OSC that stays open for 300 kB before anything ends it.
    lines += [printf(b"\x1b]0;"), "head -c 300000 /dev/zero | tr '\\0' A", "sleep 0.3", printf(b"\x1b\\AFTER-FLOOD\r\n")]
    lines.append("echo HOSTILE-DONE")
    return "\n".join(lines) + "\n"


def raw_bytes():
    """Every byte the script writes, in order (for the positive control)."""
    out = b"VISIBLE-TEXT\r\n\x1b[31mRED-TEXT\x1b[0m\r\n" + b"".join(raw for _, raw, _ in HOSTILE)
    return out + b"".join(a + b for a, b in SPLIT)


def play(cast, timeout=120):
    """`asciinema play` in a fresh pty: every byte it wrote to the terminal, and its exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    # Its own config home: asciinema writes one on first use, and as uid 65534 there is no HOME.
    env.update(TERM="xterm-256color", LANG="C.UTF-8", ASCIINEMA_CONFIG_HOME=str(cast.parent / "asciinema-config"))
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(ASCIINEMA, [ASCIINEMA, "play", "-i", "0.05", str(cast)], env)
    out, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return out, os.waitstatus_to_exitcode(status)


def cast_of(data):
    """A cast holding `data` raw as one output event."""
    header = {"version": 2, "width": 80, "height": 24}
    return json.dumps(header) + "\n" + json.dumps([0.1, "o", data.decode("utf-8", "surrogateescape")]) + "\n"


def profile(ws, max_bytes):
    text = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text, n = re.subn(r'^max_bytes = .*$', f'max_bytes = "{max_bytes}"', text, flags=re.M)
    assert n == 1, "the default profile has no [recording] max_bytes"
    p = ws[1] / "rec-profile.toml"
    p.write_text(text)
    return p


async def run_in_pane(c, pane, command, marker):
    sent = await call(c, "send_keys", {"pane_id": pane, "text": command})
    r = await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": [f"^{marker}$"], "regex": True, "timeout": 30})
    assert r["outcome"] == "matched", r


@needs_asciinema
async def test_replaying_a_recording_never_sends_hostile_sequences_to_the_viewer(ws):
    cast = ws[1] / "hostile.cast"
    (ws[0] / "hostile.sh").write_text(hostile_script())
    async with connect(ws, "--record", str(cast)) as c:
        pane = (await call(c, "list_panes"))["panes"][0]["pane_id"]
        await run_in_pane(c, pane, "bash hostile.sh", "HOSTILE-DONE")
        exported = await call(c, "export_replay", {})
        snap = await call(c, "export_replay", {"pane_id": pane})
        status = await call(c, "sandbox_status")
    rec = status["recording"]
    assert rec["cut"] is False and rec.get("error") is None and rec["bytes"] > 0, rec
    assert exported["mode"] == "recording" and exported["cut"] is False
    seen, rc = play(cast)
    assert rc == 0, seen[-500:]
    leaks = [name for name, _, bad in HOSTILE if bad in seen]
    leaks += [p.decode() for p in PAYLOADS + SPLIT_LEAKS if p in seen]
    assert not leaks, f"reached the viewer: {leaks}"
    missing = [k for k in KEPT if k not in seen]
    assert not missing, f"lost: {missing}"
    # The recording as stored and as exported (and a snapshot) hold no OSC/DCS either.
    for text in (cast.read_text(), exported["cast"], snap["cast"]):
        for line in text.splitlines()[1:]:
            data = json.loads(line)[2].encode()
            assert not any(bad in data for _, _, bad in HOSTILE), line[:200]

    # Positive control: the same bytes raw in a cast do reach the viewer's pty.
    raw = ws[1] / "raw.cast"
    raw.write_text(cast_of(raw_bytes()))
    seen_raw, rc = play(raw)
    assert rc == 0
    unseen = [name for name, _, bad in HOSTILE if bad not in seen_raw]
    unseen += [p.decode() for p in PAYLOADS + SPLIT_LEAKS if p not in seen_raw]
    assert not unseen, f"the control did not show: {unseen}"


@needs_asciinema
async def test_a_flood_is_cut_at_max_bytes_with_a_marker_and_reported(ws):
    cap = 65536
    cast = ws[1] / "flood.cast"
    async with connect(ws, "-p", str(profile(ws, cap)), "--record", str(cast)) as c:
        pane = (await call(c, "list_panes"))["panes"][0]["pane_id"]
        await run_in_pane(c, pane, "head -c 3000000 /dev/zero | tr '\\0' y; echo; echo FLOOD-DONE", "FLOOD-DONE")
        status = await call(c, "sandbox_status")
        exported = await call(c, "export_replay", {})
        await run_in_pane(c, pane, "echo AFTER-THE-CUT", "AFTER-THE-CUT")
        later = await call(c, "sandbox_status")
    size = cast.stat().st_size
    assert size <= cap, size
    rec = status["recording"]
    assert rec["cut"] is True and rec["max_bytes"] == cap and rec["bytes"] == size and rec["path"] == str(cast), rec
    assert later["recording"]["bytes"] == size, "the recording grew after the cut"
    assert exported["cut"] is True and exported.get("next_offset") is None and exported["cast"].encode() == cast.read_bytes()
    lines = cast.read_text().splitlines()
    assert json.loads(lines[-1])[1:] == ["m", CUT_MARKER], lines[-1]
    assert "recording cut" in json.loads(lines[-2])[2]
    assert "AFTER-THE-CUT" not in cast.read_text()
    seen, rc = play(cast)
    assert rc == 0 and b"recording cut" in seen, seen[-300:]


async def test_export_replay_pages_through_a_large_recording_in_bounded_windows(ws):
    cast = ws[1] / "big.cast"
    async with connect(ws, "--record", str(cast)) as c:
        pane = (await call(c, "list_panes"))["panes"][0]["pane_id"]
        await run_in_pane(c, pane, "head -c 4000000 /dev/zero | tr '\\0' y; echo; echo BIG-DONE", "BIG-DONE")
        await call(c, "wait_for_stable", {"pane_id": pane, "quiet_ms": 300})
        size = cast.stat().st_size
        assert size > 2_500_000, size
        [serve] = serve_pids(ws[0])
        read_before = read_bytes(serve)
        first = await call(c, "export_replay", {})
        read_after = read_bytes(serve)
        pages, at = [first], first.get("next_offset")
        while at is not None:
            pages.append(await call(c, "export_replay", {"offset": at, "max_bytes": 65536}))
            at = pages[-1].get("next_offset")
        bad_offset = await call(c, "export_replay", {"offset": first["next_offset"] + 1}, ok=False)
        too_big = await call(c, "export_replay", {"max_bytes": 10_000_000}, ok=False)
    assert first["truncated"] and len(first["cast"].encode()) <= 900_000 and first["cast"].endswith("\n")
    assert all(len(p["cast"].encode()) <= 65536 and p["cast"].endswith("\n") for p in pages[1:])
    assert [p["offset"] for p in pages[1:]] == [p.get("next_offset") for p in pages[:-1]]
    assert cast.read_text().startswith("".join(p["cast"] for p in pages))
    assert pages[-1]["truncated"] is False and pages[-1]["cut"] is False
    assert "start of a line" in bad_offset and "65536-900000" in too_big
    if read_before is not None:
        # The supervisor read about one window of the file, not all of it.
        assert read_after - read_before < 1_200_000, (read_after - read_before, size)


def read_bytes(pid):
    """Bytes a process has read so far (/proc/PID/io rchar), or None if hidden."""
    try:
        for line in open(f"/proc/{pid}/io"):
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
