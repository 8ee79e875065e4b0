#!/usr/bin/env python3
"""The allowlist proxy's cost (network mode `proxy`): added latency per
connection and throughput, through the proxy from inside `sandmux run`
against the same client directly on the host's loopback.

The server is `openssl s_server -WWW` on 127.0.0.1 with a certificate from a
CA made now, serving a small file and a large one. The client (CLIENT below,
standard library only) runs the same code in both places:

  latency     N fresh connections, one after the other: (CONNECT through the
              proxy,) TLS handshake, GET of a 16-byte file, read to the end;
              the median and p90 per connection
  throughput  curl's GET of a 256 MiB file over one connection (curl's
              own figure, `%{speed_download}`; a C client, so the client is
              not the bottleneck); MiB/s

Inside, the client reaches the server by the pinned name `bench.test`
(`hosts`, `allow_private = ["127.0.0.0/8"]`); on the host it dials
127.0.0.1 directly with the same SNI. Times are never asserted on.

Usage: bench/proxy.py --sandmux-bin PATH [--connections N] [--mib N] [--rounds N]
Prints a markdown table.
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CLIENT = r'''
import json, socket, ssl, statistics, sys, time
host, port, ca, n, via = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
ctx = ssl.create_default_context(cafile=ca)
def conn():
    if via == "proxy":
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(f"CONNECT bench.test:{port} HTTP/1.1\r\nHost: bench.test:{port}\r\n\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(1024)
        assert got.startswith(b"HTTP/1.1 200"), got
    else:
        s = socket.create_connection((host, port))
    return ctx.wrap_socket(s, server_hostname="bench.test")
def get(path):
    t = conn()
    t.sendall(f"GET /{path} HTTP/1.0\r\n\r\n".encode())
    total = 0
    while True:
        b = t.recv(1 << 16)
        if not b:
            break
        total += len(b)
    t.close()
    return total
lat = []
for _ in range(n):
    t0 = time.perf_counter()
    get("small.txt")
    lat.append(time.perf_counter() - t0)
print(json.dumps({"lat": lat}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandmux-bin", required=True)
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    d = pathlib.Path(os.path.realpath(tempfile.mkdtemp(prefix="sandmux-bench-proxy-")))
    try:
        run(a, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run(a, d):
    www = d / "www"
    www.mkdir()
    ssl_ = lambda *x: subprocess.run(["openssl", *x], check=True, capture_output=True, cwd=d)
    ssl_("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench CA")
    ssl_("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=bench.test")
    (d / "ext").write_text("subjectAltName=DNS:bench.test\n")
    ssl_("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "ext")
    (www / "small.txt").write_text("0123456789abcde\n")
    with open(www / "big.bin", "wb") as f:
        f.truncate(a.mib << 20)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen(["openssl", "s_server", "-quiet", "-WWW", "-accept", f"127.0.0.1:{port}", "-cert", str(d / "srv.pem"), "-key", str(d / "srv.key")], cwd=www, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        ws = d / "ws"
        ws.mkdir()
        shutil.copy(d / "ca.pem", ws / "ca.pem")
        (ws / "client.py").write_text(CLIENT)
        base = subprocess.run([a.sandmux_bin, "profile", "show", "ci"], capture_output=True, text=True, check=True).stdout
        prof = d / "bench-proxy.toml"
        prof.write_text(base.replace('mode = "loopback"', f'mode = "proxy"\nallow = ["bench.test:{port}"]\nallow_private = ["127.0.0.0/8"]\nhosts = {{ "bench.test" = "127.0.0.1" }}'))
        py = "/usr/bin/python3"
        res = {"direct": [], "proxy": []}
        for r in range(a.rounds):
            for via in (["direct", "proxy"] if r % 2 == 0 else ["proxy", "direct"]):
                args = ["client.py", "127.0.0.1", str(port), "ca.pem", str(a.connections), via]
                if via == "direct":
                    cmd = [py, *args]
                else:
                    cmd = [a.sandmux_bin, "run", "-p", str(prof), "-w", str(ws), "--", py, *args]
                out = subprocess.run(cmd, cwd=ws, capture_output=True, text=True, check=True).stdout
                got = json.loads(out.strip().splitlines()[-1])
                curl = ["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}", "--cacert", "ca.pem", f"https://bench.test:{port}/big.bin"]
                if via == "direct":
                    cmd = curl[:1] + ["--resolve", f"bench.test:{port}:127.0.0.1"] + curl[1:]
                else:
                    cmd = [a.sandmux_bin, "run", "-p", str(prof), "-w", str(ws), "--", *curl]
                got["bps"] = float(subprocess.run(cmd, cwd=ws, capture_output=True, text=True, check=True).stdout)
                res[via].append(got)
        report(a, res)
    finally:
        srv.kill()
        srv.wait()


def report(a, res):
    rows = {}
    for via, runs in res.items():
        lat = sorted(x for r in runs for x in r["lat"])
        mibs = [r["bps"] / (1 << 20) for r in runs]
        rows[via] = (statistics.median(lat) * 1e3, lat[int(len(lat) * 0.9)] * 1e3, statistics.median(mibs))
    print(f"{a.rounds} rounds, {a.connections} connections each, {a.mib} MiB download; python {sys.version.split()[0]} client (latency), curl (throughput), openssl s_server -WWW\n")
    print("| path | connection + TLS + small GET, median | p90 | throughput, median |")
    print("|---|---|---|---|")
    for via, (med, p90, mibs) in rows.items():
        print(f"| {via} | {med:.2f} ms | {p90:.2f} ms | {mibs:.0f} MiB/s |")
    d, p = rows["direct"], rows["proxy"]
    print(f"\nadded by the proxy: {p[0] - d[0]:+.2f} ms per connection (median), throughput {100 * (p[2] / d[2] - 1):+.0f} %")


if __name__ == "__main__":
    main()
