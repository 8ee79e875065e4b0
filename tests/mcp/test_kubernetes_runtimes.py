"""Runtime classes: gVisor (runsc) implements no Landlock system call
(landlock_create_ruleset answers ENOSYS, as on a kernel without it), and
sandmux must then refuse to start, naming the layer. No gVisor runs here, so
the test gives sandmux exactly that: a seccomp filter installed before exec
that answers ENOSYS to the three landlock_* calls (x86_64 numbers 444-446).
Control: the same wrapper with other numbers denied, and sandmux starts."""

import ctypes
import os
import platform
import struct
import subprocess
import tempfile

import pytest

from conftest import BIN

LANDLOCK = (444, 445, 446)  # landlock_create_ruleset, _add_rule, _restrict_self (x86_64)
UNUSED = (400, 401, 402)  # not assigned on x86_64: denying them changes nothing


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def deny_enosys(nrs):
    """A preexec_fn: no_new_privs, then a filter answering ENOSYS to `nrs`."""
    ins = [(0x20, 0, 0, 4), (0x15, 0, 5, 0xC000003E), (0x20, 0, 0, 0)]  # x86_64 only, then the number
    ins += [(0x15, 2, 0, nrs[0]), (0x15, 1, 0, nrs[1]), (0x15, 0, 1, nrs[2])]
    ins += [(0x06, 0, 0, 0x00050000 | 38), (0x06, 0, 0, 0x7FFF0000)]  # ERRNO(ENOSYS), ALLOW
    raw = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in ins))

    def install():
        libc = ctypes.CDLL(None, use_errno=True)
        prog = SockFprog(len(ins), ctypes.addressof(raw))
        assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
        assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, FILTER

    return install


@pytest.fixture
def work():
    with tempfile.TemporaryDirectory(prefix="sandmux-runtime-") as d:
        os.makedirs(f"{d}/ws")
        yield d


def run(work, nrs, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    return subprocess.run([BIN, *args], cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, preexec_fn=deny_enosys(nrs))


def serve_args(work):
    return ["serve", "-w", f"{work}/ws", "--workspace-mode", "live", "--audit-log", f"{work}/audit.jsonl", "--http", "127.0.0.1:0", "--unclaimed", "--token-header", "X-Sandmux-Token"]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the filter's numbers are x86_64's")
def test_without_landlock_as_under_gvisor_serve_refuses_naming_the_layer(work):
    for profile in ("default", "ci", "dev", "registries", "container"):
        c = run(work, LANDLOCK, "check", "--profile", profile)
        assert c.returncode != 0 and "landlock" in c.stdout + c.stderr, (profile, c.stdout + c.stderr)
    s = run(work, LANDLOCK, *serve_args(work))
    assert s.returncode == 3, s.stderr
    assert "required layer 'landlock' is unavailable" in s.stderr, s.stderr
    assert "serving MCP" not in s.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the filter's numbers are x86_64's")
def test_control_the_same_wrapper_denying_other_calls_lets_sandmux_start(work):
    c = run(work, UNUSED, "check", "--profile", "default")
    assert c.returncode == 0, c.stdout + c.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    p = subprocess.Popen([BIN, *serve_args(work)], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=deny_enosys(UNUSED))
    try:
        line = ""
        for line in p.stderr:
            if "serving MCP at " in line:
                break
        assert "serving MCP at " in line, line
    finally:
        p.terminate()
        p.wait(timeout=30)
        p.stderr.close()
