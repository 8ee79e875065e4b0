//! A start-up failure told to the MCP client. Before the server runs there
//! is no MCP session, and a closed pipe is all a client could show ("Connection
//! closed"). So `serve` answers the client's requests with a JSON-RPC error
//! whose message is the failure (the layer and the fix) until it has answered
//! `initialize`, then exits with the failure's status. The client's
//! `initialize` fails with that message, which MCP clients show as the
//! server's start-up error (the Python SDK raises it from `Client(...)`;
//! it first tries `server/discover`, which gets the same answer).
//!
//! Bounded: at most [`WAIT`] in all and [`MAX_ANSWERS`] answers, lines up to
//! [`super::stdio::MAX_LINE`]; notifications are skipped; a terminal on stdin
//! (a human, who reads stderr) is not waited for.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

/// How long the client has to send its first request.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Requests answered at most before giving up on an `initialize`.
const MAX_ANSWERS: usize = 8;

/// JSON-RPC "internal error": the server could not start.
const CODE: i64 = -32603;

/// Answers the client's requests on stdin with `message` as an error, until
/// `initialize` is answered; gives up at once when `stopped` (a stop signal
/// came: `podman stop` must not wait out [`WAIT`]).
pub(crate) fn tell_client(message: &str, stopped: &dyn Fn() -> bool) {
    let stdin = std::io::stdin();
    if nix::unistd::isatty(stdin.as_fd()).unwrap_or(false) {
        return;
    }
    let mut input = Input::new(stdin.as_fd(), WAIT, stopped);
    for _ in 0..MAX_ANSWERS {
        let Some((id, method)) = input.next_request() else {
            return;
        };
        let out = line(&answer(id, message));
        let mut stdout = std::io::stdout().lock();
        if stdout.write_all(&out).and_then(|_| stdout.flush()).is_err() || method == "initialize" {
            return;
        }
    }
}

/// A message as one line of JSON.
fn line(v: &serde_json::Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The error answer to request `id`.
fn answer(id: serde_json::Value, message: &str) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": CODE, "message": format!("sandmux could not start: {message}")},
    })
}

/// How often a wait for input looks whether a stop came.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Requests read from a descriptor before a deadline or a stop.
struct Input<'a> {
    fd: BorrowedFd<'a>,
    end: Instant,
    buf: Vec<u8>,
    stopped: &'a dyn Fn() -> bool,
}

impl<'a> Input<'a> {
    fn new(fd: BorrowedFd<'a>, wait: Duration, stopped: &'a dyn Fn() -> bool) -> Self {
        Input {
            fd,
            end: Instant::now() + wait,
            buf: Vec::new(),
            stopped,
        }
    }

    /// The next request's id and method (a message with both); None at end
    /// of input, on a read error, when time is up, a stop came or a line is
    /// over the limit.
    fn next_request(&mut self) -> Option<(serde_json::Value, String)> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut chunk = [0u8; 64 * 1024];
        loop {
            while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
                    continue;
                };
                if let (Some(id), Some(m)) = (v.get("id"), v.get("method").and_then(|m| m.as_str()))
                {
                    return Some((id.clone(), m.to_string()));
                }
            }
            if self.buf.len() > super::stdio::MAX_LINE {
                return None;
            }
            let left = self.end.saturating_duration_since(Instant::now());
            if left.is_zero() || (self.stopped)() {
                return None;
            }
            let ms = u16::try_from(left.min(STOP_CHECK).as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd, PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(n) if n > 0 => {}
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
            }
            match nix::unistd::read(self.fd, &mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn fed(input: &[u8]) -> Vec<(serde_json::Value, String)> {
        let (r, w) = nix::unistd::pipe().unwrap();
        let mut w = std::fs::File::from(w);
        w.write_all(input).unwrap();
        drop(w);
        let mut i = Input::new(r.as_fd(), Duration::from_secs(5), &|| false);
        std::iter::from_fn(|| i.next_request()).collect()
    }

    #[test]
    fn a_stop_ends_the_wait_for_a_silent_client() {
        // No input and an hour to wait: only the stop can end it (a version
        // that did not look would hang here).
        let (r, _w) = nix::unistd::pipe().unwrap();
        let looked = std::cell::Cell::new(0);
        let stopped = || {
            looked.set(looked.get() + 1);
            looked.get() >= 3
        };
        let mut i = Input::new(r.as_fd(), Duration::from_secs(3600), &stopped);
        assert_eq!(i.next_request(), None);
        assert_eq!(looked.get(), 3);
    }

    #[test]
    fn requests_are_read_notifications_responses_and_junk_skipped() {
        let input = b"not json\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}\n{\"jsonrpc\":\"2.0\",\"id\":1}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"server/discover\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"initialize\"}\n";
        let got = fed(input);
        assert_eq!(
            got,
            vec![
                (serde_json::json!(1), "server/discover".to_string()),
                (serde_json::json!(2), "initialize".to_string())
            ]
        );
        assert!(fed(b"").is_empty());
        let a = answer(serde_json::json!("x"), "layer 'pid' could not be applied");
        assert_eq!(a["id"], "x");
        assert!(a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("layer 'pid'"));
    }

    #[test]
    fn a_silent_client_is_not_waited_for_past_the_limit() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert_eq!(
            Input::new(r.as_fd(), Duration::from_millis(50), &|| false).next_request(),
            None
        );
    }
}
