"""Network mode `proxy`: the proxy resolves an allowed name as that name
only, never with the host resolver's `search` domains appended. The host's
resolver is made hostile in a private mount namespace: a `resolv.conf` with
`search corp.example` (and ndots:5, as in Kubernetes, so the search list is
tried first) pointing at a stub name server on 127.0.0.1:53 that answers
every `*.corp.example` name with 127.0.0.1 and nothing else. `sandmux run`
with `*.wild.test` allowed is started in that namespace; from inside, curl
asks for `x.wild.test` through the proxy. Positive control: in the same run
an allowed `*.corp.example` name resolves through the stub and its request
reaches the listener."""

import os
import shutil
import socket
import struct
import subprocess
import threading

import pytest

import shlex

from conftest import BIN
from standins import Canary
from test_escape import host_ipv4

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root (a private mount namespace and port 53)",
)


class StubDns:
    """Answers A queries for names under `zone` with `ip` (127.0.0.1 unless
    told), NXDOMAIN for everything else; records the names asked."""

    def __init__(self, zone, ip="127.0.0.1"):
        self.zone, self.ip, self.asked = zone, ip, []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 53))
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                q, a = self.sock.recvfrom(512)
            except OSError:
                return
            if len(q) < 13:
                return
            i, labels = 12, []
            while q[i]:
                labels.append(q[i + 1 : i + 1 + q[i]].decode())
                i += 1 + q[i]
            name, qtype, end = ".".join(labels), struct.unpack(">H", q[i + 1 : i + 3])[0], i + 5
            self.asked.append(name)
            hit = name.endswith("." + self.zone)
            ans = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(self.ip) if hit and qtype == 1 else b""
            flags = b"\x81\x80" if hit else b"\x81\x83"
            self.sock.sendto(q[:2] + flags + struct.pack(">HHHH", 1, 1 if ans else 0, 0, 0) + q[12:end] + ans, a)

    def close(self):
        # Wakes the thread blocked in recvfrom (close alone would not, and
        # port 53 would stay bound for the next test).
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def test_search_domains_never_complete_an_allowed_name(tmp_path):
    try:
        dns = StubDns("corp.example")
    except OSError as e:
        pytest.skip(f"cannot bind 127.0.0.1:53: {e}")
    listener = Canary("127.0.0.1")
    port = listener.port
    try:
        resolv = tmp_path / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\nsearch corp.example\noptions ndots:5 timeout:1 attempts:1\n")
        base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
        allow = [f"*.wild.test:{port}", f"*.corp.example:{port}"]
        prof = tmp_path / "resolver.toml"
        prof.write_text(base.replace('mode = "none"', f'mode = "proxy"\nallow = {allow!r}\nallow_private = ["127.0.0.0/8"]'.replace("'", '"')))
        ws = tmp_path / "ws"
        ws.mkdir()
        script = (
            f"curl -s -m 10 -o /dev/null -w 'wild=%{{http_code}}\\n' http://x.wild.test:{port}/; "
            f"curl -s -m 10 -o /dev/null -w 'corp=%{{http_code}}\\n' http://y.corp.example:{port}/; true"
        )
        inner = f"mount --bind {resolv} /etc/resolv.conf && exec \"$0\" run -p {prof} -w {ws} -- bash -c \"$1\""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        env["XDG_STATE_HOME"] = str(tmp_path / "state")
        r = subprocess.run(["unshare", "-m", "sh", "-c", inner, BIN, script], capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
        out = r.stdout + r.stderr
        # The control: a corp.example name resolved through the stub, and its request arrived.
        assert any(b"y.corp.example" in s for s in listener.seen), (listener.seen, out)
        assert any(n.startswith("y.corp.example") for n in dns.asked), (dns.asked, out)
        # The attack: x.wild.test is not completed to x.wild.test.corp.example.
        assert not any(b"x.wild.test" in s for s in listener.seen), (listener.seen, out)
        assert "x.wild.test.corp.example" not in dns.asked, (dns.asked, out)
        assert "wild=502" in out, out
    finally:
        dns.close()
        listener.close()


def test_check_on_a_mirror_network_through_a_stand_in_name_server(tmp_path):
    """The mirror fix through the host's resolver, not a `hosts` pin: a stub
    name server answers `*.mirror.example` with a host interface address in
    a refused range (a stand-in mirror listens there) and nothing else.
    `check` fails naming the fix; the fix, run as printed in the same
    resolver's namespace, writes the `/32`s; `check` with the profile it
    wrote passes but for the one name that resolves nowhere: exit 4, a
    warning. The mirror sees no dial before the fix (the control for the
    dials after it)."""
    import ipaddress
    hip = host_ipv4()
    ip = ipaddress.ip_address(hip)
    if ip.is_global or ip.is_loopback or ip.is_link_local:
        pytest.skip(f"no host interface address in a refused, non-loopback range (found {hip})")
    try:
        dns = StubDns("mirror.example", hip)
    except OSError as e:
        pytest.skip(f"cannot bind 127.0.0.1:53: {e}")
    mirror = Canary(hip)
    port = mirror.port
    try:
        resolv = tmp_path / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        base = subprocess.run([BIN, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
        allow = [f"pypi.mirror.example:{port}", f"files.mirror.example:{port}", f"gone.sandmux.invalid:{port}"]
        prof = tmp_path / "dnsmirror.toml"
        prof.write_text(base.replace('mode = "none"', f'mode = "proxy"\nallow = {allow!r}'.replace("'", '"')))
        ws = tmp_path / "ws"
        ws.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))

        def inside(argv):
            inner = f"mount --bind {resolv} /etc/resolv.conf && exec \"$@\""
            return subprocess.run(["unshare", "-m", "sh", "-c", inner, "sh", *argv], capture_output=True, text=True, timeout=120, env=env, cwd=ws, stdin=subprocess.DEVNULL)

        def as_printed(line):
            argv = shlex.split(line)
            assert argv[0] == "sandmux", line
            return inside([BIN, *argv[1:]])

        r = inside([BIN, "check", "-p", str(prof)])
        assert r.returncode == 1 and "the fix is above" in r.stdout, r.stdout + r.stderr
        assert f"WARNING gone.sandmux.invalid:{port}" in r.stdout, r.stdout
        assert f'{{ name = "pypi.mirror.example:{port}", ranges = ["{hip}/32"] }},' in r.stdout, r.stdout
        assert mirror.seen == [] and "pypi.mirror.example" in dns.asked, (mirror.seen, dns.asked)
        fix = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("sandmux profile mirror ")]
        w = as_printed(fix[0])
        assert w.returncode == 0, w.stdout + w.stderr
        use = [l.split("use it: ", 1)[1].split("   ")[0] for l in w.stdout.splitlines() if l.startswith("use it: ")]
        g = as_printed(use[0])
        assert g.returncode == 4 and "every probe matched the profile" in g.stdout, g.stdout + g.stderr
        assert f"ok      pypi.mirror.example:{port}: connected to {hip}:{port}" in g.stdout, g.stdout
        assert len(mirror.seen) == 2, mirror.seen
    finally:
        dns.close()
        mirror.close()
