//! The attach process's hold on the human's terminal: the tmux client runs
//! in a pty of ours one row shorter than the terminal, the terminal is raw
//! (and restored on every way out), keys go to the client and its output
//! comes back verbatim, and the bottom row, which the client never
//! addresses, carries the notice (`notice`).

use super::notice::{self, Boundary};
use super::AttachError;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::pty::{openpty, Winsize};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::termios::{self, SetArg, Termios};
use nix::unistd::Pid;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// The signals the attach process takes itself: a resize, and the ones it
/// passes on to the tmux client (which then detaches and exits).
const SIGNALS: [Signal; 5] = [
    Signal::SIGWINCH,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
];

/// Runs `cmd` (the tmux client) in a pty of its own and relays it to this
/// terminal until it exits; its exit code. `poller` runs on a thread and
/// writes the notice's lines, one a line, to the stream it is given.
pub(super) fn run(
    cmd: Command,
    poller: impl FnOnce(UnixStream) + Send + 'static,
) -> Result<i32, AttachError> {
    let saved =
        termios::tcgetattr(std::io::stdin()).map_err(|e| AttachError::Terminal(e.into()))?;
    let (rows, cols) = size();
    let pty = openpty(&winsize(inner(rows), cols), &saved).map_err(AttachError::Pty)?;
    for fd in [&pty.master, &pty.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(AttachError::Pty)?;
    }
    let mut child = spawn(cmd, pty.slave)?;
    let pid = Pid::from_raw(child.id() as i32);
    let relayed = relay(File::from(pty.master), pid, (rows, cols), &saved, poller);
    if relayed.is_err() {
        let _ = kill(pid, Signal::SIGHUP);
    }
    let status = child.wait().map_err(AttachError::Run)?;
    relayed?;
    Ok(status.code().unwrap_or(1))
}

/// The relay, with the terminal raw for as long as it runs.
fn relay(
    master: File,
    child: Pid,
    (rows, cols): (u16, u16),
    saved: &Termios,
    poller: impl FnOnce(UnixStream) + Send + 'static,
) -> Result<(), AttachError> {
    let signals: SigSet = SIGNALS.into_iter().collect();
    signals
        .thread_block()
        .map_err(|e| AttachError::Setup(e.into()))?;
    let sigfd = SignalFd::new(&signals).map_err(AttachError::Signalfd)?;
    // The poller thread is started with the signals blocked, so they reach `sigfd`.
    let (ours, theirs) = UnixStream::pair().map_err(AttachError::Setup)?;
    std::thread::spawn(move || poller(theirs));
    let _raw = Raw::enter(saved)?;
    Relay {
        master,
        sigfd,
        notices: ours,
        child,
        screen: Screen::new(rows, cols),
    }
    .relay()
    // `_raw` restores the terminal here, on success and error alike.
}

/// The real terminal in raw mode until dropped.
struct Raw(Termios);

impl Raw {
    fn enter(saved: &Termios) -> Result<Self, AttachError> {
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &raw)
            .map_err(|e| AttachError::Terminal(e.into()))?;
        Ok(Self(saved.clone()))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.0);
    }
}

/// The tmux client with the pty's other end as its controlling terminal.
fn spawn(mut cmd: Command, slave: OwnedFd) -> Result<std::process::Child, AttachError> {
    let e = AttachError::Client;
    let (i, o) = (slave.try_clone().map_err(e)?, slave.try_clone().map_err(e)?);
    cmd.stdin(Stdio::from(i))
        .stdout(Stdio::from(o))
        .stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls (setsid, ioctl) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(e)
}

/// The terminal's rows and columns; 24x80 when it says 0 (as tmux assumes).
fn size() -> (u16, u16) {
    let mut ws = winsize(0, 0);
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call.
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    match r == 0 && ws.ws_row > 0 && ws.ws_col > 0 {
        true => (ws.ws_row, ws.ws_col),
        false => (24, 80),
    }
}

/// The client's rows: all but the bottom one (a one-row terminal keeps its row).
fn inner(rows: u16) -> u16 {
    if rows > 1 {
        rows - 1
    } else {
        rows
    }
}

fn winsize(rows: u16, cols: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// What the bottom row shows and whether it must be drawn again.
struct Screen {
    rows: u16,
    cols: u16,
    line: String,
    boundary: Boundary,
    dirty: bool,
}

impl Screen {
    fn new(rows: u16, cols: u16) -> Self {
        Self {
            rows,
            cols,
            line: String::new(),
            boundary: Boundary::new(),
            dirty: true,
        }
    }

    /// The bytes drawing the line, when it is due and may go in now.
    fn redraw(&mut self) -> Vec<u8> {
        if !self.dirty || !self.boundary.at_ground() || self.rows < 2 || self.line.is_empty() {
            return Vec::new();
        }
        self.dirty = false;
        notice::draw(self.rows, self.cols, &self.line)
    }
}

/// The descriptors the attach process waits on.
#[derive(Clone, Copy)]
enum Src {
    Master,
    Signals,
    Keys,
    Notices,
}

struct Relay {
    master: File,
    sigfd: SignalFd,
    notices: UnixStream,
    child: Pid,
    screen: Screen,
}

impl Relay {
    /// Until the client's end of the pty closes (it exited).
    fn relay(&mut self) -> Result<(), AttachError> {
        let (mut keys_open, mut notices_open) = (true, true);
        let mut pending = Vec::new();
        let stdin = std::io::stdin();
        loop {
            let mut set = vec![
                (Src::Master, self.master.as_fd()),
                (Src::Signals, self.sigfd.as_fd()),
            ];
            if keys_open {
                set.push((Src::Keys, stdin.as_fd()));
            }
            if notices_open {
                set.push((Src::Notices, self.notices.as_fd()));
            }
            let mut fds: Vec<PollFd> = set
                .iter()
                .map(|(_, fd)| PollFd::new(*fd, PollFlags::POLLIN))
                .collect();
            match poll(&mut fds, PollTimeout::NONE) {
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(AttachError::Poll(e)),
                Ok(_) => {}
            }
            let ready: Vec<Src> = set
                .iter()
                .zip(&fds)
                .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
                .map(|((s, _), _)| *s)
                .collect();
            for s in ready {
                match s {
                    Src::Master if !self.output()? => return Ok(()),
                    Src::Master => {}
                    Src::Signals => self.signal(),
                    Src::Keys => keys_open = self.keys()?,
                    Src::Notices => notices_open = self.notice(&mut pending),
                }
            }
            self.write(&[])?;
        }
    }

    /// The client's output, verbatim, then the line if it may go in; false
    /// once the client is gone.
    fn output(&mut self) -> Result<bool, AttachError> {
        let mut buf = [0u8; 16384];
        let n = match self.master.read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(true),
            // EIO: every holder of the pty's other end closed it.
            Err(_) => return Ok(false),
        };
        self.screen.boundary.feed(&buf[..n]);
        // tmux may have erased the bottom row (a cleared screen, the
        // alternate screen): draw it again after every chunk.
        self.screen.dirty = true;
        self.write(&buf[..n])?;
        Ok(true)
    }

    /// `bytes` and, when due, the line, in one write to the terminal.
    fn write(&mut self, bytes: &[u8]) -> Result<(), AttachError> {
        let mut out = bytes.to_vec();
        out.extend(self.screen.redraw());
        if out.is_empty() {
            return Ok(());
        }
        let mut o = std::io::stdout().lock();
        o.write_all(&out)
            .and_then(|()| o.flush())
            .map_err(AttachError::Terminal)
    }

    /// A resize: the client's pty follows (one row shorter); any other
    /// signal is passed on to the client.
    fn signal(&mut self) {
        let Ok(Some(info)) = self.sigfd.read_signal() else {
            return;
        };
        match Signal::try_from(info.ssi_signo as i32) {
            Ok(Signal::SIGWINCH) => {
                let (rows, cols) = size();
                let ws = winsize(inner(rows), cols);
                // SAFETY: TIOCSWINSZ reads one winsize from `ws`; the master is open.
                unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
                (self.screen.rows, self.screen.cols) = (rows, cols);
                self.screen.dirty = true;
            }
            Ok(s) => {
                let _ = kill(self.child, s);
            }
            Err(_) => {}
        }
    }

    /// Keys to the client; false once the terminal's input ended.
    fn keys(&mut self) -> Result<bool, AttachError> {
        let mut buf = [0u8; 4096];
        match nix::unistd::read(std::io::stdin().as_fd(), &mut buf) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.master
                    .write_all(&buf[..n])
                    .map_err(AttachError::PtyWrite)?;
                Ok(true)
            }
            Err(Errno::EINTR | Errno::EAGAIN) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    /// New text for the line (whole lines from the poller); false once the
    /// poller is done.
    fn notice(&mut self, pending: &mut Vec<u8>) -> bool {
        let mut buf = [0u8; 4096];
        let n = match (&self.notices).read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(e) => return e.kind() == std::io::ErrorKind::Interrupted,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line[..i]).into_owned();
            if line != self.screen.line {
                self.screen.line = line;
                self.screen.dirty = true;
            }
        }
        true
    }
}
