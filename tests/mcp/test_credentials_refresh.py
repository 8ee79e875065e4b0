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
import subprocess

import pytest

from conftest import audit_records
from standins import Standins
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
