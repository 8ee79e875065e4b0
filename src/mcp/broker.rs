//! The broker: what `serve` can no longer do once it has confined itself
//! (`sandbox::supervisor`). Landlock and seccomp are inherited, a sandbox
//! needs namespaces and mounts, and Landlock closes another domain's
//! `/proc/PID/ns` (ptrace-style access). So before confining, `serve` starts
//! this small child (`sandmux-broker __broker`, a fresh process of the same
//! binary with the same environment), which stays unconfined and does two
//! things on request: it starts a later server generation's sandbox
//! (`on_server_exit = "restart"`: its cgroup, its `sandmux __init`), answers
//! whether that sandbox still runs and ends it; and it runs the signals
//! freezer (`sandmux freeze` without a cgroup) on a sandbox `__init` of this
//! instance, and on no other process. It reads the resolved profile, then one
//! JSON line per request, from a socket pair on its descriptor 3, holds the
//! `__init` processes it started (so their pids cannot be reused while the
//! supervisor signals them), and ends with the supervisor: at the end of the
//! socket, or by `PR_SET_PDEATHSIG`. It never sees agent input: the
//! supervisor sends only the runtime directory, the instance id, the tmux
//! binary and pids.

use crate::profile::{Layer, Policy};
use crate::sandbox::rundir::Rundir;
use crate::sandbox::StartError;
use crate::tmux::{end_init, start_generation, Generation};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;

/// Largest reply line (a generation's start-up report, as JSON).
const MAX_LINE: u64 = 4 << 20;

#[derive(Serialize, Deserialize)]
enum Request {
    Launch {
        rundir: PathBuf,
        id: String,
        tmux: PathBuf,
    },
    Alive(u32),
    Stop(u32),
    Signals(crate::sandbox::freeze::Op, u32),
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Launched(Generation),
    Failed {
        layer: Option<Layer>,
        message: String,
        code: Option<i32>,
    },
    Alive(bool),
    Stopped,
    Signalled(Result<usize, String>),
}

/// The supervisor's end of the broker.
pub struct Broker {
    io: Mutex<(BufReader<UnixStream>, UnixStream)>,
    pid: Pid,
}

/// The broker's end of the socket pair.
const SOCKET_FD: i32 = 3;

impl Broker {
    /// Starts the broker and hands it the profile.
    pub fn spawn(policy: &Policy) -> Result<Broker, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().map_err(|e| format!("the broker: {e}"))?;
        let (ours, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
        let fd = theirs.as_raw_fd();
        let mut cmd = std::process::Command::new(exe);
        cmd.arg0("sandmux-broker")
            .arg("__broker")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2, prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                if moved < 0
                    || libc::dup2(moved, SOCKET_FD) < 0
                    || libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the broker: {e}"))?;
        drop(theirs);
        let read = ours.try_clone().map_err(|e| e.to_string())?;
        let b = Broker {
            io: Mutex::new((BufReader::new(read), ours)),
            pid: Pid::from_raw(child.id() as i32),
        };
        let mut line = serde_json::to_vec(policy).map_err(|e| e.to_string())?;
        line.push(b'\n');
        b.io.lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .write_all(&line)
            .map_err(|e| format!("the broker: {e}"))?;
        Ok(b)
    }

    fn ask(&self, r: &Request) -> Result<Reply, String> {
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = serde_json::to_vec(r).map_err(|e| e.to_string())?;
        line.push(b'\n');
        io.1.write_all(&line)
            .map_err(|e| format!("the broker: {e}"))?;
        read_line(&mut io.0)?
            .ok_or_else(|| "the broker ended".to_string())
            .and_then(|l| serde_json::from_slice(&l).map_err(|e| e.to_string()))
    }

    /// Starts a generation in `rundir`'s directory; the caller proves it.
    pub fn launch(&self, rundir: &Rundir, tmux: &Path) -> Result<Generation, StartError> {
        let r = Request::Launch {
            rundir: rundir.path.clone(),
            id: rundir.id.clone(),
            tmux: tmux.to_path_buf(),
        };
        match self.ask(&r).map_err(StartError::internal)? {
            Reply::Launched(g) => Ok(g),
            Reply::Failed {
                layer,
                message,
                code,
            } => Err(StartError {
                layer,
                message,
                code,
            }),
            _ => Err(StartError::internal(
                "the broker answered out of turn".into(),
            )),
        }
    }

    /// Whether the sandbox with this `__init` still runs.
    pub fn alive(&self, init_pid: u32) -> bool {
        matches!(self.ask(&Request::Alive(init_pid)), Ok(Reply::Alive(true)))
    }

    /// Runs the signals freezer on the sandbox of this `__init`.
    pub fn signals(&self, op: crate::sandbox::freeze::Op, init_pid: u32) -> Result<usize, String> {
        match self.ask(&Request::Signals(op, init_pid))? {
            Reply::Signalled(r) => r,
            _ => Err("the broker answered out of turn".into()),
        }
    }

    /// Ends the sandbox with this `__init` (SIGTERM, then SIGKILL) and reaps it.
    pub fn stop(&self, init_pid: u32) {
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
fn read_line(r: &mut BufReader<UnixStream>) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    r.by_ref()
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)
        .map_err(|e| e.to_string())?;
    match line.last() {
        None => Ok(None),
        Some(b'\n') => Ok(Some(line)),
        Some(_) => Err("a broker line too long or cut".into()),
    }
}

/// `sandmux __broker`: reads the profile, then answers requests until the
/// socket ends, and ends what it still holds.
pub fn main() -> i32 {
    use std::os::fd::FromRawFd;
    // SAFETY: descriptor 3 is the socket `Broker::spawn` put there; nothing
    // else in this fresh process owns it.
    let sock = unsafe { UnixStream::from_raw_fd(SOCKET_FD) };
    let Ok(write) = sock.try_clone() else {
        return 1;
    };
    let (mut read, mut write) = (BufReader::new(sock), write);
    let policy: Policy = match read_line(&mut read)
        .and_then(|l| l.ok_or_else(|| "no profile".into()))
        .and_then(|l| serde_json::from_slice(&l).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandmux-broker: {e}");
            return 1;
        }
    };
    let mut held: BTreeMap<u32, Child> = BTreeMap::new();
    while let Ok(Some(line)) = read_line(&mut read) {
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(r) => answer(r, &policy, &mut held),
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

/// Whether `pid` is a sandbox's `__init` this broker or the supervisor
/// started: the broker acts on no other process.
fn sandbox_of_ours(pid: u32, held: &BTreeMap<u32, Child>) -> Result<(), String> {
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
        Err(format!("process {pid} is not a sandbox of this instance"))
    }
}

fn answer(r: Request, policy: &Policy, held: &mut BTreeMap<u32, Child>) -> Reply {
    match r {
        Request::Launch { rundir, id, tmux } => {
            // The supervisor owns the directory: this copy never removes it.
            let mut rd = std::mem::ManuallyDrop::new(Rundir {
                path: rundir,
                id,
                cgroup: None,
            });
            match start_generation(policy, &mut rd, &tmux) {
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
        Request::Alive(pid) => Reply::Alive(
            held.get_mut(&pid)
                .is_some_and(|c| matches!(c.try_wait(), Ok(None))),
        ),
        Request::Signals(op, pid) => Reply::Signalled(
            sandbox_of_ours(pid, held).and_then(|()| crate::sandbox::freeze::by_signals(op, pid)),
        ),
        Request::Stop(pid) => {
            if let Some(mut c) = held.remove(&pid) {
                end_init(&mut c);
            }
            Reply::Stopped
        }
    }
}
