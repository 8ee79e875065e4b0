//! Secrets read from files on the host (`serve --http --token-file`, a
//! `[[credentials]]` entry's `from_file`): a regular file owned by this user
//! (or root) that neither group nor others can read or write (a Kubernetes
//! Secret mounted with `defaultMode: 0400` and the pod's `runAsUser`
//! passes); one line of printable ASCII, surrounding whitespace trimmed. A
//! FIFO or device is refused without waiting on it. Each read keeps the
//! opened file's [`Stamp`], so a caller can tell when it changed.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What identifies one version of a file: the file a path leads to (links
/// followed, as a rotated Kubernetes Secret swaps a link) and its size and
/// times.
pub(crate) type Stamp = (u64, u64, u64, i64, i64, i64, i64);

/// Why a secret file was refused; every message starts with the caller's
/// `what` (e.g. `--token-file /run/t`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretFileError {
    /// It could not be opened, looked at or read.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A directory, FIFO, device.
    #[error("{what}: not a regular file")]
    NotRegular { what: String },
    /// Owned by someone else than this user or root.
    #[error("{what}: owned by uid {uid}, not by this user ({me}) or root")]
    Owner { what: String, uid: u32, me: u32 },
    /// Group or others may read or write it.
    #[error("{what}: mode {mode:04o} lets group or others read or write it; chmod 0400 (Kubernetes: the Secret volume's defaultMode: 0400)")]
    Mode { what: String, mode: u32 },
    /// Too short or too long.
    #[error("{what}: the secret must be {min}-{max} bytes (it has {len})")]
    Length {
        what: String,
        min: usize,
        max: usize,
        len: usize,
    },
    /// Spaces, control characters or non-ASCII.
    #[error("{what}: the secret must be one line of printable ASCII without spaces")]
    NotOneLine { what: String },
}

/// The stamp of what `path` leads to now (None: it cannot be looked at).
pub(crate) fn stamp(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| stamp_of(&m))
}

fn stamp_of(m: &std::fs::Metadata) -> Stamp {
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// The directories a confined process must keep readable to read `file`
/// again after a rotation: its own (a rename or a swapped link replaces
/// the file there) and, when it is a link, its target's (a Kubernetes
/// Secret's `..data/` swap lands below the file's own). Never a wide one
/// ([`narrow`]): a rule there would open what else it holds; `None` when
/// the file or its link's target is in one (the caller refuses it).
pub(crate) fn dirs(file: &Path) -> Option<Vec<PathBuf>> {
    let own = file.parent().filter(|d| narrow(d))?;
    let mut v = vec![own.to_path_buf()];
    let target = std::fs::canonicalize(file).ok();
    if let Some(d) = target.as_deref().and_then(Path::parent) {
        if !narrow(d) {
            return None;
        }
        if !v.iter().any(|x| d.starts_with(x)) {
            v.push(d.to_path_buf());
        }
    }
    Some(v)
}

/// Whether a rule for all of `d` opens little besides a secret: at least
/// two levels below `/` (not `/etc`, `/tmp`, `/root`), and not the home
/// directory or one above it.
fn narrow(d: &Path) -> bool {
    let deep = d.is_absolute() && d.components().count() >= 3;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    deep && !home.is_some_and(|h| h.starts_with(d))
}

/// Reads the one line of `path` (`what` starts every error, e.g.
/// `--token-file /run/t`), of `min`–`max` printable bytes without spaces.
pub(crate) fn read(
    path: &Path,
    what: &str,
    (min, max): (usize, usize),
) -> Result<(Vec<u8>, Stamp), SecretFileError> {
    let what = what.to_string();
    let io = |source| SecretFileError::Io {
        what: what.clone(),
        source,
    };
    // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
    // waiting for a writer. Links are followed: Secret files are symlinks.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let m = f.metadata().map_err(io)?;
    if !m.is_file() {
        return Err(SecretFileError::NotRegular { what });
    }
    let me = nix::unistd::geteuid().as_raw();
    if m.uid() != me && m.uid() != 0 {
        let uid = m.uid();
        return Err(SecretFileError::Owner { what, uid, me });
    }
    if m.mode() & 0o077 != 0 {
        let mode = m.mode() & 0o7777;
        return Err(SecretFileError::Mode { what, mode });
    }
    let mut buf = Vec::new();
    use std::io::Read;
    f.take(max as u64 + 2).read_to_end(&mut buf).map_err(io)?;
    let t = buf.trim_ascii();
    if t.len() < min || t.len() > max {
        let len = t.len();
        return Err(SecretFileError::Length {
            what,
            min,
            max,
            len,
        });
    }
    if !t.iter().all(|b| b.is_ascii_graphic()) {
        return Err(SecretFileError::NotOneLine { what });
    }
    Ok((t.to_vec(), stamp_of(&m)))
}
