//! Applied = reviewed. `diff` ends with a digest of what it showed: every
//! change of the selection, each with its kind, mode and the SHA-256 of its
//! bytes, and whether the door holds it back. It also keeps that list in the
//! layer's directory (the human's, 0700: the agent writes only `upper/`).
//! `apply --expect DIGEST` brings exactly that or nothing; a plain `apply`
//! after a `diff` brings nothing that differs from what that `diff` showed
//! (it names what changed and applies nothing); a plain `apply` with no
//! `diff` before it is the human's choice not to review, and says the
//! digest of what it brought.

use super::diff::{Change, Trees};
use super::error::ReviewError;
use super::DoorError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file in the layer's directory that keeps the last review.
pub(crate) const REVIEWED: &str = "reviewed.json";
/// Hex digits of a digest as shown and expected (96 bits).
pub(crate) const SHOWN: usize = 24;

/// What one review covered: a line per path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    entries: BTreeMap<PathBuf, String>,
}

impl Manifest {
    /// Adds change `c` (`held`: the door holds it back; `ignored`: git
    /// ignores it).
    pub(crate) fn add(&mut self, t: &Trees, c: &Change, held: bool, ignored: bool) {
        let rel = c.rel();
        let line = match c {
            Change::Added { what: "file", .. } | Change::Modified { .. } => {
                let st = t.upper_stat(rel);
                let mode = st.map_or(0, |s| s.st_mode & 0o7777);
                format!("file {mode:o} {}", content(&t.upper, rel))
            }
            Change::Added { what, .. } => format!("add {what}"),
            Change::Removed { .. } => "remove".to_string(),
            Change::Unreadable { why, .. } => format!("unreadable {why}"),
        };
        let line = if ignored {
            format!("ignored {line}")
        } else {
            line
        };
        let line = if held { format!("held {line}") } else { line };
        // A path both removed and added (a file replaced by a directory)
        // has both lines.
        let e = self.entries.entry(rel.to_path_buf()).or_default();
        if !e.is_empty() {
            e.push_str(" + ");
        }
        e.push_str(&line);
    }

    /// The digest as shown: the first [`SHOWN`] hex digits of the SHA-256
    /// of every line.
    pub(crate) fn digest(&self) -> String {
        let mut h = Sha256::new();
        for (rel, line) in &self.entries {
            h.update(rel.as_os_str().as_encoded_bytes());
            h.update(b"\0");
            h.update(line.as_bytes());
            h.update(b"\n");
        }
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        hex[..SHOWN].to_string()
    }

    /// The paths whose line differs between `self` (now) and `seen` (the
    /// review) — bytes, mode, and whether it was held back or ignored —
    /// limited to the paths `only` names (None: all).
    pub(crate) fn differing(&self, seen: &Manifest, only: Option<&[PathBuf]>) -> Vec<PathBuf> {
        let only: Option<std::collections::HashSet<&Path>> =
            only.map(|o| o.iter().map(PathBuf::as_path).collect());
        let matters = |p: &Path| only.as_ref().is_none_or(|o| o.contains(p));
        let mut out: Vec<PathBuf> = self
            .entries
            .iter()
            .filter(|(p, l)| matters(p) && seen.entries.get(*p) != Some(*l))
            .map(|(p, _)| p.clone())
            .collect();
        if only.is_none() {
            out.extend(
                seen.entries
                    .keys()
                    .filter(|p| !self.entries.contains_key(*p))
                    .cloned(),
            );
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The digest of the layer's file at `rel` (`sparse::digest`: holes cost
/// nothing), read beneath the layer without following links.
fn content(upper: &std::os::fd::OwnedFd, rel: &Path) -> String {
    use nix::fcntl::OFlag;
    let fd = crate::sandbox::beneath::beneath(
        upper,
        rel,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
    );
    let Ok(fd) = fd else {
        return "unreadable".into();
    };
    let f = std::fs::File::from(fd);
    super::sparse::digest(&f).unwrap_or_else(|_| "unreadable".into())
}

/// The last review of a layer, as `diff` kept it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Reviewed {
    /// The paths `diff` was limited to (empty: all).
    pub(crate) paths: Vec<PathBuf>,
    /// The instance still ran: the agent could change what was shown
    /// while it was read, so no apply trusts this review.
    #[serde(default)]
    pub(crate) running: bool,
    pub(crate) digest: String,
    pub(crate) manifest: Manifest,
}

impl Reviewed {
    /// Keeps this review in the layer's directory `dir` (replacing one
    /// before it, atomically).
    pub(crate) fn save(&self, dir: &Path) -> Result<(), DoorError> {
        let text = serde_json::to_vec(self).map_err(ReviewError::Encode)?;
        let tmp = dir.join(format!("{REVIEWED}.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, dir.join(REVIEWED)))
            .map_err(|source| ReviewError::File {
                path: dir.join(REVIEWED),
                source,
            })?;
        Ok(())
    }

    /// The last review of the layer at `dir`, if there was one.
    pub(crate) fn load(dir: &Path) -> Result<Option<Reviewed>, DoorError> {
        let path = dir.join(REVIEWED);
        let read = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| ReviewError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ReviewError::File { path, source }),
        };
        Ok(read?)
    }
}
