"""A loopback relay that adds `Authorization: Bearer <token>` to every request
and passes everything else (Host, Origin, the body, the streamed answer)
through unchanged: the conformance suite has no option for a token, and
sandmux serves nothing without one. Usage: bearer_proxy.py LISTEN_PORT
TARGET_PORT TOKEN_FILE (loopback only; ends with its parent's SIGTERM)."""

import http.client
import http.server
import sys

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection"}


class Relay(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def relay(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        up = http.client.HTTPConnection("127.0.0.1", TARGET, timeout=120)
        up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for k, v in self.headers.items():
            if k.lower() not in HOP and k.lower() != "authorization":
                up.putheader(k, v)
        up.putheader("Authorization", f"Bearer {TOKEN}")
        if body is not None:
            up.putheader("Content-Length", str(len(body)))
        up.endheaders(body)
        r = up.getresponse()
        self.send_response_only(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while chunk := r.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            up.close()

    do_GET = do_POST = do_DELETE = do_PUT = do_OPTIONS = relay


if __name__ == "__main__":
    LISTEN, TARGET = int(sys.argv[1]), int(sys.argv[2])
    TOKEN = open(sys.argv[3]).read().strip()
    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # a client that hangs up mid-stream is no error here

    srv = Server(("127.0.0.1", LISTEN), Relay)
    srv.daemon_threads = True
    srv.serve_forever()
