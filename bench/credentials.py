#!/usr/bin/env python3
"""The cost of credential brokering (`[[credentials]]`): requests to a host
the proxy intercepts for a credential, side by side with the same requests
to a host it only tunnels, from inside `sandmux run`, and the memory of the
process that serves the proxy (for `run`, sandmux itself) while they run.

The server is a threaded HTTP/1.1 server (keep-alive) on the host's
loopback with a certificate from a CA made now, answering 16 bytes and
nothing else; it serves both names, `cred.test` (the credential's host: the
proxy ends TLS, puts the value into `Authorization`, masks the answer) and
`plain.test` (a plain CONNECT tunnel). The client (standard library only)
sends `Authorization: Bearer $TOKEN` either way. Per host and round:

  sequential  N requests, each on a fresh connection (CONNECT, TLS, GET)
  kept-alive  N requests on one connection
  concurrent  32 threads sharing N requests, fresh connections

Rounds alternate the hosts. Reported: the median per request (ms) of each
shape and host, their paired ratio (median of per-round ratios), and the
proxy process's RSS before, at its peak (sampled every 20 ms) and after.
Times are never asserted on.

Usage: bench/credentials.py --sandmux-bin PATH [--requests N] [--rounds N]
Prints a markdown table; writes bench/out/credentials.json.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CLIENT = r'''
import json, os, socket, ssl, sys, threading, time
port, n, host = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
tok = os.environ["BENCH_TOKEN"]
ctx = ssl.create_default_context()
# The tunnelled host's certificate is the bench server's own.
ctx.load_verify_locations(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-ca.pem"))
def conn():
    s = socket.create_connection(("127.0.0.1", 3128))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(1024)
    assert got.startswith(b"HTTP/1.1 200"), got
    return ctx.wrap_socket(s, server_hostname=host)
def get(t):
    t.sendall(f"GET /x HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {tok}\r\n\r\n".encode())
    got = b""
    while True:
        got += t.recv(65536)
        head, sep, body = got.partition(b"\r\n\r\n")
        if not sep:
            continue
        if b"chunked" in head.lower():
            if body.endswith(b"0\r\n\r\n"):
                break
        elif len(body) >= 16:
            break
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
def fresh(k):
    for _ in range(k):
        t = conn()
        get(t)
        t.close()
out = {}
t0 = time.perf_counter(); fresh(n); out["sequential"] = (time.perf_counter() - t0) / n
t = conn(); t0 = time.perf_counter()
for _ in range(n):
    get(t)
out["kept-alive"] = (time.perf_counter() - t0) / n
t.close()
th = [threading.Thread(target=fresh, args=(n // 32,)) for _ in range(32)]
t0 = time.perf_counter()
for x in th: x.start()
for x in th: x.join()
out["concurrent"] = (time.perf_counter() - t0) / (n // 32 * 32)
print("RESULT " + json.dumps(out))
'''

SERVER = r'''
import http.server, socket, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "16")
        self.end_headers()
        self.wfile.write(b"0123456789abcdef")
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    def get_request(self):
        c, a = self.socket.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c, a
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s = S(("127.0.0.1", 0), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


def make_ca(d):
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=cred.test")
    (d / "ext").write_text("subjectAltName=DNS:cred.test,DNS:plain.test\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "ext")


def rss_kib(pid, field="VmRSS"):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def one(args, d, prof, port, host, rounds_out):
    env = {**os.environ, "BENCH_REAL": "bench-real-token-value-0123456789"}
    p = subprocess.Popen([args.sandmux_bin, "run", "-q", "-p", str(prof), "-w", str(d / "ws"), "--", "python3", str(d / "ws" / "client.py"), str(port), str(args.requests), host], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    base = rss_kib(p.pid)
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], rss_kib(p.pid))
            except OSError:
                return
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = p.communicate(timeout=600)
    done.set()
    line = next((l for l in out.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"the client failed ({host}):\n{out}\n{err}")
    r = json.loads(line[7:])
    r["rss_before_kib"], r["rss_peak_kib"] = base, peak[0]
    rounds_out.setdefault(host, []).append(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    d = pathlib.Path(tempfile.mkdtemp(prefix="sandmux-bench-cred-"))
    (d / "ws").mkdir()
    make_ca(d)
    (d / "ws" / "client.py").write_text(CLIENT)
    (d / "ws" / "bench-ca.pem").write_bytes((d / "ca.pem").read_bytes())
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(d / "srv.pem"), str(d / "srv.key")], stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())
    base = subprocess.run([args.sandmux_bin, "profile", "show", "default"], capture_output=True, text=True, check=True).stdout
    net = (f'mode = "proxy"\nallow = ["cred.test:{port}", "plain.test:{port}"]\nallow_private = ["127.0.0.0/8"]\n'
           f'hosts = {{ "cred.test" = "127.0.0.1", "plain.test" = "127.0.0.1" }}\nupstream_ca = ["{d / "ca.pem"}"]\nproxy_connections = 256')
    text = base.replace('mode = "none"', net) + '\n[[credentials]]\nname = "BENCH_TOKEN"\nsend_to = ["cred.test"]\nfrom_env = "BENCH_REAL"\n'
    prof = d / "bench.toml"
    prof.write_text(text)
    rounds = {}
    try:
        for i in range(args.rounds):
            hosts = ["cred.test", "plain.test"] if i % 2 == 0 else ["plain.test", "cred.test"]
            for h in hosts:
                one(args, d, prof, port, h, rounds)
    finally:
        srv.terminate()
    shapes = ["sequential", "kept-alive", "concurrent"]
    rows, summary = [], {}
    for s in shapes:
        c = [r[s] * 1000 for r in rounds["cred.test"]]
        p = [r[s] * 1000 for r in rounds["plain.test"]]
        ratio = statistics.median([a / b for a, b in zip(c, p)])
        summary[s] = {"intercepted_ms": statistics.median(c), "tunnelled_ms": statistics.median(p), "ratio": ratio}
        rows.append(f"| {s} ({args.requests} requests) | {statistics.median(c):.2f} ms | {statistics.median(p):.2f} ms | {ratio:.2f}x |")
    mem = {h: {"before_kib": statistics.median(r["rss_before_kib"] for r in v), "peak_kib": statistics.median(r["rss_peak_kib"] for r in v)} for h, v in rounds.items()}
    summary["memory"] = mem
    print(f"rounds: {args.rounds}, requests per shape: {args.requests}\n")
    print("| shape | intercepted (cred.test) | tunnelled (plain.test) | ratio |\n|---|---|---|---|")
    print("\n".join(rows))
    print("\n| proxy process (`sandmux run`) RSS | before | peak |\n|---|---|---|")
    for h, m in mem.items():
        print(f"| {h} | {m['before_kib'] / 1024:.1f} MiB | {m['peak_kib'] / 1024:.1f} MiB |")
    out = pathlib.Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "credentials.json").write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
