"""A child's output read line by line in large reads (Python's readline on an
unbuffered pipe reads one byte per system call). Shared by bench/curves.py and
bench/mcp_latency.py."""

import os


class Lines:
    def __init__(self, fd: int, what: str, error: type[Exception]):
        self.fd, self.what, self.error, self.buf = fd, what, error, b""

    def next(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                raise self.error(f"{self.what}: closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line
