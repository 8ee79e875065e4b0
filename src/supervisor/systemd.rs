//! A delegated cgroup from a systemd user manager, for callers whose own
//! cgroup is not writable (the common case on desktops): the way rootless
//! container runtimes get memory and process limits unprivileged.
//!
//! Detection needs systemd as PID 1 (`/run/systemd/system`), a user manager
//! (`$XDG_RUNTIME_DIR/systemd/private`), the user bus
//! (`$DBUS_SESSION_BUS_ADDRESS` or `$XDG_RUNTIME_DIR/bus`) and `busctl`. Then
//! this process asks the user manager for a transient scope with
//! `Delegate=yes` holding its own pid (`StartTransientUnit` over the user
//! bus), exactly what `systemd-run --user --scope -p Delegate=yes` does before
//! it execs its command, but without a re-exec: sandmux keeps its pid, its
//! descriptors (stdio may be MCP), its threads and its signal mask. Once in the
//! scope it moves itself into a leaf (`supervisor`, since cgroup v2 keeps
//! processes out of cgroups that delegate controllers) and enables `pids` and
//! `memory` for the scope's children, where each instance's cgroup is made.
//! Done once per process; the scope goes when its last process does.
//!
//! The transient-scope path is untested on the machines sandmux is built on
//! (no systemd there); detection and its refusal are.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Why no delegated scope could be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SystemdError {
    /// Detection found no user manager; every missing piece is named.
    #[error("no systemd user manager: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    NoManager(Vec<Missing>),
    /// `busctl` could not be run.
    #[error("{}: {source}", busctl.display())]
    Busctl {
        busctl: PathBuf,
        source: std::io::Error,
    },
    /// The manager refused the transient scope.
    #[error("StartTransientUnit {unit}: {stderr}")]
    StartUnit { unit: String, stderr: String },
    /// The scope was started but this process did not land in it.
    #[error("{unit} was started, but this process is not in it after 5 s")]
    NotMoved { unit: String },
    /// A step inside the scope.
    #[error("{what} in {}: {source}", scope.display())]
    Step {
        what: &'static str,
        scope: PathBuf,
        source: std::io::Error,
    },
    /// Any of the above past detection, with the bus it was asked on.
    #[error("systemd user manager at {}: {source}", bus.display())]
    At {
        bus: PathBuf,
        source: Box<SystemdError>,
    },
}

/// One piece a systemd user manager needs that is missing here.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Missing {
    /// `/run/systemd/system` is absent; `pid1` is PID 1's name, escaped.
    #[error("PID 1 is not systemd{}: {} does not exist", pid1.as_ref().map(|c| format!(" (it is '{c}')")).unwrap_or_default(), marker.display())]
    NotBooted {
        marker: PathBuf,
        pid1: Option<String>,
    },
    /// No `$XDG_RUNTIME_DIR`.
    #[error("XDG_RUNTIME_DIR is not set, so there is no user manager to find")]
    NoRuntimeDir,
    /// No `systemd/private` socket.
    #[error("no user manager socket at {}", .0.display())]
    ManagerSocket(PathBuf),
    /// No socket where the user bus should be.
    #[error("no user bus at {}", .0.display())]
    BusAt(PathBuf),
    /// Nowhere to look for the user bus.
    #[error("no user bus (neither DBUS_SESSION_BUS_ADDRESS nor XDG_RUNTIME_DIR is set)")]
    Bus,
    /// No `busctl`.
    #[error("busctl not found on PATH")]
    Busctl,
}

/// What detection looks at (the real machine's in [`Facts::here`]).
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    /// `/run/systemd/system` (exists when systemd is PID 1).
    pub booted_marker: PathBuf,
    /// `/proc/1/comm`, to name PID 1 when it is not systemd.
    pub pid1_comm: PathBuf,
    /// `$XDG_RUNTIME_DIR`.
    pub runtime_dir: Option<PathBuf>,
    /// `$DBUS_SESSION_BUS_ADDRESS`.
    pub bus_address: Option<String>,
    /// `$PATH`.
    pub path: Option<std::ffi::OsString>,
}

/// A systemd user manager this process can ask for a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserManager {
    /// The user bus socket.
    pub bus: PathBuf,
    /// `busctl`.
    pub busctl: PathBuf,
}

impl Facts {
    /// This machine and this process's environment.
    pub(crate) fn here() -> Facts {
        Facts {
            booted_marker: "/run/systemd/system".into(),
            pid1_comm: "/proc/1/comm".into(),
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            bus_address: std::env::var("DBUS_SESSION_BUS_ADDRESS").ok(),
            path: std::env::var_os("PATH"),
        }
    }
}

fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// The user bus socket: `unix:path=` of `$DBUS_SESSION_BUS_ADDRESS`, else
/// `$XDG_RUNTIME_DIR/bus`.
fn bus_path(f: &Facts) -> Option<PathBuf> {
    let from_address = f.bus_address.as_deref().and_then(|a| {
        a.split(';')
            .filter_map(|one| one.strip_prefix("unix:"))
            .flat_map(|kv| kv.split(','))
            .find_map(|kv| kv.strip_prefix("path="))
            .map(PathBuf::from)
    });
    from_address.or_else(|| f.runtime_dir.as_ref().map(|d| d.join("bus")))
}

/// Finds the user manager, or says exactly why there is none (every missing
/// piece, in one line).
pub(crate) fn detect(f: &Facts) -> Result<UserManager, SystemdError> {
    let mut why = Vec::new();
    if !f.booted_marker.is_dir() {
        let pid1 = std::fs::read_to_string(&f.pid1_comm)
            .map(|c| crate::term::printable(c.trim()))
            .ok();
        why.push(Missing::NotBooted {
            marker: f.booted_marker.clone(),
            pid1,
        });
    }
    match &f.runtime_dir {
        None => why.push(Missing::NoRuntimeDir),
        Some(d) if !is_socket(&d.join("systemd/private")) => {
            why.push(Missing::ManagerSocket(d.join("systemd/private")))
        }
        Some(_) => {}
    }
    let bus = bus_path(f);
    match &bus {
        Some(b) if is_socket(b) => {}
        Some(b) => why.push(Missing::BusAt(b.clone())),
        None => why.push(Missing::Bus),
    }
    let busctl = f.path.as_ref().and_then(|p| {
        std::env::split_paths(p)
            .map(|d| d.join("busctl"))
            .find(|b| b.is_file())
    });
    if busctl.is_none() {
        why.push(Missing::Busctl);
    }
    match (why.is_empty(), bus, busctl) {
        (true, Some(bus), Some(busctl)) => Ok(UserManager { bus, busctl }),
        _ => Err(SystemdError::NoManager(why)),
    }
}

/// The delegated scope's directory to make instance cgroups in, set up on
/// first use (see the module doc); the same answer for the whole process.
pub(crate) fn delegated_scope() -> Result<PathBuf, &'static SystemdError> {
    static SCOPE: OnceLock<Result<PathBuf, SystemdError>> = OnceLock::new();
    SCOPE
        .get_or_init(|| {
            let m = detect(&Facts::here())?;
            let unit = format!("sandmux-{}.scope", &crate::nonce::hex()[..12]);
            enter_scope(&m, &unit).map_err(|e| SystemdError::At {
                bus: m.bus.clone(),
                source: Box::new(e),
            })
        })
        .as_ref()
        .map(|scope| scope.to_path_buf())
}

/// `StartTransientUnit(name, "fail", [PIDs, Delegate, CollectMode,
/// Description], [])` on the user bus.
fn start_scope(m: &UserManager, unit: &str) -> Result<(), SystemdError> {
    let pid = std::process::id().to_string();
    let out = std::process::Command::new(&m.busctl)
        .env(
            "DBUS_SESSION_BUS_ADDRESS",
            format!("unix:path={}", m.bus.display()),
        )
        .args([
            "--user",
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            unit,
            "fail",
            "4",
            "PIDs",
            "au",
            "1",
            &pid,
            "Delegate",
            "b",
            "true",
            "CollectMode",
            "s",
            "inactive-or-failed",
            "Description",
            "s",
            "sandmux: delegated cgroup for its sandboxes",
            "0",
        ])
        .output()
        .map_err(|source| SystemdError::Busctl {
            busctl: m.busctl.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(SystemdError::StartUnit {
            unit: unit.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// This process's cgroup v2 directory.
fn own_v2_dir() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(super::cgroup::v2_mount()?.join(path.trim_start_matches('/')))
}

/// Starts the scope, waits (at most 5 s) until the manager has moved this
/// process into it, moves into its `supervisor` leaf and delegates `pids` and
/// `memory` to the scope's children. Returns the scope's directory.
fn enter_scope(m: &UserManager, unit: &str) -> Result<PathBuf, SystemdError> {
    start_scope(m, unit)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let scope = loop {
        match own_v2_dir() {
            Some(d) if d.file_name().is_some_and(|n| n == unit) => break d,
            _ if Instant::now() > deadline => {
                return Err(SystemdError::NotMoved {
                    unit: unit.to_string(),
                })
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let leaf = scope.join("supervisor");
    let step = |what: &'static str, r: std::io::Result<()>| {
        r.map_err(|source| SystemdError::Step {
            what,
            scope: scope.clone(),
            source,
        })
    };
    step("creating the supervisor leaf", std::fs::create_dir(&leaf))?;
    step(
        "moving into the supervisor leaf",
        std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()),
    )?;
    step(
        "enabling pids and memory",
        std::fs::write(scope.join("cgroup.subtree_control"), "+pids +memory"),
    )?;
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn facts(root: &Path, runtime: bool, bus: Option<&str>) -> Facts {
        Facts {
            booted_marker: root.join("run/systemd/system"),
            pid1_comm: root.join("comm"),
            runtime_dir: runtime.then(|| root.join("user")),
            bus_address: bus.map(str::to_string),
            path: Some(root.join("bin").into_os_string()),
        }
    }

    #[test]
    fn every_missing_piece_is_named() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("comm"), "process_api\n").unwrap();
        let e = detect(&facts(d.path(), false, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("no systemd user manager: PID 1 is not systemd (it is 'process_api'): "),
            "{e}"
        );
        assert!(e.contains("XDG_RUNTIME_DIR is not set"), "{e}");
        assert!(e.contains("no user bus (neither"), "{e}");
        assert!(e.contains("busctl not found on PATH"), "{e}");
        let e = detect(&facts(d.path(), true, None))
            .unwrap_err()
            .to_string();
        let user = d.path().join("user");
        assert!(
            e.contains(&format!(
                "no user manager socket at {}",
                user.join("systemd/private").display()
            )),
            "{e}"
        );
        assert!(
            e.contains(&format!("no user bus at {}", user.join("bus").display())),
            "{e}"
        );
    }

    #[test]
    fn a_full_set_of_markers_is_a_user_manager() {
        // The markers as a systemd host has them (real sockets, a busctl file):
        // detection itself, not the scope (nothing here answers on the bus).
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("run/systemd/system")).unwrap();
        std::fs::create_dir_all(r.join("user/systemd")).unwrap();
        std::fs::create_dir_all(r.join("bin")).unwrap();
        std::fs::write(r.join("bin/busctl"), "").unwrap();
        let _m = UnixListener::bind(r.join("user/systemd/private")).unwrap();
        let _b = UnixListener::bind(r.join("user/bus")).unwrap();
        let m = detect(&facts(r, true, None)).unwrap();
        assert_eq!(m.bus, r.join("user/bus"));
        assert_eq!(m.busctl, r.join("bin/busctl"));
        // DBUS_SESSION_BUS_ADDRESS wins over the default place, and a missing
        // socket there is named.
        let other = r.join("other-bus");
        let addr = format!("unix:path={},guid=0", other.display());
        let e = detect(&facts(r, true, Some(&addr)))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "no systemd user manager: no user bus at {}",
                other.display()
            )
        );
        let _o = UnixListener::bind(&other).unwrap();
        assert_eq!(detect(&facts(r, true, Some(&addr))).unwrap().bus, other);
    }
}
