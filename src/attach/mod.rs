//! `sandmux attach`: a human watches (or, with `--read-write`, types into)
//! an instance's tmux server. On a terminal, the attach process stands
//! between the two (`pty`): the tmux client gets a pty one row shorter than
//! the terminal, and the bottom row is the attach process's own, a one-line
//! notice of the instance, the mode and the approval questions waiting
//! (`notice`). The agent controls everything the tmux server draws, so the
//! notice is never drawn by it.

mod notice;
mod pty;

use crate::operator::{request, Found};
use crate::runtime::endpoint::{Op, Request};
use std::io::{IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Why the terminal could not be attached, or the relay ended early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    /// The instance's endpoint refused or could not be asked (its words:
    /// the operator side speaks text).
    #[error("{0}")]
    Endpoint(String),
    /// A frozen instance's server answers nothing.
    #[error("instance {id} is frozen (sandmux thaw {id})")]
    Frozen { id: String },
    /// No usable tmux on PATH.
    #[error(transparent)]
    Tmux(#[from] crate::tmux::LocateError),
    /// The tmux client could not be run.
    #[error("{0}")]
    Run(#[source] std::io::Error),
    /// Only sandmux's control session exists.
    #[error("the instance has no session to attach to")]
    NoSession,
    /// The terminal's settings could not be read or set, or it could not
    /// be written.
    #[error("the terminal: {0}")]
    Terminal(#[source] std::io::Error),
    /// No pty could be made.
    #[error("a pty: {0}")]
    Pty(#[source] nix::Error),
    /// The tmux client could not be started on the pty.
    #[error("the tmux client: {0}")]
    Client(#[source] std::io::Error),
    /// Keys could not be written to the pty.
    #[error("the pty: {0}")]
    PtyWrite(#[source] std::io::Error),
    /// The signals could not be taken.
    #[error("signalfd: {0}")]
    Signalfd(#[source] nix::Error),
    /// The signals could not be blocked, or the notice's stream made.
    #[error("{0}")]
    Setup(#[source] std::io::Error),
    /// Waiting on the descriptors failed.
    #[error("poll: {0}")]
    Poll(#[source] nix::Error),
}

/// Attaches this terminal to an instance's tmux server (read-only unless
/// `read_write`), to the first session that is not sandmux's own. A frozen
/// instance is refused: its stopped server would answer nothing.
pub(crate) fn attach(f: &Found, read_write: bool) -> Result<i32, AttachError> {
    if f.is_serve() {
        let st = request(&f.dir, Request::new(Op::Status)).map_err(AttachError::Endpoint)?;
        if !st["frozen"].is_null() {
            return Err(AttachError::Frozen { id: f.id.clone() });
        }
    }
    let cmd = client(f, read_write)?;
    // Not a terminal on both sides (a pipe, a file): no row to keep and no
    // one to read it; the tmux client runs as before, without a notice.
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        let mut cmd = cmd;
        let st = cmd.status().map_err(AttachError::Run)?;
        return Ok(st.code().unwrap_or(1));
    }
    let (id, dir, serve) = (f.id.clone(), f.dir.clone(), f.is_serve());
    pty::run(cmd, move |out| poll(out, &id, dir, serve, read_write))
}

/// The tmux client's command: `attach-session` to the first session that is
/// not the control session, not resizing the agent's windows (`ignore-size`),
/// read-only unless `read_write`, outside any tmux the human is in.
fn client(f: &Found, read_write: bool) -> Result<Command, AttachError> {
    let (tmux, _) = crate::tmux::find_tmux_version()?;
    let sock = f.dir.join("sock").join("tmux.sock");
    let list = Command::new(&tmux)
        .args(["-N", "-S"])
        .arg(&sock)
        .args(["list-sessions", "-F", "#{session_id} #{session_name}"])
        .output()
        .map_err(AttachError::Run)?;
    let first = String::from_utf8_lossy(&list.stdout)
        .lines()
        // The name is compared whole: tools refuse names starting with the
        // control session's, and a suffix match would let a session named
        // "x _sandmux" steer which one the human sees.
        .filter_map(|l| l.split_once(' '))
        .find(|(_, name)| *name != crate::tmux::hub::CONTROL_SESSION)
        .map(|(id, _)| id.to_string())
        .ok_or(AttachError::NoSession)?;
    let mut c = Command::new(&tmux);
    c.args(["-N", "-u", "-S"]).arg(&sock).args([
        "attach-session",
        "-t",
        &first,
        "-f",
        "ignore-size",
    ]);
    if !read_write {
        c.arg("-r");
    }
    c.env_remove("TMUX");
    Ok(c)
}

/// The poller thread: the notice's text, one line each time it may have
/// changed. A `serve` instance's endpoint is asked for its open questions
/// once a second (a failure is shown, and asked again); a `run` instance has
/// none, and its line never changes.
fn poll(mut out: UnixStream, id: &str, dir: PathBuf, serve: bool, read_write: bool) {
    loop {
        let answer = serve
            .then(|| request(&dir, Request::new(Op::Approvals)).map_err(AttachError::Endpoint));
        let line = notice::text(id, read_write, answer);
        if writeln!(out, "{line}").is_err() || !serve {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
