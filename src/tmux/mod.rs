//! tmux itself: the binary and its version, the embedded minimal
//! configuration, the control-mode protocol and clients, and what a fresh
//! server is made with (`genesis`). Starting, proving and stopping an
//! instance's server is the host side's (`crate::supervisor`).

pub(crate) mod client;
pub(crate) mod closing;
pub(crate) mod cmd;
pub mod control;
pub(crate) mod genesis;
pub(crate) mod hub;
pub(crate) mod streams;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The embedded configuration (see `minimal-tmux.conf`).
pub(crate) const MINIMAL_CONF: &str = include_str!("../../minimal-tmux.conf");

/// Oldest tmux sandmux runs (allow-passthrough appeared in 3.3).
pub(crate) const MIN_VERSION: (u32, u32) = (3, 3);

/// Makes `s` literal for an argument tmux expands as a format (session and
/// window names, pane titles, start directories): each `#` is doubled, so
/// tmux's single expansion yields exactly `s` and `#(...)` can never run (T3).
pub(crate) fn fmt_literal(s: &str) -> String {
    s.replace('#', "##")
}

/// A start directory as one argv word of a tmux command: `#` doubled (tmux
/// expands `-c` as a format) and a final `;` escaped (one would end the
/// command).
pub(crate) fn start_dir_arg(dir: &str) -> String {
    let s = fmt_literal(dir);
    match s.strip_suffix(';') {
        Some(head) => format!("{head}\\;"),
        None => s,
    }
}

/// Why tmux could not be found or is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocateError {
    /// No `tmux` on PATH.
    #[error("tmux not found on PATH (install it, e.g. apt-get install tmux)")]
    NotFound,
    /// Its links could not be resolved.
    #[error("{}: {source}", path.display())]
    Resolve {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `tmux -V` could not be run or read.
    #[error("{} -V: {source}", bin.display())]
    Probe {
        bin: PathBuf,
        source: std::io::Error,
    },
    /// Older than [`MIN_VERSION`].
    #[error(
        "{} is {found}; sandmux needs tmux {}.{} or newer",
        bin.display(),
        MIN_VERSION.0,
        MIN_VERSION.1
    )]
    TooOld { bin: PathBuf, found: String },
}

/// Finds tmux on PATH and checks its version (the library's public
/// surface, `testing`, and `attach`: the message).
pub fn find_tmux() -> Result<PathBuf, String> {
    find_tmux_version()
        .map(|(bin, _)| bin)
        .map_err(|e| e.to_string())
}

/// Finds tmux on PATH and checks its version; returns it with its `-V`.
pub(crate) fn find_tmux_version() -> Result<(PathBuf, String), LocateError> {
    let bin = locate_tmux()?;
    let probe = version_probe(&bin)?;
    read_version(&bin, probe).map(|v| (bin, v))
}

/// tmux on PATH, its links resolved.
pub(crate) fn locate_tmux() -> Result<PathBuf, LocateError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let bin = std::env::split_paths(&path)
        .map(|d| d.join("tmux"))
        .find(|p| p.is_file())
        .ok_or(LocateError::NotFound)?;
    std::fs::canonicalize(&bin).map_err(|source| LocateError::Resolve { path: bin, source })
}

/// `tmux -V`, started now and read later ([`read_version`]).
pub(crate) fn version_probe(bin: &Path) -> Result<Child, LocateError> {
    Command::new(bin)
        .arg("-V")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| probe_failed(bin, source))
}

/// The probe's answer, checked against [`MIN_VERSION`].
pub(crate) fn read_version(bin: &Path, probe: Child) -> Result<String, LocateError> {
    let out = probe
        .wait_with_output()
        .map_err(|source| probe_failed(bin, source))?;
    let v = String::from_utf8_lossy(&out.stdout);
    let num: String = v
        .trim()
        .trim_start_matches("tmux ")
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = num.split('.').map(|s| s.parse::<u32>().unwrap_or(0));
    let ver = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    if ver < MIN_VERSION {
        return Err(LocateError::TooOld {
            bin: bin.to_path_buf(),
            found: v.trim().to_string(),
        });
    }
    Ok(v.trim().to_string())
}

fn probe_failed(bin: &Path, source: std::io::Error) -> LocateError {
    LocateError::Probe {
        bin: bin.to_path_buf(),
        source,
    }
}
