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
pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of the transport.
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// stdin and stdout as an MCP transport. Must be called inside the runtime.
pub(crate) fn transport() -> (Reader, Writer) {
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
pub(crate) const MAX_LINE: usize = 8 << 20;

/// The method a line that did not parse is turned into.
pub(crate) const UNPARSEABLE: &str = "sandmux/unparseable";

/// A reader that passes whole lines that parse as JSON and replaces the rest.
pub(crate) struct Screened<R> {
    inner: R,
    /// Bytes read but not yet split into lines.
    pending: Vec<u8>,
    /// The current line is over `MAX_LINE`: its head is kept, the rest dropped.
    overlong: Option<usize>,
    /// Screened bytes ready for the reader.
    out: Vec<u8>,
    out_pos: usize,
    eof: bool,
    /// `pending[..searched]` holds no newline (so a long line is scanned once).
    searched: usize,
    /// A line parsed: the client is speaking JSON-RPC. Before that (the
    /// handshake), lines that do not parse are dropped, as rmcp would.
    spoke: bool,
}

impl<R> Screened<R> {
    /// Wraps a reader.
    pub(crate) fn new(inner: R) -> Screened<R> {
        Screened {
            inner,
            pending: Vec::new(),
            overlong: None,
            out: Vec::new(),
            out_pos: 0,
            eof: false,
            searched: 0,
            spoke: false,
        }
    }

    fn take_line(&mut self, end: usize) {
        let mut line: Vec<u8> = self.pending.drain(..end).collect();
        if !self.pending.is_empty() {
            self.pending.remove(0); // the newline
        }
        self.searched = 0;
        let dropped = self.overlong.take();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        // A UTF-8 byte-order mark is not JSON; rmcp skips it too.
        if line.starts_with(b"\xEF\xBB\xBF") {
            line.drain(..3);
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let dropped = dropped.or((line.len() > MAX_LINE).then_some(line.len()));
        let error = match dropped {
            Some(n) => Some(format!("line longer than {MAX_LINE} bytes ({n} bytes)")),
            // A full parse: skipping (IgnoredAny) would not check escapes or UTF-8.
            None => match serde_json::from_slice::<serde_json::Value>(&line) {
                Err(e) => Some(e.to_string()),
                // rmcp answers a batch with an error of its own, unaudited.
                Ok(serde_json::Value::Array(_)) => {
                    Some("a JSON-RPC batch (MCP sends one message per line)".into())
                }
                Ok(_) => None,
            },
        };
        match error {
            None => {
                self.spoke = true;
                self.out.extend_from_slice(&line);
            }
            Some(_) if !self.spoke => return,
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
/// value of an `"id"` key of the outermost object (nested objects and string
/// contents are skipped), when it is a whole number or a string on its own.
fn id_of(line: &[u8]) -> Option<serde_json::Value> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let end = string_end(line, i)?;
                if depth == 1 && &line[i..end] == b"\"id\"" {
                    let mut j = end;
                    while line.get(j).is_some_and(u8::is_ascii_whitespace) {
                        j += 1;
                    }
                    if line.get(j) == Some(&b':') {
                        return id_value(&line[j + 1..]);
                    }
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index just past the string that starts at `line[start]` (a `"`).
fn string_end(line: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match *line.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// A number or string value at the start of `rest`, ending where JSON allows.
fn id_value(rest: &[u8]) -> Option<serde_json::Value> {
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let len = if rest.first() == Some(&b'"') {
        string_end(rest, 0)?
    } else {
        rest.iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'-'))
            .unwrap_or(rest.len())
    };
    let after = rest[len..].iter().find(|b| !b.is_ascii_whitespace());
    if !matches!(after, Some(b',') | Some(b'}')) {
        return None;
    }
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
            if let Some(i) = me.pending[me.searched..].iter().position(|b| *b == b'\n') {
                let end = me.searched + i;
                me.take_line(end);
                continue;
            }
            me.searched = me.pending.len();
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
                me.searched = me.pending.len();
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
///
/// Non-blocking mode belongs to the open file, which a duplicate shares. When
/// stderr is the same pipe or socket (`2>&1`, one socket for all three), it is
/// left alone: sandmux's own diagnostics must never see `EAGAIN`.
fn own(fd: BorrowedFd<'_>) -> Option<(OwnedFd, Kind)> {
    let st = nix::sys::stat::fstat(fd).ok()?;
    if let Ok(err) = nix::sys::stat::fstat(std::io::stderr().as_fd()) {
        if (err.st_dev, err.st_ino) == (st.st_dev, st.st_ino) {
            return None;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn screen(input: &[u8]) -> Vec<String> {
        let mut r = Screened::new(input);
        let mut out = String::new();
        r.read_to_string(&mut out).await.unwrap();
        out.lines().map(str::to_string).collect()
    }

    #[tokio::test]
    async fn lines_are_passed_replaced_or_dropped() {
        let ok = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let input = format!(
            "garbage before the handshake\n\u{feff}{ok}\r\n\n{{\"id\":7,\"x\":\"a\\ud800\"}}\n{{not json\n"
        );
        let lines = screen(input.as_bytes()).await;
        assert_eq!(lines[0], ok, "{lines:?}");
        let req: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(req["id"], 7);
        assert_eq!(req["method"], UNPARSEABLE);
        let note: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
        assert!(note.get("id").is_none());
        assert_eq!(note["method"], format!("notifications/{UNPARSEABLE}"));
        assert_eq!(lines.len(), 3, "{lines:?}");
    }

    #[tokio::test]
    async fn an_overlong_line_is_cut_and_reported() {
        let mut input = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec();
        input.extend_from_slice(b"\n{\"id\":9,\"text\":\"");
        input.resize(input.len() + MAX_LINE + 10, b'x');
        input.extend_from_slice(b"\"}\n{\"id\":10}\n");
        let lines = screen(&input).await;
        assert_eq!(lines.len(), 3);
        let req: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(req["id"], 9);
        let error = req["params"]["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("longer than"),
            "{}",
            &lines[1][..200.min(lines[1].len())]
        );
        assert_eq!(lines[2], "{\"id\":10}");
    }

    #[test]
    fn only_a_top_level_id_is_read() {
        let id = |s: &str| id_of(s.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":5,"x":"\ud800"}"#),
            Some(5.into())
        );
        assert_eq!(
            id(r#"{"params":{"id":5},"id":"a\"b","x":[}"#),
            Some("a\"b".into())
        );
        assert_eq!(id(r#"{"params":{"id":5}, "x": broken"#), None);
        assert_eq!(id(r#"{"x":"\"id\":7","y":1 oops"#), None);
        assert_eq!(id(r#"{"x":1,"id":1e3 oops"#), None);
        assert_eq!(id(r#"{"id": -3 , bad"#), Some((-3).into()));
    }
}
