"""`serve` inside the image, spawned as `podman run -i --rm …` (or `docker
run -i --rm …`) by the official MCP Python SDK, as an MCP client would:
tools work, a pane cannot read /etc/shadow or write the runtime directory
(checked on the host through a bind mount), `stop` ends it with status 0
and a sealed audit log; under docker's defaults (no namespaces at all)
the same, with the socket kept from the pane by file permissions."""

import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

import harness
from harness import IMAGE

pytestmark = pytest.mark.anyio

# Tries to create a file in the runtime directory and everything under it,
# as the supervisor (root, no XDG_RUNTIME_DIR) makes it: /tmp/sandmux-0, and
# in the host view tmux mode keeps without a mount namespace.
PROBE = ('for d in /tmp/sandmux-0 /tmp/sandmux-0/* /tmp/sandmux-0/*/* /tmp/sandmux-view-* /tmp/sandmux-view-*/* '
         '/tmp/sandmux-view-*/*/*; '
         'do [ -d "$d" ] && touch "$d/pwned-$$" 2>/dev/null && echo "wrote $d"; done; echo probe-done')


def host_dir(rt, mode=0o700):
    """A host directory the container's root can write (uid 65534 for rootless)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="smx-ctr-", dir=rt.share))
    d.chmod(mode)
    if rt.mode == "rootless" and os.getuid() == 0:
        os.chown(d, harness.ROOTLESS_UID, harness.ROOTLESS_UID)
    return d


def server(rt, flags, *args, name=None, volumes=()):
    opts = ["--name", name] if name else []
    for host, inside in volumes:
        opts += ["-v", f"{host}:{inside}"]
    argv = rt.argv("run", "-i", "--rm", "--network", "none", *opts, *rt.flags(flags), IMAGE, *args)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=rt.env)


async def call(c, name, args=None):
    r = await c.call_tool(name, args or {})
    assert not r.is_error, f"{name} failed: {r.content[0].text if r.content else r}"
    return r.structured_content


async def sh(c, command):
    r = await call(c, "run_command", {"command": command, "timeout": 20})
    assert r["status"] == "completed", r
    return r["output"]


def pwned(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("pwned-*"))


async def test_tools_work_in_full_confinement(anyrt):
    async with Client(server(anyrt, "full", "serve", "-p", "default", "--workspace-mode", "live")) as c:
        r = await call(c, "run_command", {"command": "echo hello from $(cat /proc/sys/kernel/hostname) as $(id -u)"})
        assert r["exit_status"] == 0 and r["output"] == "hello from sandmux as 1000", r
        st = await call(c, "sandbox_status")
        assert "cgroup" in json.dumps(st)
        assert (await call(c, "list_panes"))["panes"]


async def test_a_pane_cannot_read_etc_shadow(anyrt):
    ctl = anyrt.run("run", "--rm", "--network", "none", "--entrypoint", "/usr/bin/cat", IMAGE, "/etc/shadow")
    assert "root:*:" in ctl.stdout, f"positive control: the image's shadow file: {ctl.stderr}"
    async with Client(server(anyrt, "full", "serve", "-p", "container")) as c:
        out = await sh(c, "cat /etc/shadow; head -c 64 /etc/gshadow; echo end")
    assert "root:" not in out and out.endswith("end"), out


async def test_a_pane_cannot_write_the_runtime_directory(anyrt):
    tmp = host_dir(anyrt, 0o1777)
    name = f"smx-rundir-{os.getpid()}-{anyrt}"
    async with Client(server(anyrt, "full", "serve", "-p", "container", name=name, volumes=[(tmp, "/tmp")])) as c:
        out = await sh(c, PROBE)
        assert out.endswith("probe-done") and "wrote" not in out, out
        rundirs = [p for p in (tmp / "sandmux-0").iterdir() if p.is_dir()]
        assert rundirs, "the runtime directory is not on the bind mount: the check would be vacuous"
        assert pwned(tmp) == []
        # Positive control: the same probe, unconfined in the same container.
        ctl = anyrt.run("exec", name, "/usr/bin/bash", "-c", PROBE)
        assert "wrote" in ctl.stdout and pwned(tmp), ctl.stdout + ctl.stderr


async def test_the_default_command_serves_with_the_full_flags(rootful):
    async with Client(server(rootful, "full")) as c:
        assert (await sh(c, "echo $((6*7))")) == "42"


def jsonrpc(p, msg):
    p.stdin.write((json.dumps(msg) + "\n").encode())
    p.stdin.flush()
    if "id" not in msg:
        return None
    while line := p.stdout.readline():
        m = json.loads(line)
        if m.get("id") == msg["id"]:
            return m
    raise AssertionError("serve closed stdout")


def first_command(argv, env, command):
    """serve spawned by `argv`, stdio held by the test: the handshake and one
    `run_command`; the process and the command's output."""
    p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "ctr", "version": "0"}}
    assert "result" in jsonrpc(p, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
    jsonrpc(p, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    r = jsonrpc(p, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "run_command", "arguments": {"command": command}}})
    return p, r["result"]["structuredContent"]["output"]


def start_serving(rt, flags, name, volumes=()):
    """serve in a named container, stdio held by the test; one tool call done."""
    s = server(rt, flags, "serve", "-p", "container", name=name, volumes=volumes)
    p, out = first_command([s.command, *s.args], s.env, "echo ok")
    assert out == "ok", out
    return p


def test_stop_ends_serve_with_status_0_and_a_sealed_audit_log(anyrt):
    audit = host_dir(anyrt)
    name = f"smx-stop-{os.getpid()}-{anyrt}"
    p = start_serving(anyrt, "full", name, volumes=[(audit, "/var/lib/sandmux/audit")])
    stop = anyrt.run("stop", "-t", "2", name)
    assert stop.returncode == 0, stop.stderr
    assert p.wait(60) == 0, p.stderr.read().decode()
    logs = list(audit.glob("*.jsonl"))
    assert len(logs) == 1, logs
    v = subprocess.run([harness.BIN, "audit", "verify", str(logs[0])], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    last = json.loads(logs[0].read_text().splitlines()[-1])
    assert last["tool"] == "(sealed)", last


def orphan_state(rt, name):
    """Makes an orphan in container `name` (it ends at once, reparented to
    PID 1) and returns its /proc stat after it ended: "" once reaped, a line
    with state Z while a zombie. Waits up to 10 s for it to go."""
    orphan = rt.run("exec", name, "/usr/bin/bash", "-c", "(sleep 0.2 & echo $!)").stdout.strip()
    assert orphan.isdigit()
    stat = lambda: rt.run("exec", name, "/usr/bin/bash", "-c", f"cat /proc/{orphan}/stat 2>/dev/null").stdout
    end = time.monotonic() + 10
    while time.monotonic() < end and (state := stat()) != "" and ") Z " not in state:
        time.sleep(0.2)
    if state and ") Z " in state:  # a zombie may still be reaped: give PID 1 its chance
        while time.monotonic() < end and (state := stat()) != "":
            time.sleep(0.2)
    return state


def test_pid1_reaps_orphans(rootful):
    name = f"smx-reap-{os.getpid()}"
    p = start_serving(rootful, "full", name)
    try:
        state = orphan_state(rootful, name)
        assert state == "", f"the orphan is still there after 10 s: {state}"
    finally:
        rootful.run("stop", "-t", "2", name)
        p.wait(60)
    # Positive control: the same orphan under a PID 1 that does not reap (sleep) stays a zombie.
    ctl = f"smx-reap-ctl-{os.getpid()}"
    r = rootful.run("run", "-d", "--rm", "--network", "none", "--name", ctl, "--entrypoint", "/usr/bin/sleep",
                    IMAGE, "60")
    assert r.returncode == 0, r.stderr
    try:
        state = orphan_state(rootful, ctl)
        assert ") Z " in state, f"control: the orphan under a non-reaping PID 1: {state!r}"
    finally:
        rootful.run("rm", "-f", "-t", "0", ctl)


def test_run_as_pid1_exits_with_the_commands_status(rootful):
    """PID 1's reaping parent passes the command's status through (README's table)."""
    def run(cmd):
        return rootful.run("run", "--rm", "--network", "none", *rootful.flags("full"), IMAGE,
                           "run", "-p", "default", "--workspace-mode", "live", "--", "/usr/bin/bash", "-c", cmd)
    p = run("echo out; echo err >&2; exit 7")
    assert (p.returncode, p.stdout) == (7, "out\n") and "err" in p.stderr, (p.returncode, p.stdout, p.stderr)
    p = run("kill -USR1 $$")
    assert p.returncode == 128 + 10, (p.returncode, p.stderr)


async def test_a_start_up_failure_reaches_the_client_as_an_error(rootful):
    with pytest.raises(Exception) as e:
        async with Client(server(rootful, "defaults", "serve", "-p", "default")):
            pass
    assert "layer" in repr(e.value), repr(e.value)


async def test_the_default_command_serves_under_runtime_defaults(request):
    for rt in (request.getfixturevalue("rootful"), request.getfixturevalue("docker")):
        async with Client(server(rt, "defaults")) as c:
            assert (await sh(c, "echo $((6*7))")) == "42"


def attack(sock):
    """From a pane: reach the tmux server's socket (`sock`, the path the host
    sees), open its directory up, or move it away."""
    d = os.path.dirname(sock)
    return (f'tmux -S {sock} list-sessions 2>/dev/null && echo "reached {sock}"; '
            f'chmod 0777 {d} 2>/dev/null && echo "opened {d}"; '
            f'mv {d} {d}.x 2>/dev/null && echo "moved {d}"; '
            f'tmux -S {sock} list-sessions 2>/dev/null && echo "reached {sock}"; echo attack-done')


async def test_without_userns_serve_works_and_a_pane_cannot_read_shadow_or_write_the_runtime_dir(docker):
    tmp = host_dir(docker, 0o1777)
    name = f"smx-nons-{os.getpid()}"
    async with Client(server(docker, "defaults", "serve", "-p", "container", name=name,
                             volumes=[(tmp, "/tmp")])) as c:
        out = await sh(c, "id -u; cat /etc/shadow; " + PROBE)
        assert out.startswith("1000") and "root:" not in out and "wrote" not in out, out
        assert pwned(tmp) == [], pwned(tmp)
        views = list(tmp.glob("sandmux-view-*"))
        assert len(views) == 1, f"no host view on the bind mount: the checks would be vacuous ({views})"
        sock = f"/tmp/{views[0].name}/v/sock/tmux.sock"
        out = await sh(c, attack(sock))
        assert out.endswith("attack-done") and "reached" not in out and "opened" not in out \
            and "moved" not in out, out
        st = (views[0] / "v" / "sock").stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700), st
        # Positive control: unconfined in the same container, the same
        # attack reaches the server through the same path.
        ctl = docker.run("exec", name, "/usr/bin/bash", "-c", attack(sock))
        assert "reached" in ctl.stdout, ctl.stdout + ctl.stderr
    assert not list(tmp.glob("sandmux-view-*")), "the host view outlived serve"


def run_in(rt, flags, script, volumes=(), name=None):
    """`sandmux run -p container -- bash -c SCRIPT` in a fresh container; the
    script may wait on stdin, which the test holds."""
    opts = [a for h, i in volumes for a in ("-v", f"{h}:{i}")] + (["--name", name] if name else [])
    return subprocess.Popen(rt.argv("run", "-i", "--rm", "--network", "none", *opts, *rt.flags(flags), IMAGE,
                                    "run", "-p", "container", "--", "/usr/bin/bash", "-c", script),
                            env=rt.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_without_userns_run_cannot_write_the_runtime_dir_or_read_shadow(docker):
    """As root with no user namespace, `run` drops to an unprivileged uid and
    withholds write on the real /tmp (it holds the runtime directory)."""
    tmp = host_dir(docker, 0o1777)
    name = f"smx-drop-{os.getpid()}"
    p = run_in(docker, "defaults", "id -u; cat /etc/shadow; " + PROBE + "; read x", volumes=[(tmp, "/tmp")], name=name)
    out = ""
    while (line := p.stdout.readline()) and "probe-done" not in line:
        out += line
    seen = pwned(tmp)  # while run still holds its runtime directory
    assert (tmp / "sandmux-0").is_dir(), "no runtime directory on the bind mount: the check would be vacuous"
    # Positive control: uid 0 in the same container (what the command was
    # before the drop) writes the runtime directory and reads the shadow file.
    ctl = docker.run("exec", name, "/usr/bin/bash", "-c", "cat /etc/shadow; " + PROBE)
    p.communicate("\n", timeout=60)
    assert "probe-done" in line, out + p.stderr.read()
    assert out.splitlines()[0] == "1000", out
    assert "root:" not in out and "wrote" not in out and seen == [], (out, seen)
    assert "root:" in ctl.stdout and "wrote" in ctl.stdout, ctl.stdout + ctl.stderr


def test_without_userns_run_names_the_dropped_layers_unless_quiet(docker):
    p = run_in(docker, "defaults", "true")
    _, err = p.communicate("", timeout=60)
    assert p.returncode == 0, err
    said = [l for l in err.splitlines() if l.startswith("sandmux:")]
    # The dropped layers, and the copy-on-write workspace that became a
    # private copy (never live unless asked; an empty copy goes at the end).
    assert len(said) == 2, err
    assert any("userns" in l for l in said) and any("a private copy, not copy-on-write" in l for l in said), err
    assert not any("not guarded there" in l for l in said), err
    q = subprocess.run(docker.argv("run", "--rm", "--network", "none", IMAGE, "run", "--quiet", "-p", "container",
                                   "--", "/usr/bin/true"), env=docker.env, capture_output=True, text=True)
    assert q.returncode == 0 and q.stderr == "", q.stderr


def leftovers(rt, flags, confined):
    """A command that leaves a daemon behind (double fork: `(sleep 300 &)`), run by
    `sandmux run` (or, unconfined, by bash), in a container that outlives
    it: the daemons still there afterwards."""
    daemon = "(/usr/bin/sleep 300 </dev/null >/dev/null 2>&1 &); echo started"
    cmd = f"sandmux run -q -p container -- /usr/bin/bash -c '{daemon}'" if confined else daemon
    scan = ('sleep 0.5; for f in /proc/[0-9]*/cmdline; do c=$(tr "\\0" " " < $f 2>/dev/null); '
            '[ "$c" = "/usr/bin/sleep 300 " ] && echo "left $f"; done; echo scan-done')
    p = rt.run("run", "--rm", "--network", "none", *rt.flags(flags), "--entrypoint", "/usr/bin/bash", IMAGE,
               "-c", f"{cmd}; {scan}")
    assert "started" in p.stdout and "scan-done" in p.stdout, p.stdout + p.stderr
    return [l for l in p.stdout.splitlines() if l.startswith("left")]


def test_without_a_pid_namespace_nothing_outlives_the_sandbox(request):
    """docker's defaults (no namespace) and podman's (no pid namespace, /proc
    is covered): the sandbox's PID 1 is its processes' subreaper and ends
    them when the command ends. Control: the same daemon started by bash."""
    for rt in (request.getfixturevalue("docker"), request.getfixturevalue("rootful")):
        assert leftovers(rt, "defaults", confined=True) == [], rt
        assert leftovers(rt, "defaults", confined=False), f"control: no daemon left by bash under {rt}"


def test_a_stop_during_the_start_up_error_wait_ends_serve_at_once(rootful):
    """serve -p default fails start-up under podman's defaults and waits (up
    to 10 s) for the client's first request to answer it with the error; a
    silent client, then `podman stop -t 3`: serve stops on the signal with
    status 0 instead of being killed after 3 s (137)."""
    name = f"smx-stopwait-{os.getpid()}"
    s = server(rootful, "defaults", "serve", "-p", "default", name=name)
    p = subprocess.Popen([s.command, *s.args], env=s.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        # The error is on stderr once start-up has failed: the wait begins.
        seen = []
        while (line := p.stderr.readline()) and b"could not be applied" not in line:
            seen.append(line)
        assert line, seen
        stop = rootful.run("stop", "-t", "3", name)
        assert stop.returncode == 0, stop.stderr
        assert p.wait(30) == 0, p.stderr.read().decode()
    finally:
        p.kill()
        rootful.run("rm", "-f", "-t", "0", name)


UID_1000 = ('for f in /proc/[0-9]*/status; do while read k a b; do [ "$k" = Uid: ] && [ "$a" = 1000 ] && '
            'echo "uid1000 $f"; done < $f; done 2>/dev/null; echo scan-done')


def test_without_namespaces_serve_leaves_no_process_behind(docker):
    """serve under docker's defaults in a container that outlives it (`exec`):
    once the client closes stdin and serve exits, no process of the dropped
    uid is left (the relay passes the stop on as that uid; each process arms
    its parent-death signal again after the drop). Control: a process of
    that uid started in the same container is seen by the same scan."""
    name = f"smx-leave-{os.getpid()}"
    r = docker.run("run", "-d", "--rm", "--network", "none", "--name", name, "--entrypoint", "/usr/bin/sleep",
                   IMAGE, "600")
    assert r.returncode == 0, r.stderr
    try:
        p, out = first_command(docker.argv("exec", "-i", name, "sandmux", "serve", "-p", "container"), docker.env,
                               "(sleep 300 &); id -u")
        assert out == "1000", out
        p.stdin.close()
        assert p.wait(60) == 0, p.stderr.read().decode()
        time.sleep(1)
        scan = docker.run("exec", name, "/usr/bin/bash", "-c", UID_1000).stdout
        assert "scan-done" in scan and "uid1000" not in scan, scan
        # Control: the scan sees a process of that uid.
        docker.run("exec", "-d", "--user", "1000", name, "/usr/bin/sleep", "300")
        time.sleep(0.5)
        ctl = docker.run("exec", name, "/usr/bin/bash", "-c", UID_1000).stdout
        assert "uid1000" in ctl, ctl
    finally:
        docker.run("rm", "-f", "-t", "0", name)


def test_without_a_pid_namespace_a_killed_supervisor_leaves_nothing_running(rootful):
    """podman's defaults (no pid namespace): `sandmux run`, SIGKILLed while
    its command runs with a double-forked daemon: PID 1 outlives its relay
    (its parent-death signal is SIGTERM there) and ends both. Control: the
    scan sees the daemon while the run is alive."""
    name = f"smx-kill9-{os.getpid()}"
    r = rootful.run("run", "-d", "--rm", "--network", "none", "--name", name, "--entrypoint", "/usr/bin/sleep",
                    IMAGE, "600")
    assert r.returncode == 0, r.stderr
    cmd = "(/usr/bin/sleep 777 &); /usr/bin/sleep 100"
    running = ('for f in /proc/[0-9]*/cmdline; do c=$(tr "\\0" " " < $f 2>/dev/null); '
               '[ "$c" = "/usr/bin/sleep 777 " ] && echo daemon; done; echo scan-done')
    try:
        p = subprocess.Popen(rootful.argv("exec", name, "sandmux", "run", "-q", "-p", "container", "--",
                                          "/usr/bin/bash", "-c", cmd), env=rootful.env)
        end = time.monotonic() + 20
        while "daemon" not in (seen := rootful.run("exec", name, "/usr/bin/bash", "-c", running).stdout):
            assert time.monotonic() < end and p.poll() is None, f"control: the daemon never ran: {seen}"
            time.sleep(0.2)
        kill = ('for f in /proc/[0-9]*/cmdline; do c=$(tr "\\0" " " < $f 2>/dev/null); '
                '[ "${c#sandmux run }" != "$c" ] && kill -9 $(basename $(dirname $f)) && echo killed; done')
        assert "killed" in rootful.run("exec", name, "/usr/bin/bash", "-c", kill).stdout
        p.wait(30)
        end = time.monotonic() + 10
        while "daemon" in (seen := rootful.run("exec", name, "/usr/bin/bash", "-c", running).stdout):
            assert time.monotonic() < end, f"the daemon outlived the killed supervisor: {seen}"
            time.sleep(0.2)
    finally:
        rootful.run("rm", "-f", "-t", "0", name)


def test_without_namespaces_another_process_of_the_uid_refuses_tmux_mode(docker):
    """Under docker's defaults the socket is kept by uid until its cover: a
    process already running as the sandbox's uid (as a leftover or another
    instance would be) makes start-up refuse, naming it. Control: the same
    `check` in the same container passes once it is gone."""
    name = f"smx-alone-{os.getpid()}"
    r = docker.run("run", "-d", "--rm", "--network", "none", "--name", name, "--entrypoint", "/usr/bin/sleep",
                   IMAGE, "600")
    assert r.returncode == 0, r.stderr
    try:
        squat = docker.run("exec", "-d", "--user", "1000", name, "/usr/bin/sleep", "300")
        assert squat.returncode == 0, squat.stderr
        time.sleep(0.5)
        p = docker.run("exec", name, "sandmux", "check", "-p", "container", "--json")
        rep = json.loads(p.stdout)
        assert p.returncode == 3 and "other processes run as that uid" in rep["error"], rep["error"]
        docker.run("exec", name, "/usr/bin/bash", "-c",
                   'for f in /proc/[0-9]*/cmdline; do [ "$(tr "\\0" " " < $f)" = "/usr/bin/sleep 300 " ] && '
                   'kill ${f//[^0-9]/}; done')
        time.sleep(0.5)
        ctl = docker.run("exec", name, "sandmux", "check", "-p", "container", "--json")
        failed = [o for o in json.loads(ctl.stdout)["observations"] if not o["passed"]]
        assert ctl.returncode == 0, failed
    finally:
        docker.run("rm", "-f", "-t", "0", name)
