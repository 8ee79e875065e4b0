//! Limits: rlimits set in PID 1 and inherited by everything inside.
//!
//! `RLIMIT_NPROC` is the backstop for `processes`: since Linux 5.14 it is counted
//! per (user namespace, uid), so it counts the sandbox's processes only. It is not
//! enforced for host uid 0 (the kernel exempts the root user), which is why a
//! root-started sandbox needs the cgroup layer for a real pids limit.

use crate::profile::Limits;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Why a limit could not be set.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LimitsError {
    /// The current limit could not be read.
    #[error("getrlimit({name}): {source}")]
    Get {
        name: &'static str,
        source: nix::Error,
    },
    /// The limit could not be set.
    #[error("setrlimit({name}, {value}): {source}")]
    Set {
        name: &'static str,
        value: u64,
        source: nix::Error,
    },
}

/// What was set, for the report.
pub(crate) fn apply(l: &Limits) -> Result<String, LimitsError> {
    // A limit above the caller's hard limit cannot be raised without privilege
    // over the host: it is clamped (only ever lowered), and the report shows it.
    let set = |r: Resource, v: u64, name: &'static str| -> Result<u64, LimitsError> {
        let (_, hard) = getrlimit(r).map_err(|source| LimitsError::Get { name, source })?;
        let v = v.min(hard);
        setrlimit(r, v, v).map_err(|source| LimitsError::Set {
            name,
            value: v,
            source,
        })?;
        Ok(v)
    };
    let nofile = set(Resource::RLIMIT_NOFILE, l.nofile, "NOFILE")?;
    let nproc = set(Resource::RLIMIT_NPROC, l.processes, "NPROC")?;
    let fsize = set(Resource::RLIMIT_FSIZE, l.file_size.0, "FSIZE")?;
    let core = set(Resource::RLIMIT_CORE, l.core, "CORE")?;
    Ok(format!(
        "nofile={nofile} nproc={nproc} fsize={fsize} core={core}"
    ))
}
