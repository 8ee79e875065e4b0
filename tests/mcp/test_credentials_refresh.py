"""Credentials whose value changes while the instance runs, through the real
confined `serve` (the supervisor has given up the host by then, so a value
read again must be one its rules still reach): a `from_file` rotated by a
rename and by a rewrite in place, and a `from_command` (a host-side token
command run by the broker) refreshed before its lifetime ends, after a 401,
failing closed and hanging (bounded). A stand-in HTTPS credential host on
the host's loopback records the Authorization each request carries; a
stand-in token endpoint hands out short-lived tokens."""

import json
import os
import re
import secrets
import time

import anyio
import subprocess

import pytest

from conftest import audit_records
from standins import Standins, TokenEndpoint
from test_escape import launch, profile
from test_proxy import sh

pytestmark = pytest.mark.anyio

ALL = ["--toolsets", "inspect,manage,execute,teardown"]
NAMES = ["api.test", "token.test"]
PLACEHOLDER = re.compile(r"sandmux-cred-[0-9a-f]{32}")


def net(s, block):
    names = [f"{n}:{s.port}" for n in NAMES]
    pins = ", ".join(f'"{n}" = "127.0.0.1"' for n in NAMES)
    n = f'mode = "proxy"\nallow = {json.dumps(names)}\nallow_private = ["127.0.0.0/8"]\nhosts = {{ {pins} }}\nupstream_ca = ["{s.ca}"]'
    return lambda t: t.replace('mode = "none"', n) + block


def secret(p, value):
    """Writes a 0400 secret file (in place when it exists)."""
    if p.exists():
        os.chmod(p, 0o600)
    p.write_text(value + "\n")
    os.chmod(p, 0o400)


@pytest.fixture
def stand(tmp_path):
    s = Standins(tmp_path, names=NAMES)
    # Every Authorization the credential host has seen, echoed back: a host
    # that leaks old values too (they must reach the agent masked).
    def leak(h):
        seen = [hd.get("authorization", "") for _, p, hd in s.seen if p.startswith("/leak")]
        body = ("auth=" + " ".join(seen) + "\n").encode()
        s.send(h, 200, body, "text/plain")

    s.routes["/leak"] = leak
    s.start()
    yield s
    s.stop()


def authorizations(stand, since=0):
    return [hd.get("authorization", "") for _, p, hd in stand.seen[since:] if p.startswith("/leak")]


async def test_a_rotated_file_is_read_again_by_the_confined_supervisor(ws, stand):
    secrets_dir, elsewhere = ws[1] / "secrets", ws[1] / "elsewhere"
    for d in (secrets_dir, elsewhere):
        d.mkdir(mode=0o700)
    tok = secrets_dir / "token"
    values = ["v1_" + secrets.token_hex(16), "v2_" + secrets.token_hex(16), "v3_" + secrets.token_hex(16), "v4_" + secrets.token_hex(16)]
    secret(tok, values[0])
    block = f'\n[[credentials]]\nname = "API_TOKEN"\nsend_to = ["api.test"]\nfrom_file = "{tok}"\n'
    prof = profile(ws, "creds-file", net(stand, block))
    u = f"https://api.test:{stand.port}/leak"
    curl = f'curl -sS -H "Authorization: Bearer $API_TOKEN" {u}'
    errlog = open(ws[1] / "serve.err", "w")
    async with launch(ws, "-p", prof, *ALL, errlog=errlog) as c:
        r = await sh(c, curl)
        assert authorizations(stand)[-1] == f"Bearer {values[0]}", stand.seen
        # A rename over the file (how most tools rotate): the next request
        # carries the new value.
        (secrets_dir / "token.new").write_text(values[1] + "\n")
        os.chmod(secrets_dir / "token.new", 0o400)
        os.rename(secrets_dir / "token.new", tok)
        r = await sh(c, curl)
        assert authorizations(stand)[-1] == f"Bearer {values[1]}", (r, stand.seen[-1])
        # A rewrite in place (same inode).
        ino = tok.stat().st_ino
        secret(tok, values[2])
        assert tok.stat().st_ino == ino
        r = await sh(c, curl)
        assert authorizations(stand)[-1] == f"Bearer {values[2]}", (r, stand.seen[-1])
        # The host echoed every value it saw: each reaches the agent as the
        # placeholder, the old ones too.
        out = r["output"]
        assert out.count("Bearer sandmux-cred-") == 3 and not any(v in out for v in values), out
        # Positive control: the file swapped for a link into a directory no
        # rule covers (the rules are made at start from the file's
        # directories) fails as every rotation did before: 503, permission
        # denied, nothing sent, though the host reads it.
        secret(elsewhere / "token", values[3])
        n = len(stand.seen)
        tok.unlink()
        tok.symlink_to(elsewhere / "token")
        assert (elsewhere / "token").read_text().strip() == values[3]
        r = await sh(c, f"curl -sS -w ' http=%{{http_code}}' -H \"Authorization: Bearer $API_TOKEN\" {u}")
        assert "http=503" in r["output"] and "Permission denied" in r["output"] and "API_TOKEN" in r["output"], r
        assert len(stand.seen) == n, stand.seen[n:]
        # And it recovers once the file is back where the rules reach.
        tok.unlink()
        secret(tok, values[2])
        r = await sh(c, curl)
        assert authorizations(stand)[-1] == f"Bearer {values[2]}", (r, stand.seen[-1])
    errlog.close()
    for f in (ws[1] / "audit.jsonl", ws[1] / "serve.err"):
        assert not any(v in f.read_text() for v in values), f


REFRESH = r"""
import json, os, pathlib, subprocess, sys, time, urllib.error, urllib.parse, urllib.request
url, d = sys.argv[1], pathlib.Path(sys.argv[2])
(d / "env.json").write_text(json.dumps(sorted(os.environ)))
if (d / "hang").exists():
    p = subprocess.Popen(["sleep", "1000"])
    (d / "hang.pid").write_text(str(p.pid))
    time.sleep(1000)
data = urllib.parse.urlencode({"grant_type": "refresh_token", "refresh_token": os.environ["REFRESH_TOKEN"]}).encode()
try:
    r = urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10)
except urllib.error.HTTPError:
    sys.exit(1)
sys.stdout.write(r.read().decode())
"""


async def until(what, seconds=15):
    end = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < end, "timed out"
        await anyio.sleep(0.2)


def alive(pid):
    try:
        return " Z " not in open(f"/proc/{pid}/stat").read().split(")", 1)[1][:3]
    except OSError:
        return False


async def test_a_short_lived_token_from_a_host_command(ws, stand):
    """OAuth-style refresh end to end: the profile's command (run by the
    broker, outside the confined supervisor and the sandbox) trades a
    refresh token for short-lived access tokens at a stand-in token
    endpoint; the credential host accepts only live ones."""
    rt = "rt_" + secrets.token_hex(16)
    ep = TokenEndpoint(rt, expires_in=4)

    def api(h):
        a = h.headers.get("Authorization", "")
        seen = " ".join(hd.get("authorization", "") for _, p, hd in stand.seen if p.startswith("/api"))
        ok = a.startswith("Bearer ") and a[7:] in ep.valid
        stand.send(h, 200 if ok else 401, f"{'ok' if ok else 'bad token'} {a} seen={seen}\n".encode(), "text/plain")

    stand.routes["/api"] = api
    host = ws[1] / "cmd"
    host.mkdir(mode=0o700)
    (host / "refresh.py").write_text(REFRESH)
    cmd = json.dumps(["/usr/bin/python3", str(host / "refresh.py"), ep.url, str(host)])
    block = f'\n[[credentials]]\nname = "API_TOKEN"\nsend_to = ["api.test"]\nfrom_command = {cmd}\ncommand_env = {{ REFRESH_TOKEN = "{rt}" }}\ncommand_timeout_seconds = 3\n'
    prof = profile(ws, "creds-cmd", net(stand, block))
    u = f"https://api.test:{stand.port}/api"
    curl = f"curl -sS -w ' http=%{{http_code}}\\n' -H \"Authorization: Bearer $API_TOKEN\" {u}"
    last = lambda: [hd.get("authorization") for _, p, hd in stand.seen if p.startswith("/api")][-1]
    errlog = open(ws[1] / "serve.err", "w")
    try:
        async with launch(ws, "-p", prof, *ALL, errlog=errlog) as c:
            r = await sh(c, curl)
            assert "http=200" in r["output"] and last() == f"Bearer {ep.issued[0]}", (r, ep.issued)
            # The command's environment is the profile's: PATH, HOME and
            # command_env, nothing of sandmux's or the sandbox's.
            keys = set(json.loads((host / "env.json").read_text()))
            assert "REFRESH_TOKEN" in keys and keys <= {"PATH", "HOME", "REFRESH_TOKEN", "LC_CTYPE"}, keys
            # 1. Before the lifetime ends (4 s, refreshed at 80%).
            ep.expires_in = 300
            await until(lambda: len(ep.issued) >= 2, 10)
            r = await sh(c, curl)
            assert "http=200" in r["output"] and last() == f"Bearer {ep.issued[1]}", (r, ep.issued)
            # 2. A 401 (the endpoint revoked the live token): the agent gets
            # the 401, masked; one refresh per value, however many requests
            # carried it (the later ones may already carry the new value).
            ep.revoke()
            r = await sh(c, f"{curl}; {curl}; {curl}")
            assert r["output"].split("http=")[1].startswith("401") and not any(t in r["output"] for t in ep.issued), r
            await until(lambda: len(ep.issued) >= 3)
            await anyio.sleep(1.5)
            assert len(ep.issued) == 3, ep.issued
            r = await sh(c, curl)
            assert "http=200" in r["output"] and last() == f"Bearer {ep.issued[2]}", (r, ep.issued)
            out = r["output"]
            assert out.count("Bearer sandmux-cred-") >= 5 and not any(t in out for t in ep.issued + [rt]), out
            # 3. The refresh fails: closed (503, sandmux's reason, nothing
            # sent) until a retry succeeds.
            ep.fail = True
            ep.revoke()
            r = await sh(c, curl)
            assert "http=401" in r["output"], r
            await anyio.sleep(2)
            n = len(stand.seen)
            r = await sh(c, curl)
            assert "http=503" in r["output"] and "API_TOKEN" in r["output"] and "from_command failed" in r["output"], r
            assert len(stand.seen) == n
            ep.fail = False
            async def ok():
                r = await sh(c, curl)
                return "http=200" in r["output"]
            end = time.monotonic() + 15
            while not await ok():
                assert time.monotonic() < end, "no recovery"
                await anyio.sleep(1)
            assert last() == f"Bearer {ep.issued[-1]}" and len(ep.issued) == 4, ep.issued
            # 4. The command hangs: killed with its process group at the
            # time limit (3 s); 503 meanwhile and after; it recovers.
            (host / "hang").write_text("")
            ep.revoke()
            t0 = time.monotonic()
            r = await sh(c, curl)
            assert "http=401" in r["output"], r
            await until(lambda: (host / "hang.pid").exists(), 5)
            pid = int((host / "hang.pid").read_text())
            assert alive(pid)
            await until(lambda: not alive(pid), 8)
            assert time.monotonic() - t0 < 8
            r = await sh(c, curl)
            assert "http=503" in r["output"] and "did not finish within 3 s" in r["output"], r
            (host / "hang").unlink()
            end = time.monotonic() + 20
            while not await ok():
                assert time.monotonic() < end, "no recovery after the hang"
                await anyio.sleep(1)
            # Never inside: the refresh token and the command.
            # (The patterns do not match their own command line; the
            # control runs the same search over a process that holds both.)
            pat = f"-e '{rt[:6]}[{rt[6]}]{rt[7:]}' -e 'refresh[.]py'"
            find = f"cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c {pat}"
            r = await sh(c, find)
            assert [l for l in r["output"].split() if l.isdigit()][-1] == "0", r
            r = await sh(c, f"X={rt} sh -c 'sleep 5' refresh.py & sleep 0.3; {find}; kill %1")
            assert [l for l in r["output"].split() if l.isdigit()][-1] != "0", r
    finally:
        errlog.close()
        ep.stop()
    recs = [x for x in audit_records(ws) if x["tool"] == "(credentials)"]
    kinds = [(x["error_type"], x["args"].get("why")) for x in recs]
    assert ("credential_refreshed", "its lifetime") in kinds, kinds
    assert ("credential_refreshed", "a 401 from a credential host") in kinds, kinds
    assert ("credential_refreshed", "a retry after a failure") in kinds, kinds
    failed = [x["args"]["error"] for x in recs if x["error_type"] == "credential_refresh_failed"]
    assert any("failed (exit status: 1)" in e for e in failed) and any("did not finish within 3 s" in e for e in failed), failed
    for f in (ws[1] / "audit.jsonl", ws[1] / "serve.err"):
        text = f.read_text()
        assert not any(t in text for t in ep.issued + [rt]), f
