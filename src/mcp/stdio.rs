//! The MCP stdio transport. tokio's `stdin()`/`stdout()` hand every read and
//! write to its blocking thread pool, a thread hop each way per message. MCP
//! clients spawn servers with pipes or a Unix socket pair on stdin/stdout, and
//! those can be registered with the reactor instead; anything else (a terminal,
//! a file) keeps tokio's portable handles.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use tokio::io::{AsyncRead, AsyncWrite};

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
    (
        r.unwrap_or_else(|| Box::new(tokio::io::stdin())),
        w.unwrap_or_else(|| Box::new(tokio::io::stdout())),
    )
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
