//! The broker: what `serve` can no longer do once it has confined itself
//! (`confine`). Landlock and seccomp are inherited, a sandbox
//! needs namespaces and mounts, and Landlock closes another domain's
//! `/proc/PID/ns` (ptrace-style access). So before confining, `serve` starts
//! this small child (`sandmux-broker __broker`, a fresh process of the same
//! binary with the same environment), which stays unconfined and does two
//! things on request: it starts a later server generation's sandbox
//! (`on_server_exit = "restart"`: its cgroup, its `sandmux __init`), answers
//! whether that sandbox still runs and ends it; and it runs the signals
//! freezer (`sandmux freeze` without a cgroup) on a sandbox `__init` of this
//! instance, and on no other process; and it runs the `from_command` of
//! one of the profile's credentials, named by its index (the confined
//! supervisor can no longer run host commands; the output, the value, goes
//! back over the socket and nowhere else); and, for `sandmux expose`, it
//! binds a host listener at the address the operator chose and makes
//! connections to `127.0.0.1:PORT` inside a sandbox of this instance
//! (`supervisor::nsconnect`), handing each descriptor back over a second
//! socket pair (descriptor 4, `SCM_RIGHTS` only): the confined supervisor
//! may neither bind nor make an inet socket; and, for `rewind` of a running
//! instance, it starts a rewinder in a sandbox of this instance
//! (`supervisor::rewinder`) and hands back its socket the same way. It reads the resolved profile, then one
//! JSON line per request, from a socket pair on its descriptor 3, holds the
//! `__init` processes it started (so their pids cannot be reused while the
//! supervisor signals them), and ends with the supervisor: at the end of the
//! socket, or by `PR_SET_PDEATHSIG`. It never sees agent input: the
//! supervisor sends only the runtime directory, the instance id, the tmux
//! binary, pids and credential indexes.

use super::freeze::FreezeError;
use super::generation::{end_init, start_generation, Generation};
use crate::profile::{Layer, Policy};
use crate::sandbox::StartError;
use crate::supervisor::rundir::Rundir;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;

/// Largest reply line (a generation's start-up report, as JSON).
const MAX_LINE: u64 = 4 << 20;

/// What the broker works for, fixed when it starts: the instance's final
/// profile (after the workspace guard added its paths), its runtime
/// directory and id, and the tmux binary. No request can change them.
#[derive(Serialize, Deserialize)]
struct Config {
    policy: Policy,
    rundir: PathBuf,
    id: String,
    tmux: PathBuf,
    /// The instance's cgroup directories, removed at `End`.
    cgroup: Option<crate::sandbox::cgroup::Cgroup>,
}

#[derive(Serialize, Deserialize)]
enum Request {
    /// A new generation: refused while one of the broker's runs, and past
    /// the restart budget.
    Launch,
    Stop(u32),
    Signals(crate::supervisor::freeze::Op, u32),
    /// The instance ends: its sandboxes, then its cgroup directory.
    End,
    /// Run the `from_command` of the profile's credential N (its index,
    /// fixed at start: no request names a command).
    Credential(usize),
    /// `expose`: a TCP connection to `127.0.0.1:PORT` inside the sandbox of
    /// this `__init` (one of this instance's), its descriptor sent back.
    Connect(u32, u16),
    /// `expose`: a TCP listener on the host at this address, sent back
    /// (the confined supervisor may bind nothing).
    Listen(std::net::SocketAddr),
    /// `rewind` of a running instance: a rewinder (`supervisor::rewinder`)
    /// in the sandbox of this `__init` (one of this instance's), for the
    /// workspace the configuration names; the supervisor's end of its
    /// socket sent back. The plan goes over that socket, never here.
    Rewinder(u32),
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Launched(Generation),
    Failed {
        layer: Option<Layer>,
        message: String,
        code: Option<i32>,
    },
    Stopped,
    Signalled(Result<usize, String>),
    Ended,
    /// The command's output, or why there is none.
    Credential(Result<Vec<u8>, String>),
    /// A descriptor went over the descriptor channel, or why none did.
    Sent(Result<(), String>),
}

/// Why the supervisor could not work with its broker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerError {
    /// The broker process could not be started.
    #[error("starting the broker: {0}")]
    Spawn(std::io::Error),
    /// Its socket failed.
    #[error("the broker: {0}")]
    Io(#[from] std::io::Error),
    /// A line that is not the protocol's JSON.
    #[error("the broker: {0}")]
    Json(#[from] serde_json::Error),
    /// It closed its end.
    #[error("the broker ended")]
    Ended,
    /// A line over [`MAX_LINE`] bytes, or cut.
    #[error("a broker line too long or cut")]
    Line,
    /// An answer to another request.
    #[error("the broker answered out of turn")]
    OutOfTurn,
    /// A request or reply that did not (de)serialise on the descriptor
    /// path (said without the prefix of [`BrokerError::Json`]).
    #[error("{0}")]
    Garbled(serde_json::Error),
    /// No descriptor came with a `Sent` reply.
    #[error("the broker sent no descriptor")]
    NoDescriptor,
    /// The descriptor channel failed.
    #[error(transparent)]
    Channel(#[from] super::nsconnect::NsConnectError),
    /// A process the broker did not start and that is not a sandbox of
    /// this instance.
    #[error("process {0} is not a sandbox of this instance")]
    NotOurs(u32),
    /// The broker refused, saying why (its reply carries the text: the
    /// socket between the two processes is an edge).
    #[error("{0}")]
    Refused(String),
}

/// The supervisor's end of the broker.
pub(crate) struct Broker {
    /// The request socket (read and write halves) and the descriptor
    /// channel (`SCM_RIGHTS` only, one message per `Sent` reply).
    io: Mutex<(BufReader<UnixStream>, UnixStream, UnixStream)>,
    pid: Pid,
}

/// The broker's end of the socket pair.
const SOCKET_FD: i32 = 3;
/// The broker's end of the descriptor channel.
const FDS_FD: i32 = 4;

impl Broker {
    /// Starts the broker process, before the sandbox (its start overlaps
    /// the sandbox's); it waits for [`Broker::configure`].
    pub(crate) fn spawn() -> Result<Broker, BrokerError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().map_err(BrokerError::Spawn)?;
        let (ours, theirs) = UnixStream::pair().map_err(BrokerError::Spawn)?;
        let (fds_ours, fds_theirs) = UnixStream::pair().map_err(BrokerError::Spawn)?;
        let (fd, fds_fd) = (theirs.as_raw_fd(), fds_theirs.as_raw_fd());
        let mut cmd = std::process::Command::new(exe);
        cmd.arg0("sandmux-broker")
            .arg("__broker")
            .arg("--log-format")
            .arg(match crate::log::format() {
                crate::log::Format::Text => "text",
                crate::log::Format::Json => "json",
            })
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2, prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                let fds_moved = libc::fcntl(fds_fd, libc::F_DUPFD_CLOEXEC, 10);
                if moved < 0
                    || fds_moved < 0
                    || libc::dup2(moved, SOCKET_FD) < 0
                    || libc::dup2(fds_moved, FDS_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                crate::sandbox::die_with_parent()
            });
        }
        let child = cmd.spawn().map_err(BrokerError::Spawn)?;
        drop((theirs, fds_theirs));
        let read = ours.try_clone().map_err(BrokerError::Spawn)?;
        fds_ours
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .map_err(BrokerError::Spawn)?;
        Ok(Broker {
            io: Mutex::new((BufReader::new(read), ours, fds_ours)),
            pid: Pid::from_raw(child.id() as i32),
        })
    }

    /// Tells the broker what it works for: this instance's final profile,
    /// runtime directory and tmux binary.
    pub(crate) fn configure(
        &self,
        policy: &Policy,
        rundir: &Rundir,
        tmux: &Path,
    ) -> Result<(), BrokerError> {
        let config = Config {
            policy: policy.clone(),
            rundir: rundir.path.clone(),
            id: rundir.id.clone(),
            tmux: tmux.to_path_buf(),
            cgroup: rundir.cgroup.clone(),
        };
        let mut line = serde_json::to_vec(&config)?;
        line.push(b'\n');
        self.io
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .write_all(&line)?;
        Ok(())
    }

    fn ask(&self, r: &Request) -> Result<Reply, BrokerError> {
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = serde_json::to_vec(r)?;
        line.push(b'\n');
        io.1.write_all(&line)?;
        let line = read_line(&mut io.0)?.ok_or(BrokerError::Ended)?;
        Ok(serde_json::from_slice(&line)?)
    }

    /// Starts a generation in the instance's directory; the caller proves it.
    pub(crate) fn launch(&self) -> Result<Generation, StartError> {
        match self
            .ask(&Request::Launch)
            .map_err(|e| StartError::internal(e.to_string()))?
        {
            Reply::Launched(g) => Ok(g),
            Reply::Failed {
                layer,
                message,
                code,
            } => Err(StartError {
                layer,
                message,
                code,
                layers: vec![],
            }),
            _ => Err(StartError::internal(
                "the broker answered out of turn".into(),
            )),
        }
    }

    /// Runs the signals freezer on the sandbox of this `__init`.
    pub(crate) fn signals(
        &self,
        op: crate::supervisor::freeze::Op,
        init_pid: u32,
    ) -> Result<usize, BrokerError> {
        match self.ask(&Request::Signals(op, init_pid))? {
            Reply::Signalled(r) => r.map_err(BrokerError::Refused),
            _ => Err(BrokerError::OutOfTurn),
        }
    }

    /// The instance ends: the broker ends what it holds and removes the
    /// instance's cgroup directory (below a parent the supervisor may not
    /// write).
    pub(crate) fn end(&self) {
        let _ = self.ask(&Request::End);
    }

    /// Runs the `from_command` of the profile's credential `index` here,
    /// unconfined (bounded by its time limit; other requests wait for it).
    pub(crate) fn credential(&self, index: usize) -> Result<Vec<u8>, BrokerError> {
        match self.ask(&Request::Credential(index))? {
            Reply::Credential(r) => r.map_err(BrokerError::Refused),
            _ => Err(BrokerError::OutOfTurn),
        }
    }

    /// `expose`: a connection to `127.0.0.1:port` inside the sandbox of
    /// `init_pid`.
    pub(crate) fn connect_inside(&self, init_pid: u32, port: u16) -> Result<OwnedFd, BrokerError> {
        self.ask_fd(&Request::Connect(init_pid, port))
    }

    /// `rewind`: the socket of a rewinder in the sandbox of `init_pid`.
    pub(crate) fn rewinder(&self, init_pid: u32) -> Result<OwnedFd, BrokerError> {
        self.ask_fd(&Request::Rewinder(init_pid))
    }

    /// `expose`: a listener on the host at `addr`.
    pub(crate) fn listen(&self, addr: std::net::SocketAddr) -> Result<OwnedFd, BrokerError> {
        self.ask_fd(&Request::Listen(addr))
    }

    /// A request answered by `Sent`: the descriptor from the channel.
    fn ask_fd(&self, r: &Request) -> Result<OwnedFd, BrokerError> {
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = serde_json::to_vec(r).map_err(BrokerError::Garbled)?;
        line.push(b'\n');
        io.1.write_all(&line)?;
        let line = read_line(&mut io.0)?.ok_or(BrokerError::Ended)?;
        match serde_json::from_slice(&line).map_err(BrokerError::Garbled)? {
            Reply::Sent(Ok(())) => match crate::supervisor::nsconnect::recv_fd(&io.2)? {
                (0, _, Some(fd)) => Ok(fd),
                _ => Err(BrokerError::NoDescriptor),
            },
            Reply::Sent(Err(e)) => Err(BrokerError::Refused(e)),
            _ => Err(BrokerError::OutOfTurn),
        }
    }

    /// Ends the sandbox with this `__init` (SIGTERM, then SIGKILL) and reaps it.
    pub(crate) fn stop(&self, init_pid: u32) {
        let _ = self.ask(&Request::Stop(init_pid));
    }
}

impl Drop for Broker {
    /// Closing the socket ends the broker (it ends what it holds first).
    fn drop(&mut self) {
        let io = self.io.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = io.1.shutdown(std::net::Shutdown::Both);
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

/// One line of at most [`MAX_LINE`] bytes; `None` at the end of the stream.
fn read_line(r: &mut BufReader<UnixStream>) -> Result<Option<Vec<u8>>, BrokerError> {
    let mut line = Vec::new();
    r.by_ref().take(MAX_LINE).read_until(b'\n', &mut line)?;
    match line.last() {
        None => Ok(None),
        Some(b'\n') => Ok(Some(line)),
        Some(_) => Err(BrokerError::Line),
    }
}

/// `sandmux __broker`: reads the profile, then answers requests until the
/// socket ends, and ends what it still holds.
pub(crate) fn main() -> i32 {
    use std::os::fd::FromRawFd;
    // SAFETY: descriptor 3 is the socket `Broker::spawn` put there; nothing
    // else in this fresh process owns it.
    let sock = unsafe { UnixStream::from_raw_fd(SOCKET_FD) };
    // SAFETY: likewise descriptor 4, the descriptor channel.
    let fds = unsafe { UnixStream::from_raw_fd(FDS_FD) };
    let Ok(write) = sock.try_clone() else {
        return 1;
    };
    let (mut read, mut write) = (BufReader::new(sock), write);
    let config: Config = match read_line(&mut read).and_then(|l| {
        l.map(|l| serde_json::from_slice(&l).map_err(BrokerError::from))
            .transpose()
    }) {
        Ok(Some(c)) => c,
        // The supervisor ended before it had an instance to configure.
        Ok(None) => return 0,
        Err(e) => {
            tracing::error!("the broker: {e}");
            return 1;
        }
    };
    let mut launched = 0;
    let mut held: BTreeMap<u32, Child> = BTreeMap::new();
    while let Ok(Some(line)) = read_line(&mut read) {
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(Request::Connect(pid, port)) => connect(&held, pid, port, &fds),
            Ok(Request::Rewinder(pid)) => rewinder(&held, pid, &config, &fds),
            // The supervisor checked the request; the rules that keep a
            // system port out are checked again here.
            Ok(Request::Listen(addr)) if addr.port() != 0 && addr.port() < 1024 => {
                Reply::Sent(Err(format!(
                    "listening on {addr}: a port below 1024 is never exposed"
                )))
            }
            Ok(Request::Listen(addr)) => Reply::Sent(
                std::net::TcpListener::bind(addr)
                    .map_err(|e| format!("listening on {addr}: {e}"))
                    .map(|l| send(&fds, &l)),
            ),
            Ok(r) => answer(r, &config, &mut held, &mut launched),
            Err(e) => Reply::Failed {
                layer: None,
                message: format!("the broker: {e}"),
                code: None,
            },
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        if write.write_all(&out).is_err() {
            break;
        }
    }
    for c in held.values_mut() {
        end_init(c);
    }
    0
}

/// `Connect`: the connection made inside the sandbox, sent over `fds`.
fn connect(held: &BTreeMap<u32, Child>, pid: u32, port: u16, fds: &UnixStream) -> Reply {
    let made = sandbox_of_ours(pid, held)
        .and_then(|()| Ok(crate::supervisor::nsconnect::connect_inside(pid, port)?));
    // The reply is the edge between the two processes: text.
    Reply::Sent(made.map(|s| send(fds, &s)).map_err(|e| e.to_string()))
}

/// `Rewinder`: the rewinder started for the sandbox of `pid`, its socket
/// sent over `fds`; it is reaped (and bounded in time) on a thread.
fn rewinder(held: &BTreeMap<u32, Child>, pid: u32, c: &Config, fds: &UnixStream) -> Reply {
    let made = sandbox_of_ours(pid, held)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            crate::supervisor::rewinder::spawn(pid, &c.policy.workspace).map_err(|e| e.to_string())
        });
    Reply::Sent(made.map(|(sock, child)| {
        send(fds, &sock);
        crate::supervisor::rewinder::spawn::reap(child);
    }))
}

/// Sends one descriptor over the descriptor channel.
fn send(fds: &UnixStream, f: &impl std::os::fd::AsRawFd) {
    crate::supervisor::nsconnect::send_fd(fds, Some(f.as_raw_fd()), 0);
}

/// Whether a held `__init` still runs. It is not reaped here (`WNOWAIT`):
/// its pid stays its own until `Stop`, so nothing signals a reused pid.
fn running(c: &mut Child) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let pid = Pid::from_raw(c.id() as i32);
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(waitid(Id::Pid(pid), flags), Ok(WaitStatus::StillAlive))
}

/// Whether `pid` is a sandbox's `__init` this broker or the supervisor
/// started: the broker acts on no other process.
fn sandbox_of_ours(pid: u32, held: &BTreeMap<u32, Child>) -> Result<(), BrokerError> {
    if held.contains_key(&pid) {
        return Ok(());
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ppid = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 2..))
        .and_then(|r| r.split(' ').nth(1))
        .and_then(|p| p.parse::<i32>().ok());
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = argv0.split(|b| *b == 0).next().unwrap_or_default();
    if ppid == Some(nix::unistd::getppid().as_raw()) && argv0 == b"sandmux-init" {
        Ok(())
    } else {
        Err(BrokerError::NotOurs(pid))
    }
}

fn answer(r: Request, c: &Config, held: &mut BTreeMap<u32, Child>, launched: &mut u32) -> Reply {
    let failed = |message: String| Reply::Failed {
        layer: None,
        message,
        code: None,
    };
    match r {
        Request::Launch if held.values_mut().any(running) => {
            failed("the broker refuses a second live generation".into())
        }
        Request::Launch if *launched >= crate::profile::MAX_RESTARTS => {
            failed("the broker's restart budget is spent".into())
        }
        Request::Launch => {
            *launched += 1;
            // The supervisor owns the directory: this copy never removes it.
            let mut rd = std::mem::ManuallyDrop::new(Rundir {
                path: c.rundir.clone(),
                id: c.id.clone(),
                cgroup: None,
            });
            match start_generation(&c.policy, &mut rd, &c.tmux) {
                Ok((child, g)) => {
                    held.insert(g.init_pid, child);
                    Reply::Launched(g)
                }
                Err(e) => Reply::Failed {
                    layer: e.layer,
                    message: e.message,
                    code: e.code,
                },
            }
        }
        Request::Signals(op, pid) => Reply::Signalled(
            sandbox_of_ours(pid, held)
                .map_err(FreezeError::from)
                .and_then(|()| crate::supervisor::freeze::by_signals(op, pid))
                .map_err(|e| e.to_string()),
        ),
        Request::End => {
            for ch in held.values_mut() {
                end_init(ch);
            }
            held.clear();
            if let Some(cg) = &c.cgroup {
                cg.remove_instance();
            }
            Reply::Ended
        }
        Request::Credential(i) => {
            use crate::profile::credentials::From;
            Reply::Credential(match c.policy.credentials.get(i).map(|x| (x, x.from())) {
                Some((x, From::Command(argv))) => {
                    crate::secretcmd::run(argv, &x.command_env, x.command_timeout())
                        .map_err(|e| e.to_string())
                }
                _ => Err(format!("the profile's credential {i} has no from_command")),
            })
        }
        Request::Connect(..) | Request::Listen(_) | Request::Rewinder(_) => {
            failed("handled by the main loop".into())
        }
        Request::Stop(pid) => {
            if let Some(mut c) = held.remove(&pid) {
                end_init(&mut c);
            }
            Reply::Stopped
        }
    }
}
