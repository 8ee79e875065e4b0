"""The escape suite driven through MCP, as an agent would drive it.

Each test starts `sandmux serve` with the official MCP Python SDK, plants
something on the host (a listener, a key, a file, a process, a tmux server),
runs a probe inside a pane with the agent's tools (`run_command`, `send_keys`,
`paste_text`, `create_window`, `split_window`, `respawn_pane`, ...), asserts
the errno the probe printed, and checks the host side afterwards.

Every probe has a positive control, so that no check can pass vacuously:
  (b) a test-only profile that opens exactly that door, and the same probe
      then succeeds through MCP and the host-side checker sees it; or
  (a) the very same probe file run unconfined on the host, and the same
      host-side checker sees the effect.
Each control says which form it uses. Probes are Python files written into the
workspace (an agent can do that too) and write their findings as JSON.

Class names (E1..E32, T1..T7) follow reference/escape-classes.md; the map from
classes to tests is docs/security-tests.md.
"""

import contextlib
import ctypes
import errno as errno_mod
import fcntl
import hashlib
import json
import os
import pathlib
import pty
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import termios
import time
import tty
import uuid

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import BIN, alive, call, descendants, runtime_dir_of, serve_pids, server_params, tmux_host, tmux_server_pid

pytestmark = pytest.mark.anyio

ALL = ["--toolsets", "inspect,manage,execute,teardown"]
HOST_PY = sys.executable
UID = os.getuid()
EC = errno_mod.errorcode


def nonce():
    return uuid.uuid4().hex[:12]


# What the pane gate adds for run_command: its two bash functions and the
# prompt hook (src/sandbox/pane.rs).
GATE_SHELL_ENV = {"BASH_FUNC___sandmux_run%%", "BASH_FUNC___sandmux_prompt%%", "PROMPT_COMMAND"}

# ---------------------------------------------------------------- harness

@contextlib.asynccontextmanager
async def launch(ws, *extra, env=None, wrap=None, errlog=None, cwd=None):
    """`sandmux serve` over stdio, optionally exec'd through a small Python
    wrapper (to give it a controlling tty, leaked fds, a cwd) and with its
    stderr captured to a file."""
    p = server_params(ws, *extra, env=env)
    if wrap is not None:
        code, wargs = wrap
        p = StdioServerParameters(command=HOST_PY, args=["-c", code, *wargs, p.command, *p.args], env=p.env, cwd=cwd)
    elif cwd is not None:
        p = StdioServerParameters(command=p.command, args=p.args, env=p.env, cwd=cwd)
    own = errlog is None
    log = open(os.devnull, "w") if own else errlog
    try:
        async with Client(stdio_client(p, errlog=log)) as c:
            yield c
    finally:
        if own:
            log.close()


def profile(ws, name, edit):
    """A test-only profile derived from the built-in default, written to the
    host directory (never the workspace) and validated by sandmux itself."""
    base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    text = edit(base)
    assert text != base, "profile edit changed nothing"
    path = ws[1] / f"{name}.toml"
    path.write_text(text)
    v = subprocess.run([BIN, "profile", "validate", str(path)], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    return str(path)


def add_read_write(*dirs):
    extra = "".join(f', "{d}"' for d in dirs)
    return lambda t: t.replace('read_write = ["{workspace}"]', f'read_write = ["{{workspace}}"{extra}]')


def _no_protected(t):
    out = re.sub(r"(?ms)^protected = \[.*?^\]$", "protected = []", t)
    assert out != t, "no protected list in the profile"
    return out


def chain(*edits):
    def f(t):
        for e in edits:
            t = e(t)
        return t
    return f


# The workspace guard off (P8): no guarded names, git unguarded.
UNGUARDED = lambda t: _no_protected(t).replace('git = "read-only"', 'git = "unguarded"')

NO_SCOPE = chain(
    lambda t: t.replace("[enforcement]\n", "[enforcement]\nlandlock_abi = 5\n"),
    lambda t: t.replace('best_effort = ["cgroup"]', 'best_effort = ["cgroup", "landlock-scope"]'),
)


def host_net(*ports):
    return lambda t: t.replace('mode = "none"', f'mode = "host"\nconnect_tcp = [{", ".join(map(str, ports))}]\nbind_tcp = []')


PREAMBLE = r'''
import ctypes, errno, json, os, socket, stat, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
R = {}
def en(e):
    return errno.errorcode.get(e, str(e))
def sc(*a):
    """A raw syscall: its result, or the errno name."""
    args = [ctypes.c_long(x) if isinstance(x, int) else x for x in a]
    r = libc.syscall(*args)
    return r if r >= 0 else en(ctypes.get_errno())
def tr(f):
    """f(), or the errno name of the OSError it raised."""
    try:
        return f()
    except OSError as e:
        return en(e.errno)
def done():
    with open(sys.argv[1] + ".part", "w") as fh:
        json.dump(R, fh)
    os.replace(sys.argv[1] + ".part", sys.argv[1])  # atomic: readers never see half a file
    print("PROBE-" + "DONE", len(R))
'''


def write_probe(ws, tag, body):
    p = ws[0] / f"probe_{tag}.py"
    p.write_text(PREAMBLE + body + "\ndone()\n")
    return p


async def run_probe(c, ws, tag, body, *args, pane_id=None, timeout=25):
    """Runs a probe in a pane with run_command; returns what it found."""
    p = write_probe(ws, tag, body)
    out = ws[0] / f"out_{tag}.json"
    cmd = " ".join(shlex.quote(str(x)) for x in ["python3", p, out, *args])
    a = {"command": cmd, "timeout": timeout}
    if pane_id:
        a["pane_id"] = pane_id
    r = await call(c, "run_command", a)
    # A probe that walks the whole view can outlast one wait on a loaded
    # machine: collect it as an agent would, with wait_for_command.
    for _ in range(4):
        if r["status"] != "timeout" or "command_id" not in r:
            break
        r = await call(c, "wait_for_command", {"command_id": r["command_id"], "timeout": timeout})
    assert r["status"] == "completed" and r["exit_status"] == 0 and "PROBE-DONE" in r["output"], r
    return json.loads(out.read_text()), r


def host_probe(ws, tag, body, *args, **kw):
    """Form (a): exactly the same probe file, run unconfined on the host."""
    p = ws[1] / f"hostprobe_{tag}.py"
    p.write_text(PREAMBLE + body + "\ndone()\n")
    out = ws[1] / f"hostout_{tag}.json"
    kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 30)
    r = subprocess.run([HOST_PY, str(p), str(out), *map(str, args)], **kw)
    assert r.returncode == 0 and out.exists(), (r.stdout, r.stderr)
    return json.loads(out.read_text())


def wait_file(path, seconds=15, needle=None):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            t = path.read_text()
            if needle is None or needle in t:
                return t
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def proc_state(pid):
    st = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return st[st.rfind(")") + 2]


def host_ipv4():
    """A non-loopback IPv4 address of a host interface (fallback 127.0.0.1)."""
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
        for i, l in enumerate(lines):
            if "/32 host LOCAL" in l:
                ip = lines[i - 1].split()[-1]
                if not ip.startswith("127."):
                    return ip
    except OSError:
        pass
    return "127.0.0.1"


def mtime_and_hash(p):
    try:
        s = os.lstat(p)
        return (s.st_mtime_ns, s.st_mode, hashlib.sha256(open(p, "rb").read()).hexdigest() if stat.S_ISREG(s.st_mode) else None)
    except OSError as e:
        return ("missing", e.errno)


RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def strings_in(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from strings_in(v)


def raw_controls(obj):
    """Raw control characters (C0 but newline/tab, DEL, C1) in any string."""
    return [s for s in strings_in(obj) if RAW_CONTROL.search(s)]


# ---------------------------------------------------------------- E1 / E2

E1_PROBE = r'''
fds = [0, 1, 2]
R["open_tty"] = tr(lambda: fds.append(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)) or 0)
fds += [int(n) for n in os.listdir("/proc/self/fd")]
res = []
ch = ctypes.create_string_buffer(b"Z")
sub = ctypes.create_string_buffer(b"\x03")  # TIOCL_PASTESEL
for fd in sorted(set(fds)):
    target = tr(lambda: os.readlink("/proc/self/fd/%d" % fd))
    for name, req, arg in [("TIOCSTI", 0x5412, ch), ("TIOCSTI|1<<32", 0x5412 | (1 << 32), ch),
                           ("TIOCSTI|hi", 0xDEADBEEF00005412, ch),
                           ("TIOCLINUX", 0x541C, sub), ("TIOCLINUX|1<<32", 0x541C | (1 << 32), sub)]:
        res.append([fd, target, name, sc(16, fd, req, arg)])
R["ioctls"] = res
'''


async def test_e1_e2_tiocsti_and_tioclinux_refused_on_every_fd(ws):
    # sandmux runs under a harness-owned pty (its controlling terminal); that
    # pty's input queue must stay empty, and the pane's own input too.
    master, slave = pty.openpty()
    tty.setraw(slave)
    slave_name = os.ttyname(slave)
    wrapper = (
        "import fcntl,os,sys,termios\n"
        "fd=os.open(sys.argv[1],os.O_RDWR)\n"
        "fcntl.ioctl(fd,termios.TIOCSCTTY,0)\n"
        "os.close(fd)\n"
        "os.execv(sys.argv[2],sys.argv[2:])\n"
    )
    try:
        async with launch(ws, wrap=(wrapper, [slave_name])) as c:
            pid = serve_pids(ws[0])[0]
            # The harness pty really is sandmux's controlling terminal.
            assert os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
            sid_tty = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4]
            assert int(sid_tty) == os.stat(slave_name).st_rdev
            pane = (await call(c, "list_panes"))["panes"][0]["pane_id"]
            p = write_probe(ws, "e1", E1_PROBE)
            out = ws[0] / "out_e1.json"
            # Typed by the agent, as keys.
            sent = await call(c, "send_keys", {"pane_id": pane, "text": f"python3 {p} {out}"})
            await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^PROBE-DONE"], "regex": True, "timeout": 20})
            await anyio.sleep(0.3)
            screen = (await call(c, "capture_pane", {"pane_id": pane, "start": -50}))["text"]
        res = json.loads(out.read_text())
        ioctls = res["ioctls"]
        assert len(ioctls) >= 5 * 4, ioctls
        assert {fd for fd, *_ in ioctls} >= {0, 1, 2}
        assert res["open_tty"] == 0, res  # /dev/tty is the pane's own pty
        # Every call refused by seccomp (EPERM), high bits or not.
        assert all(r == "EPERM" for *_, r in ioctls), ioctls
        # The pane received nothing either: no 'Z' typed after the probe.
        assert "ZZ" not in screen.split("PROBE-DONE")[-1], screen
        n = fcntl.ioctl(slave, termios.FIONREAD, b"\0\0\0\0")
        assert int.from_bytes(n, "little") == 0, "the harness pty's input queue is not empty"
    finally:
        os.close(master)
        os.close(slave)

    # Positive control (a): the same probe on the host with a harness pty as
    # its controlling tty injects into that pty's input queue.
    m2, s2 = pty.openpty()
    tty.setraw(s2)

    def ctty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        h = host_probe(ws, "e1", E1_PROBE, stdin=s2, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, capture_output=False, preexec_fn=ctty)
        q = int.from_bytes(fcntl.ioctl(s2, termios.FIONREAD, b"\0\0\0\0"), "little")
        legacy = pathlib.Path("/proc/sys/dev/tty/legacy_tiocsti")
        if q == 0:
            # TIOCSTI is disabled host-wide for processes without CAP_SYS_ADMIN:
            # the probe still reached the ioctl (EIO, not the sandbox's EPERM).
            assert legacy.exists() and legacy.read_text().strip() == "0" and UID != 0, h
            assert any(fd == 0 and n == "TIOCSTI" and r == "EIO" for fd, _, n, r in h["ioctls"]), h
        else:
            assert os.read(s2, q) == b"Z" * q
            assert any(fd == 0 and n == "TIOCSTI" and r == 0 for fd, _, n, r in h["ioctls"]), h
            # 64-bit compare pitfall (CVE-2019-10063): the kernel itself ignores the high bits.
            assert any(fd == 0 and n == "TIOCSTI|1<<32" and r == 0 for fd, _, n, r in h["ioctls"]), h
        # TIOCLINUX reaches the tty driver on the host (not a VT: ENOTTY/EINVAL), not EPERM.
        assert all(r != "EPERM" for fd, _, n, r in h["ioctls"] if n.startswith("TIOCLINUX") and fd == 0), h
    finally:
        os.close(m2)
        os.close(s2)


# ---------------------------------------------------------------- E3

E3_CMD = (
    # The OSC 52 payload is assembled at run time: only real output carries it whole.
    "a=ZXZp; b=bA==; printf 'E3-BEGIN \\033[31mred\\033[0m \\033]0;t1\\007 \\033]2;t2\\033\\\\ "
    "\\033]52;c;%s%s\\007 \\033P1$r\\033\\\\ \\033Ptmux;\\033\\033]52;c;%s%s\\007\\033\\\\ "
    "\\033_apc\\033\\\\ \\033^pm\\033\\\\ \\033Xsos\\033\\\\ \\033[c \\033[>c \\033[6n \\033]11;?\\007 "
    "\\033Z \\005 \\302\\23331m \\302\\2350;c1\\007 \\a\\b\\016\\017\\177 E3-END\\n' $a $b $a $b | tee e3.bin"
)


async def test_e3_escape_sequences_reach_no_result_log_or_stderr(ws):
    errlog = ws[1] / "stderr.log"
    with open(errlog, "w") as err:
        async with launch(ws, *ALL, errlog=err) as c:
            s = await call(c, "create_session", {"session_name": "e3"})
            pane = s["pane_id"]
            results = []
            results.append(await call(c, "run_command", {"pane_id": pane, "command": E3_CMD}))
            assert "E3-BEGIN" in results[-1]["output"] and "E3-END" in results[-1]["output"], results[-1]
            # The same bytes once more, pasted, and waited for.
            first = await call(c, "capture_since", {"pane_id": pane})
            results.append(first)
            results.append(await call(c, "paste_text", {"pane_id": pane, "text": E3_CMD}))
            sent = await call(c, "send_keys", {"pane_id": pane, "keys": ["Enter"]})
            results.append(await call(c, "wait_for_text", {"cursor": sent["cursor"], "patterns": ["^E3-BEGIN .*E3-END"], "regex": True, "timeout": 10}))
            assert results[-1]["outcome"] == "matched", results[-1]
            await call(c, "wait_for_stable", {"pane_id": pane, "quiet_ms": 200})
            results.append(await call(c, "capture_since", {"pane_id": pane, "cursor": first["cursor"]}))
            results.append(await call(c, "capture_pane", {"pane_id": pane, "start": -200}))
            results.append(await call(c, "snapshot_pane", {"pane_id": pane}))
            results.append(await call(c, "search_panes", {"pattern": "E3-BEGIN"}))
            results.append(await call(c, "get_pane_info", {"pane_id": pane}))
            results.append(await call(c, "list_panes"))
            results.append(await call(c, "display_message", {"pane_id": pane, "format_string": "#{pane_title}"}))
            results.append(await call(c, "export_replay", {"pane_id": pane}))
            text_results = []
            for name, args in [("capture_pane", {"pane_id": pane}), ("search_panes", {"pattern": "E3-END"})]:
                r = await c.call_tool(name, args)
                text_results += [x.text for x in r.content if getattr(x, "text", None)]
    assert any("E3-BEGIN" in s for s in strings_in(results)), results
    bad = raw_controls(results) + raw_controls(text_results)
    assert not bad, bad[:3]
    # export_replay's cast holds SGR only as JSON text ("\u001b[31m"), never a raw byte, and no OSC 52 payload.
    assert not any("ZXZpbA==" in s for s in [*strings_in(results), *text_results]), "OSC 52 payload in a result"
    log = (ws[1] / "audit.jsonl").read_bytes()
    assert b"run_command" in log and b"paste_text" in log
    for raw in (b"\x1b", b"\x07", b"\xc2\x9b", b"\xc2\x9d", b"\x9b"):
        assert raw not in log, f"audit log holds raw {raw!r}"
        assert raw not in errlog.read_bytes(), f"stderr holds raw {raw!r}"
    # Positive control (a): the pane really emitted the raw sequences (tee'd
    # to the workspace), and the same checker flags them there.
    emitted = (ws[0] / "e3.bin").read_bytes()
    assert b"\x1b]52;c;ZXZpbA==\x07" in emitted and b"\xc2\x9b31m" in emitted and b"\x1bPtmux;" in emitted
    assert raw_controls(emitted.decode("utf-8", "replace"))


# ---------------------------------------------------------------- E4

E4_PROBE = r'''
name = sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(2)
def c():
    s.connect("\0" + name)
    s.sendall(b"E4-HELLO")
    return 0
R["stream"] = tr(c)
d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
R["dgram"] = tr(lambda: d.sendto(b"E4-HELLO", "\0" + name + "-dg") and 0)
# well-known abstract names, for information
for w in ["/tmp/.X11-unix/X0", "/tmp/dbus-0", "containerd-shim"]:
    x = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    R["wk:" + w] = tr(lambda: x.connect("\0" + w) or 0)
'''


class AbstractListener:
    def __init__(self):
        self.name = f"sandmux-esc-{nonce()}"
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.bind("\0" + self.name)
        self.s.listen(8)
        self.s.setblocking(False)
        self.d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.d.bind("\0" + self.name + "-dg")
        self.d.setblocking(False)

    def seen(self):
        got = []
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = self.s.accept()
                conn.settimeout(1)
                got.append(("stream", conn.recv(64)))
                conn.close()
        with contextlib.suppress(BlockingIOError):
            while True:
                got.append(("dgram", self.d.recv(64)))
        return got

    def close(self):
        self.s.close()
        self.d.close()


async def test_e4_abstract_unix_sockets(ws):
    lis = AbstractListener()
    try:
        # none mode: the abstract namespace is the sandbox's own netns.
        async with launch(ws) as c:
            r, _ = await run_probe(c, ws, "e4", E4_PROBE, lis.name)
        assert r["stream"] == "ECONNREFUSED" and r["dgram"] == "ECONNREFUSED", r
        assert lis.seen() == []
        # host mode: same netns as the host; the Landlock abstract-socket scope holds.
        prof = profile(ws, "e4-host", host_net(9))
        async with launch(ws, "-p", prof) as c:
            st = await call(c, "sandbox_status")
            assert st["network"] == "host" and any(l["layer"] == "landlock-scope" and l["enforced"] for l in st["layers"]), st
            r, _ = await run_probe(c, ws, "e4", E4_PROBE, lis.name)
        assert r["stream"] == "EPERM" and r["dgram"] == "EPERM", r
        assert lis.seen() == []
        # Positive control (b): host mode with the scope dropped (explicit
        # opt-in, Landlock pinned to ABI 5): the probe reaches the listener.
        prof = profile(ws, "e4-open", chain(host_net(9), NO_SCOPE))
        async with launch(ws, "-p", prof) as c:
            st = await call(c, "sandbox_status")
            assert "landlock-scope" in st["dropped"], st
            r, _ = await run_probe(c, ws, "e4", E4_PROBE, lis.name)
        assert r["stream"] == 0 and r["dgram"] == 0, r
        assert sorted(lis.seen()) == [("dgram", b"E4-HELLO"), ("stream", b"E4-HELLO")]
    finally:
        lis.close()


# ---------------------------------------------------------------- E5

E5_PROBE = r'''
paths = json.loads(sys.argv[2])
names = json.loads(sys.argv[3])
for p, kind in paths:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM if kind == "stream" else socket.SOCK_DGRAM)
    s.settimeout(2)
    def c():
        if kind == "stream":
            s.connect(p)
        else:
            s.sendto(b"E5-HELLO", p)
        return 0
    R["stat:" + p] = tr(lambda: os.stat(p) and 0)
    R["connect:" + p] = tr(c)
R["env"] = {n: os.environ[n] for n in names if n in os.environ}
R["env_names"] = sorted(os.environ)
'''

E5_VARS = ["DBUS_SESSION_BUS_ADDRESS", "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DOCKER_HOST", "CONTAINER_HOST", "WAYLAND_DISPLAY",
           "DISPLAY", "PIPEWIRE_REMOTE", "NOTIFY_SOCKET", "VSCODE_IPC_HOOK_CLI", "XDG_RUNTIME_DIR", "TMUX", "TMUX_PANE",
           "SSH_AGENT_PID", "DBUS_SYSTEM_BUS_ADDRESS", "CANARY_KEPT"]


async def test_e5_host_pathname_sockets_and_their_variables(ws):
    with tempfile.TemporaryDirectory(prefix="sandmux-esc-e5-") as h:
        h = pathlib.Path(os.path.realpath(h))
        xdg = h / "xdg"
        xdg.mkdir(mode=0o700)
        (xdg / "gnupg").mkdir()
        (xdg / "podman").mkdir()
        (h / "ssh-agent").mkdir()
        socks = {
            "bus": (xdg / "bus", "stream"),
            "ssh": (h / "ssh-agent" / "agent.42", "stream"),
            "gpg": (xdg / "gnupg" / "S.gpg-agent", "stream"),
            "docker": (xdg / "docker.sock", "stream"),
            "podman": (xdg / "podman" / "podman.sock", "stream"),
            "wayland": (xdg / "wayland-0", "stream"),
            "pipewire": (xdg / "pipewire-0", "stream"),
            "x11": (h / "X11-unix-X97", "stream"),
            "notify": (xdg / "notify", "dgram"),
            "vscode": (xdg / "vscode-ipc-1.sock", "stream"),
        }
        listeners = {}
        for k, (path, kind) in socks.items():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM if kind == "stream" else socket.SOCK_DGRAM)
            s.bind(str(path))
            if kind == "stream":
                s.listen(4)
            s.setblocking(False)
            listeners[k] = s

        def seen():
            got = []
            for k, s in listeners.items():
                with contextlib.suppress(BlockingIOError):
                    if socks[k][1] == "stream":
                        s.accept()[0].close()
                    else:
                        s.recv(64)
                    got.append(k)
            return sorted(got)

        canary = f"canary-{nonce()}"
        env = {
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={socks['bus'][0]}",
            "SSH_AUTH_SOCK": str(socks["ssh"][0]),
            "SSH_AGENT_PID": "4242",
            "GPG_AGENT_INFO": f"{socks['gpg'][0]}:0:1",
            "DOCKER_HOST": f"unix://{socks['docker'][0]}",
            "CONTAINER_HOST": f"unix://{socks['podman'][0]}",
            "WAYLAND_DISPLAY": "wayland-0",
            "DISPLAY": ":97",
            "PIPEWIRE_REMOTE": str(socks["pipewire"][0]),
            "NOTIFY_SOCKET": str(socks["notify"][0]),
            "VSCODE_IPC_HOOK_CLI": str(socks["vscode"][0]),
            "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={socks['bus'][0]}",
            "CANARY_KEPT": canary,
        }
        paths = json.dumps([[str(p), kind] for p, kind in socks.values()])
        try:
            async with launch(ws, env={**env, "XDG_RUNTIME_DIR": str(xdg)}) as c:
                r, _ = await run_probe(c, ws, "e5", E5_PROBE, paths, json.dumps(E5_VARS))
            for p, kind in socks.values():
                assert r[f"stat:{p}"] == "ENOENT" and r[f"connect:{p}"] == "ENOENT", (p, r)
            assert r["env"] == {}, r["env"]
            assert seen() == [], "a host listener saw a connection"
            # Positive control (b): a profile that binds the host directory and
            # keeps one harmless variable; the same probe reaches every listener
            # and sees the kept variable. (The socket variables themselves cannot
            # be kept: `profile validate` refuses them, checked below.)
            prof = profile(ws, "e5-open", chain(add_read_write(h), lambda t: t.replace('keep = ["TERM"', 'keep = ["CANARY_KEPT", "TERM"')))
            async with launch(ws, "-p", prof, env=env) as c:
                r, _ = await run_probe(c, ws, "e5", E5_PROBE, paths, json.dumps(E5_VARS))
            assert all(r[f"connect:{p}"] == 0 for p, _ in socks.values()), r
            assert r["env"] == {"CANARY_KEPT": canary}, r["env"]
            assert seen() == sorted(socks), "the control's connections were not seen"
            for var in ["SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "WAYLAND_DISPLAY", "NOTIFY_SOCKET", "TMUX"]:
                bad = ws[1] / "bad.toml"
                bad.write_text(pathlib.Path(prof).read_text().replace('keep = ["CANARY_KEPT"', f'keep = ["{var}"'))
                v = subprocess.run([BIN, "profile", "validate", str(bad)], capture_output=True, text=True)
                assert v.returncode != 0 and "may not enter the sandbox" in v.stderr, (var, v.stderr)
        finally:
            for s in listeners.values():
                s.close()


# ---------------------------------------------------------------- E6

E6_CHILD = r'''
import ctypes, os, signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCONT):
    signal.signal(s, lambda n, f: log.write("%d\n" % n))
secret = ctypes.create_string_buffer(os.environ["E6_SECRET"].encode())
ctypes.CDLL(None).prctl(0x59616d61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)  # PR_SET_PTRACER_ANY (Yama)
with open(sys.argv[2], "w") as f:
    f.write("%d %d %d" % (os.getpid(), ctypes.addressof(secret), len(secret.value)))
while True:
    time.sleep(0.05)
'''

E6_PROBE = r'''
pid, addr, n = (int(x) for x in sys.argv[2:5])
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(n)
local, remote = iovec(ctypes.addressof(buf), n), iovec(addr, n)
r = sc(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
R["process_vm_readv"] = buf.raw.decode("latin1") if r == n else r
def mem():
    with open("/proc/%d/mem" % pid, "rb") as f:
        f.seek(addr)
        return f.read(n).decode("latin1")
R["proc_mem"] = tr(mem)
R["environ"] = tr(lambda: open("/proc/%d/environ" % pid, "rb").read().decode("latin1"))
R["pidfd_open"] = sc(434, pid, 0)
a = sc(101, 16, pid, 0, 0)  # PTRACE_ATTACH
R["ptrace_attach"] = a
if a == 0:
    os.waitpid(pid, 0)
    sc(101, 17, pid, 0, 0)  # PTRACE_DETACH
time.sleep(0.1)
for s in ("SIGUSR1", "SIGTERM", "SIGHUP", "SIGINT", "SIGSTOP", "SIGCONT", "SIGKILL"):
    R["kill:" + s] = tr(lambda: os.kill(pid, getattr(__import__("signal"), s)) or 0)
    time.sleep(0.05)
'''


async def test_e6_signals_ptrace_and_memory_of_a_host_process(ws):
    secret = f"e6-secret-{nonce()}"
    log, info = ws[1] / "e6-signals.log", ws[1] / "e6-info"
    (ws[1] / "e6child.py").write_text(E6_CHILD)
    child = subprocess.Popen([HOST_PY, str(ws[1] / "e6child.py"), str(log), str(info)], env={**os.environ, "E6_SECRET": secret})
    try:
        pid, addr, n = wait_file(info).split()
        async with launch(ws, *ALL) as c:
            r, res = await run_probe(c, ws, "e6", E6_PROBE, pid, addr, n)
            # kill(-1, SIGKILL) from another pane ends at most that pane's own domain.
            await call(c, "create_window", {"shell": "sleep 0.3; python3 -c 'import os; os.kill(-1, 9)'"})
            await anyio.sleep(0.8)
            assert (await call(c, "run_command", {"command": "echo still-here"}))["output"] == "still-here"
        assert secret not in json.dumps(r) and secret not in json.dumps(res)
        assert r["process_vm_readv"] == "EPERM", r  # seccomp
        assert r["proc_mem"] == "ENOENT" and r["environ"] == "ENOENT", r  # not in the pid namespace
        assert r["pidfd_open"] in ("ESRCH", "EPERM"), r
        assert r["ptrace_attach"] in ("ESRCH", "EPERM"), r
        assert all(r["kill:" + s] in ("ESRCH", "EPERM") for s in ("SIGUSR1", "SIGTERM", "SIGHUP", "SIGINT", "SIGSTOP", "SIGCONT", "SIGKILL")), r
        assert child.poll() is None and proc_state(child.pid) in "SR", "the host process was hit"
        assert pathlib.Path(f"/proc/{child.pid}/status").read_text().count("TracerPid:\t0") == 1
        assert not log.exists() or log.read_text() == "", log.read_text()
        # Positive control (a): the same probe run on the host reads the secret
        # (memory, environ), attaches, and every signal arrives; SIGKILL ends it.
        h = host_probe(ws, "e6", E6_PROBE, pid, addr, n)
        assert secret in h["environ"], h
        yama = pathlib.Path("/proc/sys/kernel/yama/ptrace_scope")
        scope = int(yama.read_text()) if yama.exists() else 0
        if scope < 2 or (scope == 2 and UID == 0):  # Yama 1 is lifted by the child's PR_SET_PTRACER_ANY
            assert h["process_vm_readv"] == secret and h["proc_mem"] == secret, h
            assert h["ptrace_attach"] == 0, h
        assert child.wait(timeout=5) == -signal.SIGKILL
        got = {int(x) for x in log.read_text().split()}
        assert {signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP, signal.SIGINT} <= got, got
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# ---------------------------------------------------------------- E7

E7_PROBE = r'''
shm_key, msg_key, sem_key = (int(x, 0) for x in sys.argv[2:5])
mq_name, shm_file = sys.argv[5], sys.argv[6]
R["ipcs"] = subprocess.run(["ipcs", "-a"], capture_output=True, text=True).stdout
libc.shmat.restype = ctypes.c_void_p
sid = sc(29, shm_key, 0, 0)  # shmget
R["shmget"] = sid
if isinstance(sid, int):
    p = libc.shmat(sid, None, 0)
    R["shm_read"] = ctypes.string_at(p, 16).split(b"\0")[0].decode()
    ctypes.memmove(p, b"PWNED-BY-PROBE\0", 15)
    libc.shmdt(ctypes.c_void_p(p))
mid = sc(68, msg_key, 0)  # msgget
R["msgget"] = mid
if isinstance(mid, int):
    m = ctypes.create_string_buffer(b"\x01\0\0\0\0\0\0\0PWNED")
    R["msgsnd"] = sc(69, mid, m, 5, 0)
semid = sc(64, sem_key, 0, 0)  # semget
R["semget"] = semid
if isinstance(semid, int):
    op = (ctypes.c_short * 3)(0, 1, 0)
    R["semop"] = sc(65, semid, op, 1)
mq = sc(240, mq_name.encode(), os.O_RDWR, 0, None)  # mq_open
R["mq_open"] = mq
if isinstance(mq, int):
    R["mq_send"] = sc(242, mq, b"PWNED", 5, 0, None)
R["dev_shm"] = tr(lambda: sorted(os.listdir("/dev/shm")))
def w():
    with open("/dev/shm/" + shm_file, "r+") as f:
        f.write("PWNED")
    return 0
R["dev_shm_write"] = tr(w)
'''


class SysvObjects:
    """Host-side SysV shm/msg/sem, a POSIX queue and a /dev/shm file."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.ct = ctypes
        self.libc.syscall.restype = ctypes.c_long
        self.libc.shmat.restype = ctypes.c_void_p
        base = int(nonce()[:7], 16) | 0x10000000
        self.keys = (base, base + 1, base + 2)
        L = ctypes.c_long
        self.shmid = self.libc.syscall(L(29), L(self.keys[0]), L(4096), L(0o1600))  # IPC_CREAT|0600
        self.msgid = self.libc.syscall(L(68), L(self.keys[1]), L(0o1600))
        self.semid = self.libc.syscall(L(64), L(self.keys[2]), L(1), L(0o1600))
        assert min(self.shmid, self.msgid, self.semid) >= 0, ctypes.get_errno()
        self.addr = self.libc.shmat(self.shmid, None, 0)
        ctypes.memmove(self.addr, b"HOST-SHM-CANARY\0", 16)
        m = ctypes.create_string_buffer(b"\x01\0\0\0\0\0\0\0hello")
        assert self.libc.syscall(L(69), L(self.msgid), m, L(5), L(0)) == 0
        assert self.libc.syscall(L(66), L(self.semid), L(0), L(16), L(7)) == 0  # SETVAL 7
        self.mq_name = f"sandmux-esc-{nonce()}"  # raw mq_open: no leading slash
        self.mq = self.libc.syscall(L(240), self.mq_name.encode(), L(os.O_RDWR | os.O_CREAT), L(0o600), None)
        self.shm_file = f"sandmux-esc-{nonce()}"
        self.shm_path = pathlib.Path("/dev/shm") / self.shm_file
        try:
            self.shm_path.write_text("HOST-DEVSHM")
        except OSError:
            self.shm_path = None

    def args(self):
        return [hex(k) for k in self.keys] + [self.mq_name, self.shm_file]

    def state(self):
        L = self.ct.c_long
        shm = self.ct.string_at(self.addr, 16).split(b"\0")[0].decode()
        nattch = qnum = None
        for l in pathlib.Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
            f = l.split()
            if int(f[1]) == self.shmid:
                nattch = int(f[6])
        for l in pathlib.Path("/proc/sysvipc/msg").read_text().splitlines()[1:]:
            f = l.split()
            if int(f[1]) == self.msgid:
                qnum = int(f[4])
        semval = self.libc.syscall(L(66), L(self.semid), L(0), L(12))  # GETVAL
        mq = None
        if self.mq >= 0:
            attr = (self.ct.c_long * 8)()
            self.libc.syscall(L(245), L(self.mq), None, attr)  # mq_getsetattr
            mq = attr[3]
        dev = self.shm_path.read_text() if self.shm_path else None
        return {"shm": shm, "nattch": nattch, "qnum": qnum, "semval": semval, "mq_curmsgs": mq, "dev_shm": dev}

    def close(self):
        L = self.ct.c_long
        self.libc.shmdt(self.ct.c_void_p(self.addr))
        self.libc.syscall(L(31), L(self.shmid), L(0), None)  # IPC_RMID
        self.libc.syscall(L(71), L(self.msgid), L(0), None)
        self.libc.syscall(L(66), L(self.semid), L(0), L(0))
        if self.mq >= 0:
            os.close(self.mq)
            self.libc.syscall(L(241), self.mq_name.encode())
        if self.shm_path:
            self.shm_path.unlink(missing_ok=True)


async def test_e7_sysv_ipc_posix_queues_and_dev_shm(ws):
    o = SysvObjects()
    try:
        before = o.state()
        assert before["shm"] == "HOST-SHM-CANARY" and before["qnum"] == 1 and before["semval"] == 7 and before["nattch"] == 1
        async with launch(ws) as c:
            r, _ = await run_probe(c, ws, "e7", E7_PROBE, *o.args())
        assert r["shmget"] == "ENOENT" and r["msgget"] == "ENOENT" and r["semget"] == "ENOENT", r
        assert r["mq_open"] == "ENOENT", r
        assert o.shm_file not in r["dev_shm"] and r["dev_shm_write"] == "ENOENT", r
        assert not any(hex(k)[2:] in r["ipcs"] for k in o.keys), r["ipcs"]
        assert "Shared Memory Segments" in r["ipcs"]  # ipcs itself ran
        assert o.state() == before
        # Positive control (a): the same probe on the host finds and changes every object.
        h = host_probe(ws, "e7", E7_PROBE, *o.args())
        assert isinstance(h["shmget"], int) and h["shm_read"] == "HOST-SHM-CANARY" and h["semop"] == 0 and h["msgsnd"] == 0, h
        assert hex(o.keys[0])[2:] in h["ipcs"]
        after = o.state()
        assert after["shm"] == "PWNED-BY-PROBE" and after["qnum"] == 2 and after["semval"] == 8, after
        if o.mq >= 0:
            assert h["mq_send"] == 0 and after["mq_curmsgs"] == 1, (h, after)
        if o.shm_path:
            assert o.shm_file in h["dev_shm"] and after["dev_shm"].startswith("PWNED"), (h, after)
    finally:
        o.close()


# ---------------------------------------------------------------- E8

E8_PROBE = r'''
desc = sys.argv[2]
out = {}
for ring_name, ring in (("@u", -4), ("@s", -3)):
    kid = sc(250, 10, ring, b"user", desc.encode(), 0)  # KEYCTL_SEARCH
    out["search" + ring_name] = kid
    if isinstance(kid, int):
        buf = ctypes.create_string_buffer(256)
        n = sc(250, 11, kid, buf, 256)  # KEYCTL_READ
        out["read" + ring_name] = buf.raw[:n].decode() if isinstance(n, int) else n
out["get_keyring_id@s"] = sc(250, 0, -3, 0)
out["add_key"] = sc(248, b"user", b"probe-key", b"x", 1, -4)
out["request_key"] = sc(249, b"user", desc.encode(), None, 0)
out["proc_keys"] = tr(lambda: open("/proc/keys").read())
R.update(out)
'''


async def test_e8_kernel_keyrings(ws):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_long
    desc, payload = f"sandmux-esc-{nonce()}", f"KEY-PAYLOAD-{nonce()}"
    ku = libc.syscall(L(248), b"user", desc.encode(), payload.encode(), L(len(payload)), L(-4))  # add_key to @u
    if ku < 0:
        pytest.skip(f"the host refuses add_key for this uid ({EC.get(ctypes.get_errno())}); no key to protect")
    # Readable by its uid, not only by a possessor (as a credential helper would set it).
    assert libc.syscall(L(250), L(5), L(ku), L(0x3F3F0000)) == 0  # KEYCTL_SETPERM
    ks = libc.syscall(L(248), b"user", desc.encode(), payload.encode(), L(len(payload)), L(-3))  # and to @s
    try:
        async with launch(ws) as c:
            r, res = await run_probe(c, ws, "e8", E8_PROBE, desc)
        assert payload not in json.dumps(r) and payload not in json.dumps(res)
        for k in ("search@u", "search@s", "get_keyring_id@s", "add_key", "request_key"):
            assert r[k] == "EPERM", (k, r)
        assert r["proc_keys"] == "", r  # /proc/keys is covered with an empty file
        # Positive control (a): the same probe on the host finds and reads the payload.
        h = host_probe(ws, "e8", E8_PROBE, desc)
        assert h["read@u"] == payload, h
        assert desc in h["proc_keys"]
        if ks >= 0:
            assert h["read@s"] == payload, h
    finally:
        for k in (ku, ks):
            if k >= 0:
                libc.syscall(L(250), L(21), L(k))  # KEYCTL_INVALIDATE


# ---------------------------------------------------------------- E9 / E11

E9_PROBE = r'''
existing = json.loads(sys.argv[2])
create = json.loads(sys.argv[3])
ws = sys.argv[4]
for i, p in enumerate(existing):
    r = {}
    r["read"] = tr(lambda: "ok:" + open(p).read()[:60])
    def app():
        with open(p, "a") as f:
            f.write("PWNED\n")
        return 0
    r["append"] = tr(app)
    def trunc():
        with open(p, "r+") as f:
            f.truncate(0)
        return 0
    r["truncate"] = tr(trunc)
    r["chmod"] = tr(lambda: os.chmod(p, 0o777) or 0)
    r["link"] = tr(lambda: os.link(p, os.path.join(ws, "hardlink-%d" % i)) or 0)
    tmp = p + ".sandmux-new"
    def swap():
        os.symlink("/etc/passwd", tmp)
        os.rename(tmp, p)
        return 0
    r["symlink_replace"] = tr(swap)
    tr(lambda: os.unlink(tmp))
    r["unlink"] = tr(lambda: os.unlink(p) or 0)
    R["e:" + p] = r
for p in create:
    def mk():
        with open(p, "x") as f:
            f.write("PWNED\n")
        return 0
    R["c:" + p] = tr(mk)
'''

WRITE_OPS = ("append", "truncate", "chmod", "link", "symlink_replace", "unlink")


async def test_e9_e11_files_outside_and_protected_paths_inside_the_workspace(ws):
    work = ws[0]
    with tempfile.TemporaryDirectory(prefix="sandmux-esc-e9-") as h:
        h = pathlib.Path(os.path.realpath(h))
        home = h / "home"
        outside = {
            h / "secret.txt": "E9-SECRET-CANARY\n",
            home / ".bashrc": "# host bashrc\n",
            home / ".ssh" / "config": "Host *\n",
            home / ".config" / "systemd" / "user" / "x.service": "[Service]\n",
            home / ".config" / "autostart" / "x.desktop": "[Desktop Entry]\n",
        }
        protected = {
            work / ".git" / "hooks" / "pre-commit": "#!/bin/sh\nexit 0\n",
            work / ".git" / "config": "[core]\n",
            work / ".envrc": "export A=1\n",
            work / ".vscode" / "tasks.json": "{}\n",
            work / ".bashrc": "# ws bashrc\n",
            work / ".mcp.json": "{}\n",
            work / ".claude" / "settings.json": "{}\n",
            work / ".ssh" / "config": "Host *\n",
        }
        for p, t in {**outside, **protected}.items():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(t)
        via_dotdot = work / ".." / h.name / "secret.txt"
        existing = [str(p) for p in [*outside, *protected, via_dotdot]]
        create = [str(work / ".git" / "hooks" / "post-checkout"), str(work / ".vscode" / "new.json"), str(work / ".claude" / "CLAUDE.md"),
                  str(work / ".ssh" / "authorized_keys"), str(h / "created.txt"), str(home / ".profile")]
        snap = lambda: {p: mtime_and_hash(p) for p in [*outside, *protected, *map(pathlib.Path, create)]}
        before = snap()
        async with launch(ws, env={"HOME": str(home)}) as c:
            r, res = await run_probe(c, ws, "e9", E9_PROBE, json.dumps(existing), json.dumps(create), work)
            # The sandbox's own ~ is a tmpfs: writes there land in a sandbox-only copy.
            t = await call(c, "run_command", {"command": "echo sandbox-only >> ~/.bashrc; cat ~/.bashrc; echo HOME=$HOME"})
        assert "sandbox-only" in t["output"] and f"HOME={home}" not in t["output"], t
        assert "E9-SECRET-CANARY" not in json.dumps(r) + json.dumps(res)
        for p in [*outside, via_dotdot]:
            assert all(v == "ENOENT" for v in r[f"e:{p}"].values()), (p, r[f"e:{p}"])
        for p in protected:
            got = r[f"e:{p}"]
            assert got["read"].startswith("ok:"), (p, got)  # visible, read-only
            assert got["append"] == "EROFS" and got["truncate"] == "EROFS" and got["chmod"] == "EROFS", (p, got)
            assert got["link"] in ("EXDEV", "EROFS") and got["symlink_replace"] in ("EROFS", "EBUSY") and got["unlink"] in ("EROFS", "EBUSY"), (p, got)
        for p in create:
            assert r[f"c:{p}"] == ("ENOENT" if p.startswith(str(h)) else "EROFS"), (p, r[f"c:{p}"])
        assert snap() == before, "a host file or a protected path changed"
        assert not list(work.glob("hardlink-*")) and not list(work.rglob("*.sandmux-new"))
        # Positive control (b): a profile that makes the host directory writable
        # and protects nothing; the same probe changes every file.
        prof = profile(ws, "e9-open", chain(add_read_write(h), UNGUARDED))
        async with launch(ws, "-p", prof, env={"HOME": str(home)}) as c:
            r, _ = await run_probe(c, ws, "e9", E9_PROBE, json.dumps(existing), json.dumps(create), work)
        assert r[f"e:{h / 'secret.txt'}"]["read"] == "ok:E9-SECRET-CANARY\n", r
        after = snap()
        assert all(after[p] != before[p] for p in before), [p for p in before if after[p] == before[p]]


# ---------------------------------------------------------------- E12

E12_PROBE = r'''
secret = sys.argv[2]
links, opened = {}, {}
for pid in [d for d in os.listdir("/proc") if d.isdigit()]:
    links["/proc/%s/cwd" % pid] = tr(lambda: os.readlink("/proc/%s/cwd" % pid))
    fds = tr(lambda: os.listdir("/proc/%s/fd" % pid))
    if isinstance(fds, str):
        links["/proc/%s/fd" % pid] = fds
        continue
    for fd in fds:
        links["/proc/%s/fd/%s" % (pid, fd)] = tr(lambda: os.readlink("/proc/%s/fd/%s" % (pid, fd)))
for fd in range(3, 256):
    try:
        os.fstat(fd)
    except OSError:
        continue
    opened[fd] = tr(lambda: open(os.open(secret, os.O_RDONLY, dir_fd=fd)).read())
R["links"] = links
R["openat"] = opened
R["cwd_up"] = tr(lambda: sorted(os.listdir("/proc/self/cwd/../..")))
R["root"] = sorted(os.listdir("/"))
'''


async def test_e12_no_leaked_fds_or_cwd(ws):
    with tempfile.TemporaryDirectory(prefix="sandmux-esc-e12-") as h:
        h = pathlib.Path(os.path.realpath(h))
        (h / "secret.txt").write_text("E12-SECRET")
        # sandmux is started with a host directory and a host file open on fds
        # 47 and 48 (no close-on-exec) and that directory as its cwd.
        wrapper = (
            "import os,sys\n"
            "os.dup2(os.open(sys.argv[1],os.O_RDONLY|os.O_DIRECTORY),47)\n"
            "os.dup2(os.open(sys.argv[1]+'/secret.txt',os.O_RDONLY),48)\n"
            "os.execv(sys.argv[2],sys.argv[2:])\n"
        )
        async with launch(ws, *ALL, wrap=(wrapper, [str(h)]), cwd=str(h)) as c:
            pid = serve_pids(ws[0])[0]
            assert os.readlink(f"/proc/{pid}/fd/47") == str(h) and os.readlink(f"/proc/{pid}/cwd") == str(h)
            await call(c, "split_window", {})
            r, res = await run_probe(c, ws, "e12", E12_PROBE, "secret.txt")
        dump = json.dumps(r) + json.dumps(res)
        assert "E12-SECRET" not in dump and str(h) not in dump, dump[:2000]
        # No inherited fd is open in the pane (so nothing to openat through).
        assert all(v in ("ENOTDIR", "ENOENT", "EACCES") for v in r["openat"].values()), r["openat"]
        targets = [v for v in r["links"].values() if not v.startswith("E")]
        assert targets, r
        for t in targets:
            assert re.match(r"^(/dev/pts/\d+|/dev/null|/dev/ptmx|/dev/urandom|/dev/tty|pipe:\[\d+\]|socket:\[\d+\]|anon_inode:.*|/proc(/.*)?|" + re.escape(str(ws[0])) + r"(/.*)?|/|/home/sandmux)$", t), t
        assert r["cwd_up"] == r["root"], r  # ../.. from the workspace is the sandbox root
        assert "run" in r["root"] and "sandmux-mcp-host" not in json.dumps(r["root"])
        # Positive control (a): the same probe on the host, given the same
        # leaked fds and cwd, reads the secret and names the host directory.
        d = os.open(h, os.O_RDONLY | os.O_DIRECTORY)
        f = os.open(h / "secret.txt", os.O_RDONLY)
        try:
            os.dup2(d, 47)
            os.dup2(f, 48)
            hp = host_probe(ws, "e12", E12_PROBE, "secret.txt", pass_fds=(47, 48), cwd=str(h))
        finally:
            for x in (d, f, 47, 48):
                os.close(x)
        assert "E12-SECRET" in hp["openat"].values(), hp["openat"]
        assert str(h) in json.dumps(hp["links"])


# ---------------------------------------------------------------- E13

E13_PROBE = r'''
targets = [int(x) for x in sys.argv[2].split(",")]
for pid in targets:
    d = "/proc/%d/" % pid
    R["%d:environ" % pid] = tr(lambda: "ok:" + open(d + "environ", "rb").read().decode("latin1"))
    R["%d:root" % pid] = tr(lambda: "ok:" + os.readlink(d + "root"))
    R["%d:cwd" % pid] = tr(lambda: "ok:" + os.readlink(d + "cwd"))
    R["%d:exe" % pid] = tr(lambda: "ok:" + os.readlink(d + "exe"))
    fds = tr(lambda: os.listdir(d + "fd"))
    R["%d:fd_list" % pid] = fds if isinstance(fds, str) else "ok:%d" % len(fds)
    R["%d:fd" % pid] = sorted(set(tr(lambda: "ok:" + os.readlink(d + "fd/" + f)) for f in fds)) if not isinstance(fds, str) else fds
    R["%d:mem" % pid] = tr(lambda: os.close(os.open(d + "mem", os.O_RDONLY)) or "ok")
    R["%d:exe_w" % pid] = tr(lambda: os.close(os.open(d + "exe", os.O_WRONLY)) or "ok")
for p in sys.argv[3].split(","):
    def rw():
        v = open(p).read()
        with open(p, "w") as f:
            f.write(v)  # writes back the value it read: harmless where it works
        return "ok"
    R["w:" + p] = tr(rw)
def sysrq():
    os.close(os.open("/proc/sysrq-trigger", os.O_WRONLY))  # opened, nothing written
    return "ok"
R["w:/proc/sysrq-trigger"] = tr(sysrq)
R["mountinfo_lines"] = len(open("/proc/self/mountinfo").read().splitlines())
'''

SYSCTLS = "/proc/sys/kernel/printk_ratelimit,/proc/sys/kernel/hostname"


async def test_e13_proc_of_pid1_and_server_and_proc_writes(ws):
    canary = f"e13-canary-{nonce()}"
    async with launch(ws, env={"AWS_SECRET_ACCESS_KEY": canary}) as c:
        server = (await call(c, "display_message", {"format_string": "#{pid}"}))["text"]
        r, res = await run_probe(c, ws, "e13", E13_PROBE, f"1,{server}", SYSCTLS)
    assert canary not in json.dumps(r) + json.dumps(res)
    for pid in (1, int(server)):
        for k in ("environ", "root", "cwd", "exe", "mem", "exe_w"):
            assert r[f"{pid}:{k}"] == "EACCES", (pid, k, r)
        # The fd directory may be listed (same uid), but no entry resolves.
        assert r[f"{pid}:fd"] in ("EACCES", ["EACCES"]), (pid, r)
    for p in SYSCTLS.split(","):
        assert r[f"w:{p}"] == "EROFS", (p, r)
    sysrq_exists = os.path.exists("/proc/sysrq-trigger")
    assert r["w:/proc/sysrq-trigger"] == ("EROFS" if sysrq_exists else "ENOENT"), r
    # Positive control (a): the same probe on the host, aimed at a host process
    # holding the canary, reads its environ, root and fds; as root it also
    # writes the sysctls (the value they already had) and opens sysrq-trigger.
    victim = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AWS_SECRET_ACCESS_KEY": canary})
    try:
        h = host_probe(ws, "e13", E13_PROBE, str(victim.pid), SYSCTLS)
    finally:
        victim.kill()
        victim.wait()
    assert canary in h[f"{victim.pid}:environ"] and h[f"{victim.pid}:root"] == "ok:/" and h[f"{victim.pid}:mem"] == "ok", h
    assert any(x.startswith("ok:") for x in h[f"{victim.pid}:fd"]), h
    if UID == 0:
        assert h["w:/proc/sys/kernel/printk_ratelimit"] == "ok", h
        if sysrq_exists:
            assert h["w:/proc/sysrq-trigger"] == "ok", h


# ---------------------------------------------------------------- E15 / E25

E15_PROBE = r'''
def status(text):
    return {l.split(":")[0]: l.split(":", 1)[1].strip() for l in text.splitlines()
            if l.split(":")[0] in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters", "Uid")}
R["self"] = status(open("/proc/self/status").read())
R["child"] = status(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)
for pid in sys.argv[3].split(","):
    if pid:
        R["pid:" + pid] = tr(lambda: status(open("/proc/%s/status" % pid).read()))
suid = sys.argv[2]
if suid.startswith("plant:"):
    suid = suid[6:]
    import shutil
    shutil.copy("/usr/bin/id", suid)
    R["suid_chmod"] = tr(lambda: os.chmod(suid, 0o4755))
R["suid_mode"] = oct(os.stat(suid).st_mode)
R["suid_id"] = subprocess.run([suid], capture_output=True, text=True).stdout.strip()
R["su"] = subprocess.run(["su", "-c", "id -u", "root"], capture_output=True, text=True, stdin=subprocess.DEVNULL).returncode
R["nosuid_missing"] = [l.split()[4] for l in open("/proc/self/mountinfo") if "nosuid" not in l.split()[5]]
R["euid"] = os.geteuid()
'''


async def test_e15_e25_no_privilege_from_setuid_and_no_capabilities(ws):
    async with launch(ws) as c:
        server = (await call(c, "display_message", {"format_string": "#{pid}"}))["text"]
        r, _ = await run_probe(c, ws, "e15", E15_PROBE, "plant:/tmp/suid-id", f"1,{server}")
    for who in ("self", "child", f"pid:{server}", "pid:1"):
        st = r[who]
        assert all(st[k] == "0000000000000000" for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), (who, st)
        assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "2", (who, st)
    # No set-ID bit is set inside (P8; tests/escape.rs tries every way) ...
    assert r["suid_chmod"] == "EPERM" and r["suid_mode"] == "0o100755", r
    assert "euid=" not in r["suid_id"] and r["suid_id"].startswith("uid=1000"), r
    # ... and the set-user-ID root files of the view raise nothing.
    assert r["su"] != 0 and r["euid"] == 1000, r
    assert r["nosuid_missing"] == [], r  # every mount in the view is nosuid
    # Positive control (a), capabilities: the same probe on the host reads a
    # non-empty capability set (at least the bounding set).
    h = host_probe(ws, "e15", E15_PROBE, "/usr/bin/id", "")
    if all(h["self"][k] == "0000000000000000" for k in ("CapBnd", "CapEff", "CapPrm")):
        pytest.skip("the host's own bounding set is empty: no capability to lose")
    assert h["self"]["NoNewPrivs"] == "0"


def test_e15_control_setuid_root_copy_raises_euid_on_the_host(tmp_path):
    """Positive control (a) for the planted setuid file: outside the sandbox,
    the probe's check does see a setuid-root copy of `id` raise the euid."""
    if UID != 0:
        pytest.skip("only root can plant a setuid-root file on the host")
    d = pathlib.Path(tempfile.mkdtemp(prefix="sandmux-esc-suid-"))
    try:
        if os.statvfs(d).f_flag & os.ST_NOSUID:
            pytest.skip(f"{d} is on a nosuid mount on this host")
        os.chmod(d, 0o755)
        (d / "probe.py").write_text(PREAMBLE + E15_PROBE + "\ndone()\n")
        out = d / "out"
        subprocess.run(["cp", "/usr/bin/id", str(d / "suid-id")], check=True)
        os.chmod(d / "suid-id", 0o4755)
        os.chmod(d, 0o777)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", HOST_PY, str(d / "probe.py"), str(out), str(d / "suid-id"), ""],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        h = json.loads(out.read_text())
        assert "euid=0" in h["suid_id"] and h["euid"] == 65534, h
    finally:
        subprocess.run(["rm", "-rf", str(d)])


# ---------------------------------------------------------------- E16

E16_PROBE = r'''
t_tmpfs, src, t_bind, t_umount, t_remount = sys.argv[2:7]
for d in (t_tmpfs, t_bind):
    os.makedirs(d, exist_ok=True)
before = open("/proc/self/mountinfo").read()
R["mount_tmpfs"] = sc(165, b"none", t_tmpfs.encode(), b"tmpfs", 0, None)
R["mount_bind"] = sc(165, src.encode(), t_bind.encode(), None, 4096, None)  # MS_BIND
R["umount2"] = sc(166, t_umount.encode(), 0)
R["umount2_detach"] = sc(166, t_umount.encode(), 2)
R["remount_rw"] = sc(165, None, t_remount.encode(), None, 32 | 4096, None)  # MS_REMOUNT|MS_BIND
fd = sc(430, b"tmpfs", 0)  # fsopen
R["fsopen"] = fd
if isinstance(fd, int):
    os.close(fd)
fd = sc(428, -100, t_remount.encode(), 1)  # open_tree(OPEN_TREE_CLONE)
R["open_tree"] = fd
if isinstance(fd, int):
    os.close(fd)
R["move_mount"] = sc(429, -100, t_umount.encode(), -100, t_bind.encode(), 0)
R["mount_setattr"] = sc(442, -100, t_remount.encode(), 0, None, 0)
R["fspick"] = sc(433, -100, t_remount.encode(), 0)
m = subprocess.run(["mount", "-t", "tmpfs", "none", t_tmpfs], capture_output=True, text=True)
R["mount_cmd"] = [m.returncode, m.stderr.strip()]
R["mountinfo_unchanged"] = open("/proc/self/mountinfo").read() == before
'''


def host_mountinfo():
    return pathlib.Path("/proc/self/mountinfo").read_text()


async def test_e16_mount_manipulation(ws):
    before = host_mountinfo()
    async with launch(ws) as c:
        r, _ = await run_probe(c, ws, "e16", E16_PROBE, "/tmp/e16-tmpfs", ws[0], "/tmp/e16-bind", "/etc/shadow", "/usr")
    for k in ("mount_tmpfs", "mount_bind", "umount2", "umount2_detach", "remount_rw", "fsopen", "open_tree", "move_mount", "mount_setattr", "fspick"):
        assert r[k] == "EPERM", (k, r)
    assert r["mount_cmd"][0] != 0 and ("permission denied" in r["mount_cmd"][1].lower() or "must be superuser" in r["mount_cmd"][1]), r
    assert r["mountinfo_unchanged"] is True, r
    assert host_mountinfo() == before


def test_e16_control_the_probe_mounts_on_the_host(tmp_path):
    """Positive control (a) for E16: the same probe, run on the host as root
    against host paths, does change the host's mountinfo."""
    if UID != 0:
        pytest.skip("only root can mount on the host")
    d = pathlib.Path(os.path.realpath(tmp_path))
    (d / "src").mkdir()
    (d / "none").mkdir()
    before = host_mountinfo()
    try:
        h = host_probe((d, d), "e16", E16_PROBE, d / "m", d / "src", d / "b", d / "none", d / "none")
        after = host_mountinfo()
    finally:
        for t in (d / "m", d / "m", d / "b"):
            subprocess.run(["umount", "-l", str(t)], capture_output=True)
    assert h["mount_tmpfs"] == 0 and h["mount_bind"] == 0 and h["mountinfo_unchanged"] is False, h
    assert after != before and f" {d / 'm'} " in after


# ---------------------------------------------------------------- E20

E20_PROBE = r'''
ip, tport, uport = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.socket()
s.settimeout(3)
def tcp():
    s.connect((ip, tport))
    s.sendall(b"E20-TCP")
    return 0
R["tcp"] = tr(tcp)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
R["udp"] = tr(lambda: u.sendto(b"E20-UDP", (ip, uport)) and 0)
R["udp_dns"] = tr(lambda: u.sendto(b"\0" * 12, ("192.0.2.53", 53)) and 0)
for name, fam, typ, proto in [("raw", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                              ("raw6", socket.AF_INET6, socket.SOCK_RAW, 58),
                              ("packet", 17, socket.SOCK_RAW, 0x0300), ("packet_dgram", 17, socket.SOCK_DGRAM, 0x0300),
                              ("icmp", socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
                              ("mptcp", socket.AF_INET, socket.SOCK_STREAM, 262), ("sctp", socket.AF_INET, socket.SOCK_STREAM, 132),
                              ("vsock", 40, socket.SOCK_STREAM, 0)]:
    def mk():
        x = socket.socket(fam, typ, proto)
        if name == "icmp":
            x.sendto(b"\x08\0\0\0\0\0\0\0", (ip, 0))
        return 0
    R["sock:" + name] = tr(mk)
R["io_uring_setup"] = sc(425, 1, ctypes.create_string_buffer(120))
'''


async def test_e20_no_egress_in_none_mode(ws):
    ip = host_ipv4()
    t = socket.socket()
    t.bind((ip, 0))
    t.listen(4)
    t.setblocking(False)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((ip, 0))
    u.setblocking(False)

    def seen():
        got = []
        with contextlib.suppress(BlockingIOError):
            conn = t.accept()[0]
            conn.settimeout(1)
            got.append(conn.recv(16))
            conn.close()
        with contextlib.suppress(BlockingIOError):
            got.append(u.recv(16))
        return got

    tport, uport = t.getsockname()[1], u.getsockname()[1]
    try:
        async with launch(ws) as c:
            r, _ = await run_probe(c, ws, "e20", E20_PROBE, ip, tport, uport)
        assert r["tcp"] == "ENETUNREACH" and r["udp"] == "ENETUNREACH" and r["udp_dns"] == "ENETUNREACH", r
        for k in ("raw", "raw6", "packet", "packet_dgram", "mptcp", "sctp", "vsock", "io_uring_setup"):
            assert r["sock:" + k if k != "io_uring_setup" else k] == "EPERM", (k, r)
        assert r["sock:icmp"] in ("EACCES", "ENETUNREACH"), r  # ping_group_range, or no route
        assert seen() == [], "a host listener saw traffic"
        # Positive control (b): host network mode with the listener's port
        # allowed; the same probe reaches both listeners.
        prof = profile(ws, "e20-open", host_net(tport))
        async with launch(ws, "-p", prof) as c:
            r, _ = await run_probe(c, ws, "e20", E20_PROBE, ip, tport, uport)
        assert r["tcp"] == 0 and r["udp"] == 0, r
        time.sleep(0.1)
        assert sorted(seen()) == [b"E20-TCP", b"E20-UDP"]
        # Raw and packet sockets still need a capability nobody inside has.
        assert r["sock:raw"] == "EPERM" and r["sock:packet"] == "EPERM", r
    finally:
        t.close()
        u.close()


def test_e20_control_raw_and_packet_sockets_on_the_host(tmp_path):
    """Positive control (a) for the raw/packet part of E20: the same probe on
    the host as root creates both (so EPERM inside is the sandbox's doing)."""
    if UID != 0:
        pytest.skip("raw and packet sockets need CAP_NET_RAW on the host")
    d = pathlib.Path(os.path.realpath(tmp_path))
    h = host_probe((d, d), "e20", E20_PROBE, "127.0.0.1", 9, 9)
    assert h["sock:raw"] == 0 and h["sock:packet"] == 0, h


# ---------------------------------------------------------------- E23

E23_PROBE = r'''
R["open_pid1_userns"] = tr(lambda: os.open("/proc/1/ns/user", os.O_RDONLY) and 0)
own = os.open("/proc/self/ns/uts", os.O_RDONLY)
R["setns_own_uts"] = sc(308, own, 0)
R["clone3"] = sc(435, 0, 0)
u = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
R["unshare_cmd"] = [u.returncode, u.stderr.strip()]
R["clone_newuser"] = sc(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER|SIGCHLD)
if R["clone_newuser"] == 0:
    os._exit(0)
if isinstance(R["clone_newuser"], int):
    os.waitpid(R["clone_newuser"], 0)
    R["clone_newuser"] = 0
R["unshare_newns"] = sc(272, 0x00020000)
R["unshare_newuser"] = sc(272, 0x10000000)
'''


async def test_e23_no_nested_user_namespaces(ws):
    async with launch(ws) as c:
        r, _ = await run_probe(c, ws, "e23", E23_PROBE)
    assert r["unshare_cmd"][0] != 0 and "Operation not permitted" in r["unshare_cmd"][1], r
    assert r["clone_newuser"] == "EPERM" and r["unshare_newuser"] == "EPERM" and r["unshare_newns"] == "EPERM", r
    assert r["clone3"] == "ENOSYS", r  # so libc falls back to the filtered clone
    assert r["setns_own_uts"] == "EPERM" and r["open_pid1_userns"] == "EACCES", r
    # Positive control (a): the same probe on the host makes user namespaces.
    h = host_probe(ws, "e23", E23_PROBE)
    if h["unshare_cmd"][0] != 0:
        pytest.skip(f"the host refuses user namespaces to this uid: {h['unshare_cmd']}")
    assert h["clone_newuser"] == 0 and h["unshare_newuser"] == 0 and h["clone3"] != "ENOSYS", h


# ---------------------------------------------------------------- E31

async def test_e31_launch_environment_secrets_never_appear(ws):
    canaries = {"AWS_SECRET_ACCESS_KEY": f"aws-{nonce()}", "GITHUB_TOKEN": f"ghp-{nonce()}", "OPENAI_API_KEY": f"sk-{nonce()}",
                "MY_APP_PASSWORD": f"pw-{nonce()}", "CANARY_KEPT": f"kept-{nonce()}"}
    env_cmd = "env; cat /proc/1/environ; echo; cat /proc/2/environ; echo; tr '\\0' '\\n' < /proc/$PPID/environ"
    async with launch(ws, *ALL, env=canaries) as c:
        s = await call(c, "create_session", {"session_name": "e31"})
        outs = [await call(c, "run_command", {"pane_id": s["pane_id"], "command": env_cmd})]
        outs.append(await call(c, "show_environment"))
        outs.append(await call(c, "show_environment", {"session_name": "e31"}))
        await call(c, "create_window", {"session_name": "e31", "shell": f"env > {ws[0] / 'e31-window.env'}; sleep 30"})
        await call(c, "split_window", {"pane_id": s["pane_id"], "shell": f"env > {ws[0] / 'e31-split.env'}; sleep 30"})
        files = [wait_file(ws[0] / "e31-window.env", needle="PATH="), wait_file(ws[0] / "e31-split.env", needle="PATH=")]
    everything = json.dumps(outs) + "".join(files) + (ws[1] / "audit.jsonl").read_text()
    for k, v in canaries.items():
        assert v not in everything, f"{k} leaked"
        assert k not in "".join(files) and k not in json.dumps(outs[1:]), f"{k} present"
    assert "Permission denied" in outs[0]["output"], outs[0]  # /proc/1 and /proc/2 environ
    allowed = {"PATH", "TERM", "LANG", "LANGUAGE", "TZ", "COLORTERM", "HOME", "SHELL", "USER", "LOGNAME", "HISTCONTROL", "PWD", "SHLVL", "_", "OLDPWD"} | GATE_SHELL_ENV
    for f in files:
        # (Lines of an exported function's body are not variables.)
        names = {l.split("=", 1)[0] for l in f.splitlines() if "=" in l and not l[:1].isspace()}
        assert names <= allowed | {n for n in names if n.startswith("LC_")}, names - allowed
    # Positive control (b): a profile keeping CANARY_KEPT; the same calls show it.
    prof = profile(ws, "e31-keep", lambda t: t.replace('keep = ["TERM"', 'keep = ["CANARY_KEPT", "TERM"'))
    async with launch(ws, *ALL, "-p", prof, env=canaries) as c:
        s = await call(c, "create_session", {"session_name": "e31"})
        out = await call(c, "run_command", {"pane_id": s["pane_id"], "command": env_cmd})
        shown = await call(c, "show_environment")
    assert canaries["CANARY_KEPT"] in out["output"] and canaries["CANARY_KEPT"] in json.dumps(shown), (out, shown)
    assert canaries["GITHUB_TOKEN"] not in out["output"]


# ---------------------------------------------------------------- T1

T1_PROBE = r'''
sock, name, server, top = sys.argv[2:6]
t = subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", name], capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "TMUX"})
R["tmux"] = [t.returncode, t.stderr.strip()]
s = socket.socket(socket.AF_UNIX)
R["connect"] = tr(lambda: s.connect(sock) or 0)
R["listdir"] = tr(lambda: os.listdir(os.path.dirname(sock)) and 0)
found = []
for root, dirs, files in os.walk(top):
    if root in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    for f in files:
        try:
            if stat.S_ISSOCK(os.lstat(os.path.join(root, f)).st_mode):
                found.append(os.path.join(root, f))
        except OSError:
            pass
R["sockets"] = found
for k in ("root", "cwd"):
    R["server_" + k] = tr(lambda: os.readlink("/proc/%s/%s" % (server, k)) and 0)
fds = tr(lambda: os.listdir("/proc/%s/fd" % server))
R["server_fd"] = fds if isinstance(fds, str) else sorted(set(tr(lambda: os.readlink("/proc/%s/fd/%s" % (server, f))) for f in fds))
R["TMUX"] = os.environ.get("TMUX")
'''


async def test_t1_own_tmux_socket_unreachable_from_panes(ws):
    name = f"t1-{nonce()}"
    async with launch(ws, *ALL) as c:
        pid = serve_pids(ws[0])[0]
        sock = runtime_dir_of(pid) / "sock" / "tmux.sock"
        server = (await call(c, "display_message", {"format_string": "#{pid}"}))["text"]
        state = lambda: [tmux_host(sock, *a).stdout for a in (["list-sessions", "-F", "#{session_name}"], ["list-clients", "-F", "#{client_name} #{client_flags}"], ["show-hooks", "-g"])]
        before = state()
        r, _ = await run_probe(c, ws, "t1", T1_PROBE, "/run/sandmux/sock/tmux.sock", name, server, "/")
        sp = await call(c, "split_window", {})
        r2, _ = await run_probe(c, ws, "t1b", T1_PROBE, "/run/sandmux/sock/tmux.sock", name, server, "/", pane_id=sp["pane_id"])
        after = state()
        for x in (r, r2):
            assert x["tmux"][0] != 0, x
            assert x["connect"] == "EACCES" and x["listdir"] == "EACCES", x
            assert x["server_root"] == "EACCES" and x["server_cwd"] == "EACCES" and x["server_fd"] in ("EACCES", ["EACCES"]), x
            assert x["TMUX"] is None and not any("tmux" in s for s in x["sockets"]), x
        assert after == before and name not in after[0]
        assert before[1] and all("control-mode" in l for l in before[1].splitlines()), before[1]  # only sandmux's own control clients
        # Positive control (a): the same probe on the host, given the host path
        # of that socket and the server's host pid, creates a session there
        # (its socket search walks the runtime directory, not the whole host).
        h = host_probe(ws, "t1", T1_PROBE, sock, name, tmux_server_pid(pid), sock.parent.parent)
        assert h["tmux"][0] == 0 and h["connect"] == 0 and str(sock) in h["sockets"] and h["server_root"] == 0, h
        assert any(f.startswith("socket:") for f in h["server_fd"]), h
        assert name in state()[0]
        tmux_host(sock, "kill-session", "-t", name)


# ---------------------------------------------------------------- T2

T2_PROBE = r'''
sock, tmpdir, uid, name = sys.argv[2:6]
def t(*a, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(["tmux", *a], capture_output=True, text=True, env=e, timeout=10)
    return [p.returncode, p.stderr.strip()[:200]]
# Listing commands never start a server; new-session -S would (a fresh one,
# inside the sandbox) if the socket's directory existed in the view.
R["ls"] = t("ls")
R["L_default"] = t("-L", "default", "list-sessions")
R["S_ls"] = t("-S", sock, "list-sessions")
R["tmpdir"] = t("list-sessions", env={"TMUX_TMPDIR": tmpdir})
R["S_new"] = t("-S", sock, "new-session", "-d", "-s", name + "-S")
for p in (sock, "/tmp/tmux-%s/default" % uid):
    s = socket.socket(socket.AF_UNIX)
    R["connect:" + p] = tr(lambda: s.connect(p) or 0)
R["env"] = sorted(k for k in os.environ if k.startswith("TMUX"))
'''


async def test_t2_users_own_tmux_server_unreachable(ws):
    with tempfile.TemporaryDirectory(prefix="sandmux-esc-t2-") as d:
        d = os.path.realpath(d)
        henv = {**{k: v for k, v in os.environ.items() if not k.startswith("TMUX")}, "TMUX_TMPDIR": d,
                # The user's server takes its default-shell from SHELL; without it
                # tmux falls back to the passwd shell (nologin for 65534).
                "SHELL": "/bin/sh"}

        def user_tmux(*a):
            return subprocess.run(["tmux", *a], capture_output=True, text=True, env=henv, timeout=10)

        assert user_tmux("-f", "/dev/null", "new-session", "-d", "-s", "usersess", "-x", "80", "-y", "24", "sleep 3600").returncode == 0
        try:
            sock = user_tmux("display-message", "-p", "#{socket_path}").stdout.strip()
            assert sock == f"{d}/tmux-{UID}/default", sock
            server_pid = user_tmux("display-message", "-p", "#{pid}").stdout.strip()

            def state():
                return [user_tmux(*a).stdout for a in (["list-sessions", "-F", "#{session_name} #{session_windows}"], ["list-clients"],
                                                       ["list-windows", "-a"], ["show-options", "-g"], ["show-options", "-s"],
                                                       ["show-options", "-gw"], ["show-hooks", "-g"])]

            before = state()
            name = f"pwn{nonce()}"
            env = {"TMUX": f"{sock},{server_pid},0", "TMUX_PANE": "%0", "TMUX_TMPDIR": d}
            async with launch(ws, env=env) as c:
                r, _ = await run_probe(c, ws, "t2", T2_PROBE, sock, d, UID, name)
            for k in ("ls", "L_default", "S_ls", "tmpdir"):
                assert r[k][0] == 1 and ("no server running" in r[k][1] or "error connecting" in r[k][1]), (k, r)
            assert "error creating" in r["S_new"][1] and "No such file or directory" in r["S_new"][1], r
            assert r[f"connect:{sock}"] == "ENOENT" and r[f"connect:/tmp/tmux-{UID}/default"] == "ENOENT", r
            assert r["env"] == [], r
            assert state() == before, "the user's tmux server changed"
            # Positive control (b): a profile that binds TMUX_TMPDIR; the same
            # probe then reaches the user's server and the diff shows it.
            prof = profile(ws, "t2-open", add_read_write(d))
            async with launch(ws, "-p", prof, env=env) as c:
                r, _ = await run_probe(c, ws, "t2", T2_PROBE, sock, d, UID, name)
            assert r["S_ls"][0] == 0 and r["S_new"] == [0, ""] and r[f"connect:{sock}"] == 0, r
            after = state()
            assert after != before and f"{name}-S 1" in after[0], after[0]
        finally:
            user_tmux("kill-server")


# ---------------------------------------------------------------- T5

T5_PROBE = r'''
server = int(sys.argv[2])
import signal
R["ptrace_server"] = sc(101, 16, server, 0, 0)
R["server_mem"] = tr(lambda: os.close(os.open("/proc/%d/mem" % server, os.O_RDWR)) or 0)
me = {os.getpid(), os.getppid()}
R["reachable"] = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in me and tr(lambda: os.kill(int(p), 0) or 0) == 0]
# Findings are written after every signal: where a signal lands, the pane may not live to the end.
for target, s in [(server, "SIGSTOP"), (1, "SIGSTOP"), (server, "SIGTERM"), (1, "SIGTERM"), (server, "SIGKILL"), (1, "SIGKILL")]:
    R["kill:%d:%s" % (target, s)] = tr(lambda: os.kill(target, getattr(signal, s)) or 0)
    done()
    time.sleep(0.05)
'''


async def test_t5_pane_cannot_signal_or_stop_server_or_pid1(ws):
    async with launch(ws, *ALL) as c:
        pid = serve_pids(ws[0])[0]
        host_server = tmux_server_pid(pid)
        server = int((await call(c, "display_message", {"format_string": "#{pid}"}))["text"])
        r, _ = await run_probe(c, ws, "t5", T5_PROBE, server)
        await call(c, "create_window", {"shell": "sleep 0.3; kill -STOP 1; kill -STOP -1; kill -KILL -1"})
        await anyio.sleep(0.5)
        # The server still answers, within a bound, and nothing was stopped.
        t0 = time.monotonic()
        assert (await call(c, "run_command", {"command": "echo alive"}))["output"] == "alive"
        assert time.monotonic() - t0 < 5
        assert (await call(c, "get_server_info"))["alive"] is True
        assert alive(host_server) and proc_state(host_server) != "T"
        init = [k for k in descendants(pid) if pathlib.Path(f"/proc/{k}/comm").read_text().strip().startswith("sandmux")]
        assert init and all(alive(k) and proc_state(k) != "T" for k in init)
    assert r["ptrace_server"] == "EPERM" and r["server_mem"] == "EACCES", r
    assert all(r[k] == "EPERM" for k in r if k.startswith("kill:")), r
    assert 1 not in r["reachable"] and server not in r["reachable"], r
    # Positive control (b): Landlock pinned to ABI 5 with the signal scope
    # dropped (explicit opt-in). The same probe stops and kills the server, and
    # the host sees it die.
    prof = profile(ws, "t5-open", NO_SCOPE)
    host_server = server = None
    (ws[0] / "out_t5.json").unlink()
    with contextlib.suppress(Exception):  # the instance ends with its server
        async with launch(ws, *ALL, "-p", prof) as c:
            pid = serve_pids(ws[0])[0]
            host_server = tmux_server_pid(pid)
            server = int((await call(c, "display_message", {"format_string": "#{pid}"}))["text"])
            p = write_probe(ws, "t5", T5_PROBE)
            out = ws[0] / "out_t5.json"
            await c.call_tool("send_keys", {"text": f"python3 {p} {out} {server}"})
            t0 = time.monotonic()
            while alive(host_server) and time.monotonic() - t0 < 10:
                await anyio.sleep(0.05)
    assert host_server and not alive(host_server), "the control could not kill the server: the probe is vacuous"
    h = json.loads(wait_file(ws[0] / "out_t5.json"))
    assert h["kill:%d:SIGSTOP" % server] == 0, h


# ---------------------------------------------------------------- T6

T6_PROBE = r'''
st = {l.split(":")[0]: l.split(":", 1)[1].strip() for l in open("/proc/self/status")}
R.update({k: st[k] for k in ("Seccomp", "Seccomp_filters", "NoNewPrivs", "CapEff", "CapBnd")})
R["sock_dir"] = tr(lambda: os.listdir("/run/sandmux/sock") and 0)
R["sock_stat"] = tr(lambda: os.stat("/run/sandmux/sock/tmux.sock") and 0)
R["env"] = sorted(os.environ)
R["signal_server"] = tr(lambda: os.kill(int(sys.argv[2]), 0) or 0)
R["tag"] = sys.argv[3]
'''


async def test_t6_every_spawn_path_runs_through_the_gate(ws):
    canary = f"t6-{nonce()}"
    env = {"TMUX": "/tmp/tmux-0/default,1,0", "TMUX_PANE": "%0", "LD_PRELOAD": "", "GLIBC_TUNABLES": "glibc.malloc.check=3",
           "SSH_AUTH_SOCK": "/tmp/agent", "T6_SECRET": canary}
    async with launch(ws, *ALL, env=env) as c:
        server = (await call(c, "display_message", {"format_string": "#{pid}"}))["text"]
        p = write_probe(ws, "t6", T6_PROBE)

        def cmd(tag):
            return f"python3 {p} {ws[0] / f'out_t6_{tag}.json'} {server} {tag}"

        s = await call(c, "create_session", {"session_name": "t6"})
        await call(c, "run_command", {"pane_id": s["pane_id"], "command": cmd("create_session")})
        await call(c, "create_window", {"session_name": "t6", "shell": cmd("create_window_shell") + "; sleep 30"})
        w = await call(c, "create_window", {"session_name": "t6"})
        await call(c, "send_keys", {"pane_id": w["pane_id"], "text": cmd("create_window_keys")})
        wait_file(ws[0] / "out_t6_create_window_keys.json", needle="}")
        await call(c, "split_window", {"pane_id": s["pane_id"], "shell": cmd("split_window_shell") + "; sleep 30"})
        sp = await call(c, "split_window", {"pane_id": s["pane_id"]})
        await call(c, "paste_text", {"pane_id": sp["pane_id"], "text": cmd("split_window_paste")})
        await call(c, "send_keys", {"pane_id": sp["pane_id"], "keys": ["Enter"]})
        wait_file(ws[0] / "out_t6_split_window_paste.json", needle="}")
        await call(c, "respawn_pane", {"pane_id": w["pane_id"], "shell": cmd("respawn_pane_shell") + "; sleep 30"})
        await call(c, "respawn_pane", {"pane_id": sp["pane_id"]})
        await call(c, "run_command", {"pane_id": sp["pane_id"], "command": cmd("respawn_pane_default")})
        tags = ["create_session", "create_window_shell", "create_window_keys", "split_window_shell", "split_window_paste", "respawn_pane_shell", "respawn_pane_default"]
        got = {t: json.loads(wait_file(ws[0] / f"out_t6_{t}.json", needle="}")) for t in tags}
        # Positive control (a): an argv-form window made by a host-side tmux
        # client (which sandmux never issues) bypasses the gate; the same probe
        # and checks see the difference.
        sock = runtime_dir_of(serve_pids(ws[0])[0]) / "sock" / "tmux.sock"
        assert tmux_host(sock, "new-window", "-d", "-t", "t6", "python3", str(p), str(ws[0] / "out_t6_ungated.json"), server, "ungated").returncode == 0
        ungated = json.loads(wait_file(ws[0] / "out_t6_ungated.json", needle="}"))
    allowed = {"PATH", "TERM", "LANG", "LANGUAGE", "TZ", "COLORTERM", "HOME", "SHELL", "USER", "LOGNAME", "HISTCONTROL", "PWD", "SHLVL", "_", "OLDPWD"} | GATE_SHELL_ENV
    for t, r in got.items():
        assert r["Seccomp"] == "2" and r["NoNewPrivs"] == "1" and r["CapEff"] == "0000000000000000", (t, r)
        assert r["sock_dir"] == "EACCES" and r["sock_stat"] == "EACCES", (t, r)
        assert set(r["env"]) <= allowed | {n for n in r["env"] if n.startswith("LC_")}, (t, set(r["env"]) - allowed)
        assert r["signal_server"] == "EPERM", (t, r)  # the gate's nested Landlock domain
    assert canary not in json.dumps(got)
    assert ungated["signal_server"] == 0 and "TMUX" in ungated["env"], ungated


# ---------------------------------------------------------------- E14

E14_PROBE = r'''
for path in sys.argv[2].split(","):
    def w():
        fd = os.open(path, os.O_WRONLY)
        os.write(fd, b"\x00")  # only reached where the open worked
        os.close(fd)
        return "written"
    R[path] = tr(w)
'''


async def test_e14_launcher_and_gate_binaries_cannot_be_overwritten(ws):
    """Open for writing, and write, every sandmux-owned executable a pane can
    name: PID 1's and the tmux server's `/proc/<pid>/exe`, the pane's own,
    the gate binary, and the host path of the sandmux binary."""
    before = hashlib.sha256(open(BIN, "rb").read()).hexdigest()
    async with launch(ws, *ALL) as c:
        server = (await call(c, "display_message", {"format_string": "#{pid}"}))["text"]
        targets = ["/proc/1/exe", f"/proc/{server}/exe", "/proc/self/exe", "/run/sandmux/bin/sandmux-pane", BIN]
        r, _ = await run_probe(c, ws, "e14", E14_PROBE, ",".join(targets))
    assert r["/proc/1/exe"] == "EACCES" and r[f"/proc/{server}/exe"] == "EACCES", r  # Landlock ptrace scope
    assert r["/proc/self/exe"] in ("ETXTBSY", "EROFS", "EACCES"), r  # python3: read-only /usr, root-owned
    assert r["/run/sandmux/bin/sandmux-pane"] in ("ETXTBSY", "EROFS", "EACCES"), r
    assert r[BIN] in ("ENOENT", "EROFS", "EACCES"), r  # the host path is not even in the view
    assert "written" not in r.values(), r
    assert hashlib.sha256(open(BIN, "rb").read()).hexdigest() == before
    # Positive control (a): the same probe on the host, aimed at a copy of the
    # binary that is not running, writes it, and the hash check sees it.
    copy = ws[1] / "sandmux-copy"
    copy.write_bytes(open(BIN, "rb").read())
    hp = host_probe(ws, "e14", E14_PROBE, str(copy))
    assert hp[str(copy)] == "written", hp
    assert hashlib.sha256(copy.read_bytes()).hexdigest() != before


# ---------------------------------------------------------------- E24

E24_TABLE_PROBE = r'''
NEWUSER = 0x10000000
R["unknown_nr_1000"] = sc(1000)
R["clone3"] = sc(435, 0, 0)
R["unshare_newuser"] = sc(272, NEWUSER)
R["unshare_newuser_high_bits"] = sc(272, NEWUSER | (1 << 32))
R["io_uring_setup"] = sc(425, 1, 0)
R["fsopen"] = sc(430, 0, 0)
R["pidfd_getfd"] = sc(438, 0, 0, 0)
R["keyctl"] = sc(250, 0, 0)
R["bpf"] = sc(321, 0, 0, 0)
R["perf_event_open"] = sc(298, 0, 0, -1, -1, 0)
R["kexec_load"] = sc(246, 0, 0, 0, 0)
R["init_module"] = sc(175, 0, 0, 0)
'''

# x32 and i386 entry points: a marker, then the foreign call. Under the
# sandbox's filter the process is killed (SIGSYS) before it can print again.
E24_FOREIGN_PROBE = r'''
import mmap
print("BEFORE", flush=True)
if sys.argv[2] == "x32":
    R["x32_getpid"] = sc(0x40000000 | 39)
else:
    # mov eax, 20 (i386 getpid) ; int 0x80 ; ret
    code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    R["int80_getpid"] = fn()
print("AFTER", flush=True)
'''


async def test_e24_seccomp_filter_pitfalls(ws):
    """Syscalls a deny-list misses (new ones, unknown numbers), a 64-bit
    argument with high bits set, and the x32 and i386 entry points."""
    async with launch(ws, *ALL) as c:
        r, _ = await run_probe(c, ws, "e24", E24_TABLE_PROBE)
        assert r["unknown_nr_1000"] == "ENOSYS" and r["clone3"] == "ENOSYS", r  # allowlist default
        for k in ("unshare_newuser", "unshare_newuser_high_bits", "io_uring_setup", "fsopen", "pidfd_getfd", "keyctl", "bpf", "perf_event_open", "kexec_load", "init_module"):
            assert r[k] in ("EPERM", "ENOSYS"), (k, r)
        foreign = {}
        for mode in ("x32", "int80"):
            p = write_probe(ws, f"e24{mode}", E24_FOREIGN_PROBE)
            out = ws[0] / f"out_e24{mode}.json"
            res = await call(c, "run_command", {"command": f"python3 {p} {out} {mode}", "timeout": 20})
            foreign[mode] = res
            assert res["status"] == "completed" and res["exit_status"] == 128 + signal.SIGSYS, res
            assert "BEFORE" in res["output"] and "AFTER" not in res["output"] and not out.exists(), res
    # Positive control (a): on the host the same calls return (x32 is ENOSYS
    # or works; the i386 getpid gives a pid), and the process goes on.
    hx = host_probe(ws, "e24x32", E24_FOREIGN_PROBE, "x32")
    assert "x32_getpid" in hx, hx
    hi = host_probe(ws, "e24int80", E24_FOREIGN_PROBE, "int80")
    assert isinstance(hi["int80_getpid"], int) and hi["int80_getpid"] > 0, hi
    ht = host_probe(ws, "e24", E24_TABLE_PROBE)
    assert ht["unknown_nr_1000"] == "ENOSYS" and ht["clone3"] != "ENOSYS", ht  # clone3 exists on the host


# ---------------------------------------------------------------- E18

async def test_e18_execute_permission_is_not_a_boundary(ws):
    """E18 is a documented non-boundary: a file without the execute bit still
    runs through the dynamic loader or an interpreter. The test pins that
    down, so the docs can never come to claim otherwise unnoticed."""
    (ws[0] / "mytrue").write_bytes(open("/usr/bin/true", "rb").read())
    (ws[0] / "s.sh").write_text("echo script-ran\n")
    for f in ("mytrue", "s.sh"):
        os.chmod(ws[0] / f, 0o644)
    async with launch(ws, *ALL) as c:
        direct = await call(c, "run_command", {"command": "./mytrue"})
        ldso = await call(c, "run_command", {"command": "/lib64/ld-linux-x86-64.so.2 ./mytrue && echo loader-ran"})
        interp = await call(c, "run_command", {"command": "bash s.sh"})
    assert direct["exit_status"] == 126, direct  # execve refuses the file
    assert ldso["exit_status"] == 0 and "loader-ran" in ldso["output"], ldso
    assert interp["exit_status"] == 0 and "script-ran" in interp["output"], interp
