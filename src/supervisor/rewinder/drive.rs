//! The supervisor's side of a rewind: it sends the plan, then answers the
//! rewinder's asks for objects with descriptors (`SCM_RIGHTS`), only for
//! objects the target names, until the rewinder says it is done.

use super::{Ask, Done, Plan, RewinderError, DEADLINE};
use crate::supervisor::history::{hex_of, Node, State};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

/// Longest line the rewinder may send (an error naming a path).
const MAX_LINE: u64 = 64 << 10;

/// Gives the rewinder on `sock` the plan from `current` to `target` and
/// the objects (in the history's `objects`) it asks for; what it did.
pub(crate) fn drive(
    sock: UnixStream,
    target: &State,
    current: &State,
    objects: &Path,
) -> Result<Done, RewinderError> {
    let start = Instant::now();
    let hexed = |s: &State| s.iter().map(|(p, n)| (hex_of(p), n.clone())).collect();
    let plan = Plan {
        target: hexed(target),
        current: hexed(current),
    };
    let allowed: HashSet<&str> = target
        .values()
        .filter_map(|n| match n {
            Node::File { object, .. } => Some(object.as_str()),
            _ => None,
        })
        .collect();
    sock.set_write_timeout(Some(DEADLINE))?;
    let text = serde_json::to_vec(&plan)?;
    let mut w = &sock;
    let sent = w
        .write_all(&(text.len() as u64).to_le_bytes())
        .and_then(|()| w.write_all(&text));
    let mut lines = BufReader::new(sock.try_clone()?);
    if let Err(e) = sent {
        // A rewinder that refused before reading the plan (its workspace
        // check) closed its end: its refusal is what to say, not the pipe.
        return Err(said_instead(&sock, &mut lines).unwrap_or(RewinderError::Io(e)));
    }
    loop {
        let left = DEADLINE
            .checked_sub(start.elapsed())
            .ok_or(RewinderError::Deadline)?;
        sock.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))?;
        let mut line = Vec::new();
        let n = match lines.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(RewinderError::Deadline)
            }
            r => r?,
        };
        if n == 0 || line.last() != Some(&b'\n') {
            return Err(RewinderError::Ended);
        }
        match serde_json::from_slice::<Ask>(&line)? {
            Ask::Object(o) if allowed.contains(o.as_str()) => send_object(&sock, objects, &o),
            Ask::Object(_) => return Err(RewinderError::Unasked),
            Ask::Done(d) => return Ok(d),
            Ask::Failed(e) => return Err(RewinderError::Failed(e)),
            Ask::Refused(e) => return Err(RewinderError::Refused(e)),
        }
    }
}

/// What the rewinder said before it ended, if it refused or failed.
fn said_instead(sock: &UnixStream, lines: &mut BufReader<UnixStream>) -> Option<RewinderError> {
    sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    let mut line = Vec::new();
    lines
        .by_ref()
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)
        .ok()?;
    match serde_json::from_slice::<Ask>(&line).ok()? {
        Ask::Refused(e) => Some(RewinderError::Refused(e)),
        Ask::Failed(e) => Some(RewinderError::Failed(e)),
        _ => None,
    }
}

/// Sends the object `o` open read-only (stage 0), or no descriptor (stage
/// 1: the rewinder then stops, naming the object's path).
fn send_object(sock: &UnixStream, objects: &Path, o: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(objects.join(o));
    match f {
        Ok(f) => crate::supervisor::nsconnect::send_fd(sock, Some(f.as_raw_fd()), 0),
        Err(_) => crate::supervisor::nsconnect::send_fd(sock, None, 1),
    }
}
