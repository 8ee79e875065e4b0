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
//! - Otherwise every process whose pid namespace is the sandbox's (the
//!   `pid_for_children` of the outer `__init`) is sent SIGSTOP, again and
//!   again, until two scans in a row find nothing that can run: a process
//!   forks while others are stopped, and its child is caught by the next scan
//!   (a fork whose parent has a stop pending is undone by the kernel). Each
//!   process is opened as `/proc/PID` first; its namespace is read and the
//!   signal sent through that descriptor (`pidfd_send_signal`), so a pid
//!   reused by a host process is never signalled. Thawing sends SIGCONT to
//!   every process inside (one the agent had stopped itself resumes too).
//!
//! A frozen sandbox is ended by killing first and thawing after (v1 frozen
//! tasks die only once thawed), so nothing inside runs again.

use super::cgroup::Cgroup;
use nix::fcntl::{open, openat, readlinkat, OFlag};
use nix::sys::stat::Mode;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a freeze may take to settle.
pub const SETTLE: Duration = Duration::from_secs(5);

/// What a sandbox is frozen with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freezer {
    /// cgroup v2: `cgroup.freeze` / `cgroup.events` in this directory.
    V2(PathBuf),
    /// cgroup v1: `freezer.state` in this directory.
    V1(PathBuf),
    /// SIGSTOP / SIGCONT to every process of the sandbox's pid namespace.
    Signals,
}

impl Freezer {
    /// The freezer of a cgroup, if it has one.
    pub fn of(cg: &Cgroup) -> Option<Freezer> {
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
    pub fn name(&self) -> &'static str {
        match self {
            Freezer::V2(_) => "cgroup v2 freezer",
            Freezer::V1(_) => "cgroup v1 freezer",
            Freezer::Signals => "SIGSTOP",
        }
    }
}

/// The sandbox to act on.
#[derive(Debug, Clone)]
pub struct Target {
    /// Host pid of the outer `sandmux __init`.
    pub init_pid: u32,
    /// The instance's cgroup, when it has one.
    pub cgroup: Option<Cgroup>,
}

impl Target {
    /// The freezer used for this sandbox.
    pub fn freezer(&self) -> Freezer {
        self.cgroup
            .as_ref()
            .and_then(Freezer::of)
            .unwrap_or(Freezer::Signals)
    }
}

/// What a freeze or thaw did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Done {
    /// The freezer's name.
    pub method: &'static str,
    /// Processes it acted on.
    pub processes: usize,
}

/// Stops every process inside; an error says what is still running.
pub fn freeze(t: &Target) -> Result<Done, String> {
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
        Freezer::Signals => stop_all(&sandbox_ns(t.init_pid)?)?,
    };
    Ok(Done {
        method: f.name(),
        processes,
    })
}

/// Lets every process inside run again.
pub fn thaw(t: &Target) -> Result<Done, String> {
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
        Freezer::Signals => {
            let ms = members(&sandbox_ns(t.init_pid)?);
            for m in &ms {
                let _ = send(&m.fd, libc::SIGCONT);
            }
            ms.len()
        }
    };
    Ok(Done {
        method: f.name(),
        processes,
    })
}

/// Ends a frozen sandbox without letting anything inside run: every process
/// is killed, then the freezer let go (a frozen v1 task dies once thawed).
pub fn kill(t: &Target) {
    match t.freezer() {
        Freezer::V2(d) => {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
            let _ = std::fs::write(d.join("cgroup.freeze"), "0");
        }
        Freezer::V1(d) => kill_v1(&d),
        Freezer::Signals => {
            if let Ok(ns) = sandbox_ns(t.init_pid) {
                for m in members(&ns) {
                    let _ = send(&m.fd, libc::SIGKILL);
                }
            }
        }
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(t.init_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Kills what is left in a v1 freezer directory (frozen or not), then thaws it.
pub fn kill_v1(dir: &Path) {
    for pid in procs(dir) {
        if let Some(fd) = open_proc(pid) {
            let _ = send(&fd, libc::SIGKILL);
        }
    }
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
}

/// Writes `value` to a freezer file and waits until `done` holds.
fn cgroup_set(dir: &Path, file: &str, value: &str, done: impl Fn() -> bool) -> Result<(), String> {
    let p = dir.join(file);
    std::fs::write(&p, value).map_err(|e| format!("write {value} to {}: {e}", p.display()))?;
    let deadline = Instant::now() + SETTLE;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not settle at {value} within {SETTLE:?}",
                p.display()
            ));
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

/// The sandbox's pid namespace (`pid:[N]`), refused when it is the
/// supervisor's own (a profile that let the pid layer go): signalling
/// "every process of the namespace" would then reach the host's.
fn sandbox_ns(init_pid: u32) -> Result<String, String> {
    let p = format!("/proc/{init_pid}/ns/pid_for_children");
    let ns = std::fs::read_link(&p)
        .map_err(|e| format!("{p}: {e} (is the sandbox still running?)"))?
        .to_string_lossy()
        .into_owned();
    let own = std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default();
    if ns == own {
        return Err("the sandbox has no freezer cgroup and no pid namespace of its own (the profile let both go), so its processes cannot be told from the host's; `sandmux stop` ends it".into());
    }
    Ok(ns)
}

/// A process inside, held open as `/proc/PID`.
struct Member {
    fd: OwnedFd,
    /// It can run no more user code: stopped, traced, dead, or with a stop
    /// pending (the next thing it does is stop).
    still: bool,
}

fn open_proc(pid: i32) -> Option<OwnedFd> {
    open(
        format!("/proc/{pid}").as_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// Every process of namespace `ns`, as it is now.
fn members(ns: &str) -> Vec<Member> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Some(fd) = open_proc(pid) else { continue };
        let mine = readlinkat(&fd, "ns/pid").is_ok_and(|l| l.to_string_lossy() == ns);
        if mine {
            let still = is_still(&fd);
            out.push(Member { fd, still });
        }
    }
    out
}

/// Reads `status`: state T/t/Z/X, or SIGSTOP pending.
fn is_still(fd: &OwnedFd) -> bool {
    let Ok(f) = openat(
        fd,
        "status",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return true; // gone
    };
    let mut text = String::new();
    if std::io::Read::read_to_string(&mut std::fs::File::from(f), &mut text).is_err() {
        return true;
    }
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(str::trim)
            .unwrap_or_default()
    };
    let state = field("State:").chars().next().unwrap_or('X');
    let stop_bit = 1u64 << (libc::SIGSTOP - 1);
    let pending = ["SigPnd:", "ShdPnd:"]
        .iter()
        .any(|k| u64::from_str_radix(field(k), 16).is_ok_and(|m| m & stop_bit != 0));
    matches!(state, 'T' | 't' | 'Z' | 'X') || pending
}

/// Sends `sig` to the process `fd` holds (never to a reused pid).
fn send(fd: &OwnedFd, sig: i32) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal with a valid descriptor, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// SIGSTOPs namespace `ns` until two scans in a row find every process
/// still; returns how many there are.
fn stop_all(ns: &str) -> Result<usize, String> {
    let deadline = Instant::now() + SETTLE;
    let mut clean = 0;
    loop {
        let ms = members(ns);
        if ms.is_empty() {
            return Err("no process found in the sandbox's pid namespace".into());
        }
        let running: Vec<&Member> = ms.iter().filter(|m| !m.still).collect();
        if running.is_empty() {
            clean += 1;
            if clean == 2 {
                return Ok(ms.len());
            }
            continue;
        }
        clean = 0;
        for m in &running {
            let _ = send(&m.fd, libc::SIGSTOP);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {} processes in the sandbox were still running after {SETTLE:?}",
                running.len(),
                ms.len()
            ));
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_namespace_of_its_own_is_refused() {
        // This process's children share its pid namespace.
        let e = sandbox_ns(std::process::id()).unwrap_err();
        assert!(e.contains("no pid namespace of its own"), "{e}");
    }

    #[test]
    fn a_cgroup_without_a_freezer_falls_back_to_signals() {
        let d = tempfile::tempdir().unwrap();
        let cg = Cgroup {
            dirs: vec![d.path().to_path_buf()],
            version: "v1".into(),
        };
        let t = Target {
            init_pid: 1,
            cgroup: Some(cg.clone()),
        };
        assert_eq!(t.freezer(), Freezer::Signals);
        std::fs::write(d.path().join("freezer.state"), "THAWED\n").unwrap();
        assert_eq!(t.freezer(), Freezer::V1(d.path().to_path_buf()));
    }

    #[test]
    fn a_stopped_child_is_still_and_a_running_one_is_not() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = open_proc(c.id() as i32).unwrap();
        assert!(!is_still(&fd));
        send(&fd, libc::SIGSTOP).unwrap();
        let t0 = Instant::now();
        while !is_still(&fd) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(is_still(&fd));
        send(&fd, libc::SIGKILL).unwrap();
        c.wait().unwrap();
        // The descriptor outlives the process: a reused pid is never reached.
        assert!(send(&fd, libc::SIGCONT).is_err());
    }
}
