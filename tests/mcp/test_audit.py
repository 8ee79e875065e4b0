"""The audit log on the host (P7), attacked from the agent's side: strings it
chooses cannot amplify into the log or the supervisor's memory, a disk it
fills cannot make a call run unaudited, the budget refuses instead of
dropping, a clean stop seals the log, and the human is told."""

import contextlib
import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest

from conftest import BIN, runtime_dir_of

HERE = pathlib.Path(__file__).resolve().parent


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}


class Raw:
    """`sandmux serve` over raw JSON-RPC lines: the handshake's fields and the
    request ids are ours to choose, as a hostile client's would be."""

    def __init__(self, work, log, *extra, client_name="raw"):
        self.err = tempfile.TemporaryFile()
        # Live unless a test names a mode: the tests fill and read the
        # workspace from the host.
        mode = [] if "--workspace-mode" in extra else ["--workspace-mode", "live"]
        self.p = subprocess.Popen(
            [BIN, "serve", "-w", str(work), "--audit-log", str(log), *mode, *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=_env(),
        )
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                "clientInfo": {"name": client_name, "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg):
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def rpc(self, method, params, rid=None):
        self.n += 1
        rid = self.n if rid is None else rid
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            assert line, "serve ended: " + self.stderr()
            m = json.loads(line)
            if m.get("id") == rid:
                return m

    def tool(self, name, args=None):
        """(ran, text): whether the call ran, and its text."""
        r = self.rpc("tools/call", {"name": name, "arguments": args or {}})["result"]
        text = r["content"][0]["text"]
        return not (r.get("isError") and "audit log" in text and text.startswith("refused")), text

    def iid(self):
        return runtime_dir_of(self.p.pid).name

    def rss_kib(self):
        for l in pathlib.Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
            if l.startswith("VmRSS:"):
                return int(l.split()[1])

    def stop(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=30)
        return rc

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode(errors="replace")


def sm(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30, env=_env())


@contextlib.contextmanager
def small_fs():
    """An 8 MiB tmpfs (root only) for a workspace and a log that fill together."""
    with tempfile.TemporaryDirectory(prefix="sandmux-full-") as d:
        d = pathlib.Path(d)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)], check=True)
        try:
            yield d
        finally:
            subprocess.run(["umount", "-l", str(d)])


def records(log):
    return [json.loads(l) for l in log.read_text().splitlines()]


def test_agent_strings_do_not_amplify_into_the_log_or_memory(ws):
    work, host = ws
    log = host / "audit.jsonl"
    name = "N" * (2 << 20)  # a 2 MiB client name, sent once in the handshake
    s = Raw(work, log, client_name=name)
    try:
        s.tool("list_panes")
        rss0 = s.rss_kib()
        for i in range(40):
            s.rpc("tools/call", {"name": "list_panes", "arguments": {"x" * 3000: "y" * 20000}}, rid="R" * 100_000 + str(i))
        grown = s.rss_kib() - rss0
    finally:
        assert s.stop() == 0
    recs = records(log)
    big = [r for r in recs if r.get("client_id")]
    # The attack reached the log whole: the client name arrived (cut, with its length).
    assert big and all(r["client_id"].endswith(f"[cut, {len(name)} bytes]") for r in big), big[0]["client_id"][-40:]
    assert max(len(l) for l in log.read_text().splitlines()) <= 8192
    assert log.stat().st_size < 45 * 8192, log.stat().st_size
    # Without caps each record held 2.1 MiB (the window kept 200 of them).
    assert grown < 16 * 1024, f"supervisor RSS grew {grown} KiB"
    assert sm("audit", "verify", str(log)).returncode == 0


def test_budget_refuses_calls_and_the_seal_counts_them(ws, tmp_path):
    work, host = ws
    log = host / "audit.jsonl"
    prof = tmp_path / "small-log.toml"
    text = sm("profile", "show", "default").stdout
    assert 'audit_max_bytes = "256MiB"' in text
    prof.write_text(text.replace('audit_max_bytes = "256MiB"', 'audit_max_bytes = "64KiB"'))
    s = Raw(work, log, "--profile", str(prof))
    ran = 0
    try:
        while True:
            ok, msg = s.tool("sandbox_status")
            if not ok:
                break
            ran += 1
            assert ran < 2000, "the budget never refused"
        assert "budget" in msg and "audit_max_bytes" in msg, msg
        for _ in range(3):
            assert not s.tool("run_command", {"command": "touch ran-unaudited"})[0]
        assert not (work / "ran-unaudited").exists()
        ps = json.loads(sm("ps", "--json").stdout)
        me = next(r for r in ps if r["id"] == s.iid())
        assert me["audit"]["state"] == "full" and me["audit"]["refused_calls"] == 4, me["audit"]
        j = sm("journal", s.iid())
        assert "audit log full" in j.stderr and "4 calls refused" in j.stderr, j.stderr
    finally:
        assert s.stop() == 0
    assert log.stat().st_size <= 64 * 1024
    assert s.stderr().count("reached this instance's budget") == 1, s.stderr()
    v = sm("audit", "verify", str(log))
    assert v.returncode == 0 and "sealed" in v.stdout, v
    seal = records(log)[-1]
    assert seal["tool"] == "(sealed)" and seal["args"]["refused_calls"] == 4 and seal["args"]["budget_reached"], seal
    assert sum(1 for r in records(log) if r["tool"] == "sandbox_status") == ran


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system for the audit log needs root; the budget test covers the refusal unprivileged")
def test_a_disk_the_agent_fills_cannot_make_a_call_run_unaudited():
    with small_fs() as d:
        _fill_and_recover(d)


def _fill_and_recover(d):
    work, logdir = d / "ws", d / "host"
    work.mkdir(), logdir.mkdir()
    log = logdir / "audit.jsonl"
    s = Raw(work, log)
    try:
        assert s.tool("run_command", {"command": "echo warm"})[0]
        # The agent fills the file system the log is on.
        ok, _ = s.tool("run_command", {"command": "for i in $(seq 64); do head -c 1048576 /dev/zero > fill$i 2>/dev/null || break; done; head -c 65536 /dev/zero > last 2>/dev/null; echo filled"})
        assert ok
        # Positive control: the host cannot write there either.
        with pytest.raises(OSError):
            with open(logdir / "probe", "wb") as f:
                f.write(b"x" * 65536)
                f.flush(), os.fsync(f.fileno())
        # Calls run while the room kept for their records lasts, then are refused.
        outcomes = []
        for i in range(200):
            outcomes.append(s.tool("run_command", {"command": f"touch after{i}"}))
            if not outcomes[-1][0] and len(outcomes) > 3 and not outcomes[-3][0]:
                break
        refused = [t for ok, t in outcomes if not ok]
        assert refused and "cannot be written" in refused[0], outcomes[-1]
        ps = json.loads(sm("ps", "--json").stdout)
        me = next(r for r in ps if r["id"] == s.iid())
        assert me["audit"]["state"] == "failing", me["audit"]
        # Space comes back: calls run again, and a record says what was refused.
        for f in work.glob("fill*"):
            f.unlink()
        (logdir / "probe").unlink(missing_ok=True)
        assert s.tool("run_command", {"command": "echo back"})[0]
    finally:
        assert s.stop() == 0
    recs = records(log)
    ran = [r for r in recs if r["tool"] == "run_command"]
    # Every call that ran has its record: the one that filled the disk included.
    assert len(ran) == 2 + (len(outcomes) - len(refused)) + 1, (len(ran), len(outcomes))
    made = {p.name for p in work.glob("after*")}
    assert len(made) == len(outcomes) - len(refused), (made, outcomes)
    resumed = [r for r in recs if r["tool"] == "(audit-resumed)"]
    assert resumed and resumed[0]["args"]["refused_calls"] == len(refused), resumed
    assert s.stderr().count("cannot be written") == 1, s.stderr()
    assert recs[-1]["tool"] == "(sealed)"
    assert sm("audit", "verify", str(log)).returncode == 0


def test_retention_removes_only_finished_old_logs(ws, tmp_path):
    work, host = ws
    state, config = tmp_path / "state", tmp_path / "config"
    logs = state / "sandmux" / "audit"
    logs.mkdir(parents=True)
    (config / "sandmux").mkdir(parents=True)
    env = dict(_env(), XDG_STATE_HOME=str(state), XDG_CONFIG_HOME=str(config))
    old = time.time() - 3 * 86400
    # A live instance whose log is old (it has been idle): kept.
    live = subprocess.Popen([BIN, "serve", "-w", str(work)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(200):
            if list(logs.glob("*.jsonl")):
                break
            time.sleep(0.05)
        live_log = next(logs.glob("*.jsonl"))
        # The log is named after the instance, as `ps` names it.
        ps = json.loads(subprocess.run([BIN, "ps", "--json"], capture_output=True, text=True, env=env, timeout=30).stdout)
        assert any(live_log.name.endswith(f"-{r['id']}.jsonl") for r in ps), (live_log.name, ps)
        os.utime(live_log, (old, old))
        finished = logs / "100-aaaaaaaaaaaa.jsonl"
        recent = logs / "200-bbbbbbbbbbbb.jsonl"
        other = logs / "notes.jsonl"
        for f in (finished, recent, other):
            f.write_text("{}\n")
        outside = tmp_path / "precious"
        outside.write_text("keep")
        link = logs / "300-cccccccccccc.jsonl"
        link.symlink_to(outside)
        for f in (finished, other, outside):
            os.utime(f, (old, old))
        os.utime(link, (old, old), follow_symlinks=False)
        # A bad configuration refuses to start, naming the file and the key.
        (config / "sandmux" / "config.toml").write_text("[audit]\nkeep_day = 1\n")
        r = subprocess.run([BIN, "serve", "-w", str(work)], stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=30)
        assert r.returncode == 2 and "config.toml" in r.stderr and "keep_day" in r.stderr, r.stderr
        assert finished.exists()
        (config / "sandmux" / "config.toml").write_text("[audit]\nkeep_days = 1\n")
        r = subprocess.run([BIN, "serve", "-w", str(work)], input="", capture_output=True, text=True, env=env, timeout=30)
        assert "retention" not in r.stderr, r.stderr
    finally:
        live.stdin.close()
        live.wait(timeout=30)
    assert not finished.exists()
    assert recent.exists() and other.exists() and live_log.exists()
    assert link.is_symlink() and outside.read_text() == "keep"
    newest = max(logs.glob("*.jsonl"), key=lambda p: p.stat().st_mtime if not p.is_symlink() else 0)
    recs = [r for p in logs.glob("*.jsonl") if not p.is_symlink() and p.stat().st_size > 3 for r in records(p)]
    ret = [r for r in recs if r["tool"] == "(audit-retention)"]
    assert len(ret) == 1 and ret[0]["args"]["removed_logs"] == 1, (ret, newest)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system for the audit log needs root")
def test_a_refusal_while_the_disk_is_full_cannot_cost_a_running_call_its_record():
    """Found in review: a call in flight fills the disk; a refusal that
    arrives meanwhile (no room kept for it) must not take the running call's
    kept room with it."""
    with small_fs() as d:
        work, log = d / "ws", d / "host" / "audit.jsonl"
        work.mkdir()
        s = Raw(work, log)
        try:
            s.tool("list_panes")
            s.send({"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {"name": "run_command", "arguments": {
                "command": "head -c 16777216 /dev/zero > fill 2>/dev/null; sleep 3; rm fill; echo done", "timeout": 20}}})
            for _ in range(100):
                if (work / "fill").exists() and os.statvfs(d).f_bavail == 0:
                    break
                time.sleep(0.05)
            s.send({"jsonrpc": "2.0", "id": 51, "method": "tools/call", "params": {"name": "nope", "arguments": {f"k{i}": "x" * 1000 for i in range(7)}}})
            got = {}
            while len(got) < 2:
                m = json.loads(s.p.stdout.readline())
                if m.get("id") in (50, 51):
                    got[m["id"]] = m
            assert "done" in json.dumps(got[50]), got[50]
        finally:
            s.stop()
        recs = records(log)
        assert any(r["tool"] == "run_command" and r["outcome"] == "ok" for r in recs), [r["tool"] for r in recs]
        assert recs[-1]["tool"] == "(sealed)"


def test_an_agent_cannot_forge_the_seal(ws):
    work, host = ws
    log = host / "audit.jsonl"
    s = Raw(work, log)
    s.rpc("tools/call", {"name": "(sealed)", "arguments": {}})
    s.p.kill()
    s.p.wait()
    v = sm("audit", "verify", str(log))
    assert v.returncode == 3 and "NOT sealed" in v.stdout, v.stdout
    assert records(log)[-1]["tool"] == "(sealed)"  # the name is there, the seal is not


def test_the_journal_resource_stays_small(ws):
    work, host = ws
    log = host / "audit.jsonl"
    s = Raw(work, log)
    try:
        for i in range(130):
            s.rpc("tools/call", {"name": "nope", "arguments": {"a": [0] * 3900}})
        r = s.rpc("resources/read", {"uri": "sandmux://journal"})
        text = r["result"]["contents"][0]["text"]
        recs = json.loads(text)["records"]
        assert len(text) <= 1_000_000 and recs and recs[-1]["tool"] == "nope", len(text)
    finally:
        s.stop()


def test_a_client_that_never_reads_cannot_grow_the_supervisor(ws):
    """Found in review: requests whose answers are never read made the
    supervisor hold every answer (6 MB per journal read then; up to 1 MB per
    answer now). Calls now wait while 8 MiB of answers are unread."""
    work, host = ws
    s = Raw(work, host / "audit.jsonl")
    try:
        for i in range(130):  # about 1 MiB of recent records
            s.rpc("tools/call", {"name": "nope", "arguments": {"a": [0] * 3900}})
        rss0 = s.rss_kib()
        n = 300
        for i in range(n):
            s.send({"jsonrpc": "2.0", "id": 1000 + i, "method": "resources/read", "params": {"uri": "sandmux://journal"}})
        time.sleep(3)
        grown = s.rss_kib() - rss0
        # Without the bound it grew 45 MiB for 150 unread answers (measured).
        assert grown < 32 * 1024, f"supervisor RSS grew {grown} KiB with {n} answers unread"
        got = set()
        while len(got) < n:
            m = json.loads(s.p.stdout.readline())
            if isinstance(m.get("id"), int) and m["id"] >= 1000:
                assert "result" in m, m.get("error")
                got.add(m["id"])
    finally:
        s.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system for the audit log needs root")
def test_recovering_from_a_full_disk_keeps_the_room_of_running_calls():
    """Found in the second review: recovery truncated the file, which freed
    the room preallocated for calls still running, and a background writer
    in the pane took it."""
    with small_fs() as d:
        work, log = d / "ws", d / "host" / "audit.jsonl"
        work.mkdir()
        s = Raw(work, log)
        try:
            s.tool("list_panes")
            s.send({"jsonrpc": "2.0", "id": 100, "method": "tools/call", "params": {"name": "run_command", "arguments": {
                "command": "(while :; do head -c 4096 /dev/zero >> f2 2>/dev/null; done) & P=$!; head -c 9M /dev/zero > fill 2>/dev/null; sleep 4; kill $P; echo A-DONE",
                "timeout": 30}}})
            time.sleep(2)
            for i in range(3):
                s.send({"jsonrpc": "2.0", "id": 101 + i, "method": "tools/call", "params": {"name": "list_panes", "arguments": {}}})
                time.sleep(0.4)
            got = {}
            while len(got) < 4:
                m = json.loads(s.p.stdout.readline())
                if m.get("id") in (100, 101, 102, 103):
                    got[m["id"]] = m
            assert "A-DONE" in json.dumps(got[100]), got[100]
            for f in ("fill", "f2"):
                (work / f).unlink(missing_ok=True)
        finally:
            s.stop()
        recs = records(log)
        assert any(r["tool"] == "run_command" for r in recs), [(r["tool"], r["outcome"]) for r in recs]
        assert sm("audit", "verify", str(log)).returncode == 0


def test_unread_list_answers_cannot_grow_the_supervisor(ws):
    """Found in the second review: 20,000 `tools/list` requests (60 bytes
    each, 40 KB answers) never read grew the supervisor to 957 MB. Requests
    are no longer read while 8 MiB of answers are owed."""
    import threading
    work, host = ws
    s = Raw(work, host / "audit.jsonl")
    try:
        s.tool("list_panes")
        rss0 = s.rss_kib()
        n = 2000
        line = "".join(json.dumps({"jsonrpc": "2.0", "id": 5000 + i, "method": "tools/list"}) + "\n" for i in range(n)).encode()
        sender = threading.Thread(target=lambda: (s.p.stdin.write(line), s.p.stdin.flush()))
        sender.start()
        time.sleep(4)
        grown = s.rss_kib() - rss0
        # Without the gate: 2000 answers of 40 KB (80 MB) held at once.
        assert grown < 48 * 1024, f"supervisor RSS grew {grown} KiB with {n} list answers unread"
        got = 0
        while got < n:
            m = json.loads(s.p.stdout.readline())
            if isinstance(m.get("id"), int) and m["id"] >= 5000:
                assert len(m["result"]["tools"]) == 49
                got += 1
        sender.join(timeout=30)
    finally:
        s.stop()


def test_the_journal_of_a_finished_instance_comes_from_its_log(ws, tmp_path):
    """Issue 26: `sandmux journal ID` knew only running instances; the log
    of a finished one is named after the same id, and journal reads it."""
    work, host = ws
    state = tmp_path / "state"
    env = dict(_env(), XDG_STATE_HOME=str(state))
    p = subprocess.Popen([BIN, "serve", "-w", str(work), "--workspace-mode", "live"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_sessions", "arguments": {}}},
    ]
    for m in msgs:
        p.stdin.write((json.dumps(m) + "\n").encode())
        p.stdin.flush()
        if "id" in m:
            while json.loads(p.stdout.readline()).get("id") != m["id"]:
                pass
    p.stdin.close()
    assert p.wait(timeout=30) == 0
    logs = list((state / "sandmux" / "audit").glob("*.jsonl"))
    assert len(logs) == 1, logs
    iid = logs[0].stem.split("-", 1)[1]
    r = subprocess.run([BIN, "journal", iid[:6], "--json"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    tools = [json.loads(l)["tool"] for l in r.stdout.splitlines()]
    assert "list_sessions" in tools and tools[-1] == "(sealed)", tools
    r = subprocess.run([BIN, "journal", "ffffffffffff"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 1 and "no audit log named after it" in r.stderr, r.stderr
