//! The instance's cgroup as the sandbox sees it: where the plan places the
//! sandbox ([`Placement`], made on the host by `crate::supervisor::cgroup`),
//! and the one step taken inside: `sandmux __init` moves itself in (writing
//! `0` to `cgroup.procs`, or on v1 to `tasks` while it has one thread) before
//! it creates any namespace, so everything in the sandbox is counted.
//! Creating, killing, removing and reading a cgroup's counters run on the
//! host and live in `crate::supervisor::cgroup` (inherent methods of the
//! same [`Cgroup`]).

use std::path::PathBuf;

/// The calling process's thread count.
fn threads() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Where a sandbox's processes are placed: in the instance's cgroup, or
/// without one (the profile lets the cgroup layer go and this system
/// refused it: `why`, with what limits them instead).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) enum Placement {
    /// In this cgroup.
    In(Cgroup),
    /// Without a cgroup.
    Without {
        /// Why, and what is in force instead.
        why: String,
    },
}

/// A created cgroup (one directory per hierarchy).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Cgroup {
    /// Directories, one per hierarchy (one for v2).
    pub dirs: Vec<PathBuf>,
    /// "v2" or "v1".
    pub version: String,
    /// The systemd transient scope it was made in, if it was.
    #[serde(default)]
    pub scope: Option<String>,
    /// The instance's directories (one per hierarchy) that hold `dirs`: every
    /// server generation of an instance gets a cgroup below the same one, so
    /// the confined supervisor's rules name only its own (`crate::confine`).
    #[serde(default)]
    pub instance: Vec<PathBuf>,
}

impl Cgroup {
    /// Where it is, for reports: "v2", "v1", or "v2 in the systemd scope …".
    pub(crate) fn place(&self) -> String {
        match &self.scope {
            Some(s) => format!(
                "{} in the systemd transient scope {s} (Delegate=yes)",
                self.version
            ),
            None => self.version.clone(),
        }
    }

    /// Moves the calling process into the cgroup. A v1 hierarchy is joined
    /// through `tasks` while the process has one thread: moving the calling
    /// thread alone skips the kernel's thread-group lock, whose first taker
    /// waits out an RCU grace period (5 to 40 ms here, on every start), and
    /// with one thread it moves the whole process.
    pub(crate) fn join_self(&self) -> std::io::Result<()> {
        let file = if self.version == "v1" && threads()? == 1 {
            "tasks"
        } else {
            "cgroup.procs"
        };
        for d in &self.dirs {
            std::fs::write(d.join(file), "0")?;
        }
        Ok(())
    }
}
