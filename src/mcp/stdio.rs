//! The MCP stdio transport. tokio's `stdin()`/`stdout()` hand every read and
//! write to its blocking thread pool, a thread hop each way per message. MCP
//! clients spawn servers with pipes or a Unix socket pair on stdin/stdout, and
//! those can be registered with the reactor instead; anything else (a terminal,
//! a file) keeps tokio's portable handles.
//!
//! Incoming lines are screened before rmcp sees them: rmcp drops a line that
//! is not JSON without a word, which would leave the client waiting and the
//! call out of the audit log (P7). A line that does not parse (or is longer
//! than [`MAX_LINE`]) is replaced by a `sandmux/unparseable` request with the
//! same id (the server answers it with a JSON-RPC parse error and audits it),
//! or by a notification of that name when no id can be read from it.

use sha2::{Digest, Sha256};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The read half of the transport.
pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of the transport.
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// stdin and stdout as an MCP transport. Must be called inside the runtime.
pub fn transport() -> (Reader, Writer) {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let r = match own(stdin.as_fd()) {
        Some((fd, Kind::Pipe)) => tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
            .ok()
            .map(|p| Box::new(p) as Reader),
        Some((fd, Kind::Socket)) => socket(fd).map(|s| Box::new(s) as Reader),
        None => None,
    };
    let w = match own(stdout.as_fd()) {
        Some((fd, Kind::Pipe)) => tokio::net::unix::pipe::Sender::from_owned_fd(fd)
            .ok()
            .map(|p| Box::new(p) as Writer),
        Some((fd, Kind::Socket)) => socket(fd).map(|s| Box::new(s) as Writer),
        None => None,
    };
    let r = r.unwrap_or_else(|| Box::new(tokio::io::stdin()));
    (
        Box::new(Screened::new(r)),
        w.unwrap_or_else(|| Box::new(tokio::io::stdout())),
    )
}

/// The longest line passed on (a call's input is capped far lower).
pub const MAX_LINE: usize = 8 << 20;

/// The method a line that did not parse is turned into.
pub const UNPARSEABLE: &str = "sandmux/unparseable";

/// A reader that passes whole lines that parse as JSON and replaces the rest.
pub struct Screened<R> {
    inner: R,
    /// Bytes read but not yet split into lines.
    pending: Vec<u8>,
    /// The current line is over `MAX_LINE`: its head is kept, the rest dropped.
    overlong: Option<usize>,
    /// Screened bytes ready for the reader.
    out: Vec<u8>,
    out_pos: usize,
    eof: bool,
}

impl<R> Screened<R> {
    /// Wraps a reader.
    pub fn new(inner: R) -> Screened<R> {
        Screened {
            inner,
            pending: Vec::new(),
            overlong: None,
            out: Vec::new(),
            out_pos: 0,
            eof: false,
        }
    }

    fn take_line(&mut self, end: usize) {
        let mut line: Vec<u8> = self.pending.drain(..end).collect();
        if !self.pending.is_empty() {
            self.pending.remove(0); // the newline
        }
        let dropped = self.overlong.take();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let error = match dropped {
            Some(n) => Some(format!("line longer than {MAX_LINE} bytes ({n} bytes)")),
            // A full parse: skipping (IgnoredAny) would not check escapes or UTF-8.
            None => serde_json::from_slice::<serde_json::Value>(&line)
                .err()
                .map(|e| e.to_string()),
        };
        match error {
            None => self.out.extend_from_slice(&line),
            Some(e) => self.out.extend_from_slice(&replacement(&line, dropped, &e)),
        }
        self.out.push(b'\n');
    }
}

/// The message that stands for a line that did not parse.
fn replacement(line: &[u8], total: Option<usize>, error: &str) -> Vec<u8> {
    let digest: String = Sha256::digest(line)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let params = serde_json::json!({
        "error": error,
        "bytes": total.unwrap_or(line.len()),
        "sha256_prefix": digest,
    });
    let msg = match id_of(line) {
        Some(id) => {
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": UNPARSEABLE, "params": params})
        }
        None => {
            serde_json::json!({"jsonrpc": "2.0", "method": format!("notifications/{UNPARSEABLE}"), "params": params})
        }
    };
    msg.to_string().into_bytes()
}

/// The request id of a line that is not valid JSON, if one can be read: the
/// first `"id":` followed by a number or a string that parses on its own.
fn id_of(line: &[u8]) -> Option<serde_json::Value> {
    let at = line.windows(5).position(|w| w == b"\"id\":")? + 5;
    let rest = &line[at..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let len = if rest.first() == Some(&b'"') {
        let mut i = 1;
        loop {
            match rest.get(i)? {
                b'\\' => i += 2,
                b'"' => break i + 1,
                _ => i += 1,
            }
        }
    } else {
        rest.iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'-'))
            .unwrap_or(rest.len())
    };
    let v: serde_json::Value = serde_json::from_slice(&rest[..len]).ok()?;
    (v.is_string() || v.is_i64() || v.is_u64()).then_some(v)
}

impl<R: AsyncRead + Unpin> AsyncRead for Screened<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        loop {
            if me.out_pos < me.out.len() {
                let n = (me.out.len() - me.out_pos).min(buf.remaining());
                buf.put_slice(&me.out[me.out_pos..me.out_pos + n]);
                me.out_pos += n;
                if me.out_pos == me.out.len() {
                    me.out.clear();
                    me.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if let Some(i) = me.pending.iter().position(|b| *b == b'\n') {
                me.take_line(i);
                continue;
            }
            if me.eof {
                if !me.pending.is_empty() {
                    let n = me.pending.len();
                    me.take_line(n);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            if me.pending.len() > MAX_LINE {
                // Keep a head (for the id and the digest); count the rest.
                let extra = me.pending.len() - 4096;
                me.pending.truncate(4096);
                *me.overlong.get_or_insert(4096) += extra;
            }
            let mut tmp = [0u8; 16384];
            let mut rb = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            let got = rb.filled();
            if got.is_empty() {
                me.eof = true;
            } else if me.overlong.is_some() {
                // Still inside an overlong line: drop until its newline.
                match got.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        *me.overlong.as_mut().expect("overlong") += i;
                        me.pending.push(b'\n');
                        me.pending.extend_from_slice(&got[i + 1..]);
                    }
                    None => *me.overlong.as_mut().expect("overlong") += got.len(),
                }
            } else {
                me.pending.extend_from_slice(got);
            }
        }
    }
}

enum Kind {
    Pipe,
    Socket,
}

/// A close-on-exec duplicate of a pipe or socket descriptor (fd 0 and 1 stay
/// open, so nothing else is ever handed those numbers).
fn own(fd: BorrowedFd<'_>) -> Option<(OwnedFd, Kind)> {
    let st = nix::sys::stat::fstat(fd).ok()?;
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => Kind::Pipe,
        libc::S_IFSOCK => Kind::Socket,
        _ => return None,
    };
    Some((fd.try_clone_to_owned().ok()?, kind))
}

fn socket(fd: OwnedFd) -> Option<tokio::net::UnixStream> {
    let s = std::os::unix::net::UnixStream::from(fd);
    s.set_nonblocking(true).ok()?;
    tokio::net::UnixStream::from_std(s).ok()
}
