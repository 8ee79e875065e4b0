//! The apply journal's reader and the layer's `taken/` names: what
//! `apply` (which writes the journal) and `apply --undo` (which reverses
//! it) share; and `restored.jsonl`, what the undo put back, so the same
//! layer applies again cleanly.

use super::diff::stat_at;
use super::error::JournalError;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// A file moved out of the layer as placed: its inode, size and
/// modification time (an edit in place keeps the inode, not the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Placed {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
}

impl Placed {
    pub(super) fn of(m: &std::fs::Metadata) -> Placed {
        use std::os::unix::fs::MetadataExt;
        Placed {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        }
    }

    pub(super) fn is(&self, s: &nix::sys::stat::FileStat) -> bool {
        let mtime = s.st_mtime * 1_000_000_000 + s.st_mtime_nsec;
        (s.st_dev, s.st_ino, s.st_size as u64, mtime)
            == (self.dev, self.ino, self.size, self.mtime_ns)
    }
}

/// One step, as the journal records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub(crate) enum Step {
    /// A directory made.
    Mkdir { rel: PathBuf },
    /// A file written where nothing was; `placed`: what a file moved out
    /// of the layer was when placed (its content is no longer there to
    /// compare).
    Create {
        rel: PathBuf,
        #[serde(default)]
        placed: Option<Placed>,
    },
    /// A file replaced; the old one is `taken`.
    Replace {
        rel: PathBuf,
        taken: PathBuf,
        #[serde(default)]
        placed: Option<Placed>,
    },
    /// An entry removed into `taken`.
    Remove { rel: PathBuf, taken: PathBuf },
    /// After a `Replace` kept the host's file as `taken` (a hard link,
    /// which sets the inode's ctime): that ctime. The host's file still
    /// that inode with that ctime is untouched since, and a later `apply`
    /// finishes the step (one killed before its rename); no line, no
    /// finishing: a conflict, as for any file the human changed.
    Kept {
        rel: PathBuf,
        taken: PathBuf,
        ctime_ns: i64,
    },
}

/// The `n`th name in `taken/` of one apply (`prefix`: random, its own)
/// for an entry called `name`: unique without a random draw each.
pub(super) fn taken_name(prefix: &str, n: u64, name: &Path) -> PathBuf {
    PathBuf::from(format!("{prefix}{n:x}-{}", name.display()))
}

/// The steps the journal of the layer at `layer` records (none when it
/// has none). A line that cannot be read is an error: dropped, a rewrite
/// of the journal would lose the step it records. A torn last line (no
/// newline: a crash while it was written) recorded a step never made.
pub(super) fn journaled(layer: &Path) -> Result<Vec<Step>, JournalError> {
    let path = layer.join("apply.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(JournalError::Read { path, source }),
    };
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| JournalError::Line {
                path: path.clone(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// The stat of `taken` (a name in the layer's `taken/`), through no link.
pub(super) fn taken_stat(layer: &Path, taken: &Path) -> Option<nix::sys::stat::FileStat> {
    let n = taken.file_name()?;
    let tdir = crate::sandbox::beneath::open_root(&layer.join("taken")).ok()?;
    stat_at(&tdir, Path::new(n))
}

/// A new file `name` in `dir` for writing, never through a link, never
/// one that exists: the temporary an entry is written to before it is
/// renamed into place.
pub(super) fn create_new(dir: &OwnedFd, name: &Path, mode: u32) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
}

/// What `apply --undo` put back at `rel`, as it stood right after: its
/// device, inode and ctime. The rename that put it back gave it a new
/// ctime; while all three are the same nothing has touched it since (an
/// edit, a `chmod`, a `touch`, a rename over it all change one), so a later
/// `apply` of the layer takes it for what the undo restored, the human's
/// entry as the first apply found it, not for the human's change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Restored {
    dev: u64,
    ino: u64,
    ctime_ns: i64,
}

impl Restored {
    fn of(s: &nix::sys::stat::FileStat) -> Restored {
        Restored {
            dev: s.st_dev,
            ino: s.st_ino,
            ctime_ns: s.st_ctime * 1_000_000_000 + s.st_ctime_nsec,
        }
    }

    /// Whether `s` is the entry as it was restored, untouched since.
    pub(super) fn is(&self, s: &nix::sys::stat::FileStat) -> bool {
        *self == Restored::of(s)
    }
}

/// One line of the layer's `restored.jsonl`.
#[derive(Serialize, Deserialize)]
struct RestoredLine {
    rel: PathBuf,
    #[serde(flatten)]
    what: Restored,
}

/// Notes in the layer's `restored.jsonl` that `apply --undo` put back the
/// entry now at `rel` (stat `s`). Not noted (a failed write): the next
/// `apply` takes it for the human's change, a conflict (nothing is lost).
pub(super) fn note_restored(layer: &Path, rel: &Path, s: &nix::sys::stat::FileStat) {
    use std::io::Write;
    let line = RestoredLine {
        rel: rel.to_path_buf(),
        what: Restored::of(s),
    };
    let Ok(mut text) = serde_json::to_vec(&line) else {
        return;
    };
    text.push(b'\n');
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(layer.join("restored.jsonl"));
    if let Ok(mut f) = file {
        let _ = f.write_all(&text);
    }
}

/// What the layer's `apply --undo`s put back, by path (the latest for each;
/// a line that cannot be read is skipped: its entry is then a conflict).
pub(super) fn restored(layer: &Path) -> HashMap<PathBuf, Restored> {
    let text = std::fs::read_to_string(layer.join("restored.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<RestoredLine>(l).ok())
        .map(|l| (l.rel, l.what))
        .collect()
}
