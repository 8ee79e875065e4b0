//! Freezing a sandbox from the host (`sandmux freeze`): every process inside
//! — the agent's, the tmux server and PID 1 — stops where it is and runs no
//! instruction until it is thawed. The supervisor's own tmux clients run on
//! the host, outside both the cgroup and the pid namespace, and are never
//! stopped.
//!
//! - With a freezer cgroup (v2 `cgroup.freeze`, or a directory in the v1
//!   `freezer` hierarchy) the kernel freezes the whole cgroup, the outer
//!   `__init` included; done once `cgroup.events` says `frozen 1` (v1:
//!   `freezer.state` reads `FROZEN`).
//! - Otherwise the whole pid namespace is sent SIGSTOP at once from inside
//!   (`nssignal`: `kill(-1)` from a helper that joins the namespace, and
//!   PID 1 through a `/proc/PID` descriptor), again until two `/proc` scans
//!   in a row find nothing that can run. Thawing sends SIGCONT the same way
//!   (a process the agent had stopped itself resumes too).
//!
//! A frozen sandbox is ended by killing first and thawing after (v1 frozen
//! tasks die only once thawed), so nothing inside runs again.

use super::cgroup::Cgroup;
use super::nssignal::{members, open_proc, sandbox_ns, send, signal_all, NsSignalError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a freeze may take to settle.
pub(crate) const SETTLE: Duration = Duration::from_secs(5);

/// Why a freeze or thaw did not complete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FreezeError {
    /// A freezer file could not be written.
    #[error("write {value} to {}: {source}", path.display())]
    Write {
        value: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The freezer did not reach the state within [`SETTLE`].
    #[error("{} did not settle at {value} within {SETTLE:?}", path.display())]
    Unsettled { value: &'static str, path: PathBuf },
    /// The signals freezer left processes running.
    #[error("{running} of {total} processes in the sandbox were still running after {SETTLE:?}")]
    StillRunning { running: usize, total: usize },
    /// The sandbox's namespace could not be signalled.
    #[error(transparent)]
    Signal(#[from] NsSignalError),
    /// The broker, which runs the signals freezer for a confined supervisor.
    #[error(transparent)]
    Broker(#[from] super::broker::BrokerError),
}

/// What a sandbox is frozen with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Freezer {
    /// cgroup v2: `cgroup.freeze` / `cgroup.events` in this directory.
    V2(PathBuf),
    /// cgroup v1: `freezer.state` in this directory.
    V1(PathBuf),
    /// SIGSTOP / SIGCONT to every process of the sandbox's pid namespace.
    Signals,
}

impl Freezer {
    /// The freezer of a cgroup, if it has one.
    pub(crate) fn of(cg: &Cgroup) -> Option<Freezer> {
        cg.dirs.iter().find_map(|d| {
            if cg.version == "v2" && d.join("cgroup.freeze").exists() {
                Some(Freezer::V2(d.clone()))
            } else if d.join("freezer.state").exists() {
                Some(Freezer::V1(d.clone()))
            } else {
                None
            }
        })
    }

    /// How it is named in reports.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Freezer::V2(_) => "cgroup v2 freezer",
            Freezer::V1(_) => "cgroup v1 freezer",
            Freezer::Signals => "SIGSTOP",
        }
    }
}

/// The sandbox to act on.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Host pid of the outer `sandmux __init`.
    pub init_pid: u32,
    /// The instance's cgroup, when it has one.
    pub cgroup: Option<Cgroup>,
}

impl Target {
    /// The freezer used for this sandbox.
    pub(crate) fn freezer(&self) -> Freezer {
        self.cgroup
            .as_ref()
            .and_then(Freezer::of)
            .unwrap_or(Freezer::Signals)
    }
}

/// What the signals freezer is asked to do.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(crate) enum Op {
    /// SIGSTOP everything until it is still.
    Freeze,
    /// SIGCONT everything.
    Thaw,
    /// SIGKILL everything.
    Kill,
}

/// The signals freezer (no cgroup): needs `/proc/PID/ns` of the sandbox,
/// which a Landlock-confined supervisor cannot read, so `serve` has the
/// broker run it (`supervisor::broker`). Returns how many processes it acted on.
pub(crate) fn by_signals(op: Op, init_pid: u32) -> Result<usize, FreezeError> {
    match op {
        Op::Freeze => stop_all(init_pid),
        Op::Thaw => {
            let ns = sandbox_ns(init_pid)?;
            signal_all(init_pid, libc::SIGCONT)?;
            Ok(members(&ns, init_pid).len())
        }
        // PID 1's death takes the whole namespace with it.
        Op::Kill => {
            signal_all(init_pid, libc::SIGKILL)?;
            Ok(0)
        }
    }
}

/// Who runs the signals freezer: [`by_signals`] here, or a helper that may
/// (the broker, for a confined supervisor).
pub(crate) type Signals<'a> = &'a dyn Fn(Op, u32) -> Result<usize, FreezeError>;

/// What a freeze or thaw did.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Done {
    /// The freezer's name.
    pub method: &'static str,
    /// Processes it acted on.
    pub processes: usize,
}

/// Stops every process inside; an error says what is still running.
pub(crate) fn freeze(t: &Target, signals: Signals) -> Result<Done, FreezeError> {
    let f = t.freezer();
    let processes = match &f {
        Freezer::V2(d) => {
            cgroup_set(d, "cgroup.freeze", "1", || events_frozen(d) == Some(true))?;
            procs(d).len()
        }
        Freezer::V1(d) => {
            cgroup_set(d, "freezer.state", "FROZEN", || v1_state(d) == "FROZEN")?;
            procs(d).len()
        }
        Freezer::Signals => signals(Op::Freeze, t.init_pid)?,
    };
    Ok(Done {
        method: f.name(),
        processes,
    })
}

/// Lets every process inside run again.
pub(crate) fn thaw(t: &Target, signals: Signals) -> Result<Done, FreezeError> {
    let f = t.freezer();
    let processes = match &f {
        Freezer::V2(d) => {
            cgroup_set(d, "cgroup.freeze", "0", || events_frozen(d) == Some(false))?;
            procs(d).len()
        }
        Freezer::V1(d) => {
            cgroup_set(d, "freezer.state", "THAWED", || v1_state(d) == "THAWED")?;
            procs(d).len()
        }
        Freezer::Signals => signals(Op::Thaw, t.init_pid)?,
    };
    Ok(Done {
        method: f.name(),
        processes,
    })
}

/// Ends a frozen sandbox without letting anything inside run: every process
/// is killed, then the freezer let go (a frozen v1 task dies once thawed).
pub(crate) fn kill(t: &Target, signals: Signals) {
    match t.freezer() {
        Freezer::V2(d) => {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
            let _ = std::fs::write(d.join("cgroup.freeze"), "0");
        }
        Freezer::V1(d) => kill_v1(&d),
        Freezer::Signals => {
            let _ = signals(Op::Kill, t.init_pid);
        }
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(t.init_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Kills what is left in a v1 freezer directory (frozen or not), then thaws it.
pub(crate) fn kill_v1(dir: &Path) {
    for pid in procs(dir) {
        if let Some(fd) = open_proc(pid) {
            let _ = send(&fd, libc::SIGKILL);
        }
    }
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
}

/// Writes `value` to a freezer file and waits until `done` holds.
fn cgroup_set(
    dir: &Path,
    file: &str,
    value: &'static str,
    done: impl Fn() -> bool,
) -> Result<(), FreezeError> {
    let path = dir.join(file);
    if let Err(source) = std::fs::write(&path, value) {
        return Err(FreezeError::Write {
            value,
            path,
            source,
        });
    }
    let deadline = Instant::now() + SETTLE;
    while !done() {
        if Instant::now() > deadline {
            return Err(FreezeError::Unsettled { value, path });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// `frozen` of a v2 `cgroup.events`.
fn events_frozen(dir: &Path) -> Option<bool> {
    let t = std::fs::read_to_string(dir.join("cgroup.events")).ok()?;
    t.lines()
        .find_map(|l| l.strip_prefix("frozen "))
        .map(|v| v.trim() == "1")
}

fn v1_state(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("freezer.state"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The pids listed in a cgroup directory.
fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGSTOPs the whole sandbox until two scans in a row find every process
/// still; returns how many there are.
fn stop_all(init_pid: u32) -> Result<usize, FreezeError> {
    let ns = sandbox_ns(init_pid)?;
    let deadline = Instant::now() + SETTLE;
    let mut clean = 0;
    loop {
        signal_all(init_pid, libc::SIGSTOP)?;
        let ms = members(&ns, init_pid);
        let running = ms.iter().filter(|m| !m.still).count();
        if running == 0 {
            clean += 1;
            if clean == 2 {
                return Ok(ms.len());
            }
            continue;
        }
        clean = 0;
        if Instant::now() > deadline {
            return Err(FreezeError::StillRunning {
                running,
                total: ms.len(),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_without_a_freezer_falls_back_to_signals() {
        let d = tempfile::tempdir().unwrap();
        let cg = Cgroup {
            instance: vec![],
            dirs: vec![d.path().to_path_buf()],
            version: "v1".into(),
            scope: None,
        };
        let t = Target {
            init_pid: 1,
            cgroup: Some(cg.clone()),
        };
        assert_eq!(t.freezer(), Freezer::Signals);
        std::fs::write(d.path().join("freezer.state"), "THAWED\n").unwrap();
        assert_eq!(t.freezer(), Freezer::V1(d.path().to_path_buf()));
    }
}
