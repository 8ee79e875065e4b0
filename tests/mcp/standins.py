"""Local HTTPS stand-ins for registries, for the proxy tests: a test CA made
at run time with the openssl CLI, and one threaded HTTPS server on the
host's loopback that serves, by name (SNI and Host), a static tree, a git
repository over smart HTTP (`git http-backend` as CGI), a PEP 503 simple
index with a real wheel, and an npm registry document with its tarball.
It counts the connections it accepts (a host-side checker)."""

import base64
import hashlib
import http.server
import io
import json
import os
import pathlib
import socket
import ssl
import subprocess
import tarfile
import threading
import zipfile

NAMES = ["files.test", "git.test", "pypi.test", "npm.test"]


def make_ca(d, names=NAMES):
    """A CA and a server certificate for `names`, both made now."""
    d = pathlib.Path(d)
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=sandmux test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=" + names[0])
    (d / "ext").write_text("subjectAltName=" + ",".join("DNS:" + n for n in names) + "\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "ext")
    return d / "ca.pem", d / "srv.pem", d / "srv.key"


def make_wheel(d, name="sandmuxdemo", version="1.0"):
    """A real, minimal pure-Python wheel."""
    fn = f"{name}-{version}-py3-none-any.whl"
    di = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"MESSAGE = 'installed through the proxy'\n",
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sandmux-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    rec = []
    for p, b in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
        rec.append(f"{p},sha256={h},{len(b)}")
    rec.append(f"{di}/RECORD,,")
    files[f"{di}/RECORD"] = ("\n".join(rec) + "\n").encode()
    with zipfile.ZipFile(pathlib.Path(d) / fn, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
    return fn


def make_npm(d, port, name="sandmux-demo", version="1.0.0"):
    """An npm registry document and its tarball."""
    buf = io.BytesIO()
    pkg = json.dumps({"name": name, "version": version, "main": "index.js"}).encode()
    idx = b"module.exports = 'installed through the proxy';\n"
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for p, b in (("package/package.json", pkg), ("package/index.js", idx)):
            i = tarfile.TarInfo(p)
            i.size = len(b)
            i.mode = 0o644
            t.addfile(i, io.BytesIO(b))
    tgz = buf.getvalue()
    tname = f"{name}-{version}.tgz"
    (pathlib.Path(d) / tname).write_bytes(tgz)
    doc = {
        "name": name,
        "dist-tags": {"latest": version},
        "versions": {version: {
            "name": name, "version": version,
            "dist": {
                "tarball": f"https://npm.test:{port}/{name}/-/{tname}",
                "shasum": hashlib.sha1(tgz).hexdigest(),
                "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode(),
            },
        }},
    }
    return doc, tname


def make_repo(d):
    """A bare repository with one commit, for `git http-backend`."""
    d = pathlib.Path(d)
    src = d / "src"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(d)}
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True, env=env)
    (src / "README").write_text("cloned through the proxy\n")
    subprocess.run(["git", "-C", str(src), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "commit", "-qm", "one"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(d / "git" / "repo.git")], check=True, env=env)
    return d / "git"


class Standins:
    """The HTTPS stand-in server (start with `start()`, stop with `stop()`)."""

    def __init__(self, d, names=NAMES):
        self.dir = pathlib.Path(d)
        self.ca, cert, key = make_ca(self.dir, names)
        # Every request's host and headers (the credential tests read them),
        # extra routes by path prefix, and whether a push needs a login.
        self.seen = []
        self.routes = {}
        self.push_needs_login = False
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.accepted = 0
        # What went wrong in a request's thread (a failed handshake, …).
        self.errors = []
        self.requests = []
        (self.dir / "www").mkdir()
        (self.dir / "www" / "hello.txt").write_text("hello through the proxy\n")
        self.git = make_repo(self.dir)
        self.wheel = make_wheel(self.dir / "www")
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def setup(self):
                self.request.do_handshake()
                super().setup()

            def do_GET(self):
                outer.requests.append((self.headers.get("Host", ""), self.command, self.path))
                outer.seen.append((self.headers.get("Host", "").split(":")[0], self.path, {k.lower(): v for k, v in self.headers.items()}))
                outer.route(self)

            do_POST = do_GET

        class S(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self):
                s, a = self.socket.accept()
                outer.accepted += 1
                # The handshake runs in the request's thread (the handler's
                # setup): one slow or broken client never holds up the
                # accept loop.
                return outer.ctx.wrap_socket(s, server_side=True, do_handshake_on_connect=False), a

            def handle_error(self, request, client_address):
                outer.errors.append(repr(__import__("sys").exc_info()[1]))

        self.srv = S(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        self.npm_doc, self.npm_tgz = make_npm(self.dir / "www", self.port)

    def start(self):
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()

    def route(self, h):
        host = h.headers.get("Host", "").split(":")[0]
        for prefix, f in self.routes.items():
            if h.path.startswith(prefix):
                return f(h)
        if host == "git.test":
            return self.cgi(h)
        if host == "pypi.test" and h.path.rstrip("/") == "/simple/sandmuxdemo":
            body = f'<html><body><a href="/{self.wheel}">{self.wheel}</a></body></html>'.encode()
            return self.send(h, 200, body, "text/html")
        if host == "npm.test" and h.path == "/sandmux-demo":
            return self.send(h, 200, json.dumps(self.npm_doc).encode(), "application/json")
        if host == "npm.test" and h.path.endswith(".tgz"):
            h.path = "/" + self.npm_tgz
        p = (self.dir / "www" / h.path.lstrip("/").split("?")[0]).resolve()
        if p.is_file() and p.is_relative_to(self.dir / "www"):
            return self.send(h, 200, p.read_bytes(), "application/octet-stream")
        self.send(h, 404, b"not here\n", "text/plain")

    def send(self, h, code, body, ctype):
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def cgi(self, h):
        """`git http-backend`, as CGI."""
        path, _, query = h.path.partition("?")
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        login = h.headers.get("Authorization")
        if self.push_needs_login and "receive-pack" in h.path and not login:
            h.send_response(401)
            h.send_header("WWW-Authenticate", 'Basic realm="stand-in"')
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": str(self.git), "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": h.command,
            "CONTENT_TYPE": h.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
            "GIT_PROTOCOL": h.headers.get("Git-Protocol", ""), "REMOTE_ADDR": "127.0.0.1",
        }
        if self.push_needs_login and login:
            env["REMOTE_USER"] = "pusher"
        out = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                headers.append((k, v.strip()))
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(rest)))
        h.end_headers()
        h.wfile.write(rest)


class Canary:
    """A plain TCP listener that records every connection (nothing may reach it)."""

    def __init__(self, ip="127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
        self.sock.bind((ip, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.seen = []
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                c, a = self.sock.accept()
            except OSError:
                return
            c.settimeout(1)
            try:
                self.seen.append(c.recv(64))
            except OSError:
                self.seen.append(b"")
            c.close()

    def close(self):
        self.sock.close()


class TokenEndpoint:
    """A stand-in OAuth token endpoint (plain HTTP on the host's loopback):
    a POST with `grant_type=refresh_token` and the right `refresh_token`
    gets a fresh access token as a token response (`access_token`,
    `expires_in`). `valid` holds the tokens the credential host accepts
    (`revoke()` empties it); `fail` answers 400 invalid_grant; `issued`
    lists every token handed out."""

    def __init__(self, refresh_token, expires_in=3600):
        import secrets as _s
        self.refresh_token = refresh_token
        self.expires_in = expires_in
        self.fail = False
        self.issued = []
        self.valid = set()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                form = dict(p.split("=", 1) for p in self.rfile.read(n).decode().split("&") if "=" in p)
                ok = form.get("grant_type") == "refresh_token" and form.get("refresh_token") == outer.refresh_token
                if outer.fail or not ok:
                    code, doc = 400, {"error": "invalid_grant"}
                else:
                    tok = f"at{len(outer.issued) + 1}_" + _s.token_hex(16)
                    outer.issued.append(tok)
                    outer.valid.add(tok)
                    code, doc = 200, {"access_token": tok, "token_type": "Bearer", "expires_in": outer.expires_in}
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/token"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def revoke(self):
        self.valid.clear()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


class SandboxRouter:
    """A stand-in for agent-sandbox's sandbox-router (v0.5.6,
    sandbox-router/proxy/{proxy,headers,target}.go), in front of `serve
    --http`. Like the real one it: reads X-Sandbox-ID (a DNS label),
    X-Sandbox-Namespace (default "default"), X-Sandbox-Port (default 8888)
    and X-Sandbox-Pod-IP; dials the pod IP or
    `<id>.<namespace>.svc.cluster.local` (resolved here through `dns`, the
    test's cluster DNS) and sends that host and port as Host; strips
    Authorization (the router's own credential) and the client's
    X-Forwarded-For, sets X-Forwarded-For/Host/Proto; streams the response
    as it comes (SSE); gives up on a request after `timeout` seconds (180 by
    default: before the response's headers a 502, after them the
    connection is cut) and on headers after `header_timeout` (30).
    `forwarded` keeps the headers each forwarded request carried, `cuts`
    the method of each answer cut off by the timeout."""

    def __init__(self, dns=None, timeout=180.0, header_timeout=30.0, inject=None):
        self.dns = dict(dns or {})
        # Headers added to every request as it arrives (the client's
        # configured headers, for a client that cannot send any: the
        # conformance suite).
        self.inject = dict(inject or {})
        self.timeout, self.header_timeout = timeout, header_timeout
        self.forwarded = []
        # The method of each request whose answer was cut off mid-stream.
        self.cuts = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.proxy(self)

            do_POST = do_DELETE = do_GET

        class S(http.server.ThreadingHTTPServer):
            daemon_threads = True

        self.srv = S(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

    @staticmethod
    def error(h, status, detail):
        body = json.dumps({"detail": detail}).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def target(self, h):
        import ipaddress
        import re

        label = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
        sid, ns = h.headers.get("X-Sandbox-ID", ""), h.headers.get("X-Sandbox-Namespace") or "default"
        if not sid:
            return None, "X-Sandbox-ID header is required."
        if not label.fullmatch(sid) or not label.fullmatch(ns):
            return None, "Invalid sandbox ID format."
        port = h.headers.get("X-Sandbox-Port") or "8888"
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            return None, "Invalid port format."
        ip = h.headers.get("X-Sandbox-Pod-IP")
        if ip:
            # --allow-loopback-pod-ip: the tests' pods are on loopback.
            a = ipaddress.ip_address(ip)
            if a.is_link_local or a.is_multicast or a.is_unspecified:
                return None, "Invalid target IP address."
            return (ip, ip, int(port)), None
        name = f"{sid}.{ns}.svc.cluster.local"
        return (name, self.dns.get(name), int(port)), None

    def proxy(self, h):
        import http.client
        import time

        t0 = time.monotonic()
        for k, v in self.inject.items():
            del h.headers[k]
            h.headers[k] = v
        t, err = self.target(h)
        if err:
            return self.error(h, 400, err)
        host, ip, port = t
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else None
        hop = {"host", "authorization", "x-forwarded-for", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection"}
        out = [(k, v) for k, v in h.headers.items() if k.lower() not in hop]
        out += [("Host", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"), ("X-Forwarded-For", h.client_address[0]), ("X-Forwarded-Host", h.headers.get("Host", "")), ("X-Forwarded-Proto", "http")]
        self.forwarded.append({k.lower(): v for k, v in out})
        if ip is None:
            return self.error(h, 502, f"Could not connect to the backend sandbox: {h.headers.get('X-Sandbox-ID')}")
        left = lambda: self.timeout - (time.monotonic() - t0)
        c = http.client.HTTPConnection(ip, port, timeout=max(0.01, min(left(), self.header_timeout)))
        try:
            c.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for k, v in out:
                c.putheader(k, v)
            c.endheaders(body)
            r = c.getresponse()
        except OSError:
            c.close()
            return self.error(h, 502, f"Could not connect to the backend sandbox: {h.headers.get('X-Sandbox-ID')}")
        h.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in hop | {"content-length"}:
                h.send_header(k, v)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            while True:
                if left() <= 0:
                    raise TimeoutError
                c.sock.settimeout(left())
                chunk = r.read1(65536)
                if not chunk:
                    break
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (TimeoutError, OSError):
            # Mid-stream: Go's ReverseProxy aborts the response.
            self.cuts.append(h.command)
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        finally:
            c.close()
