//! Where audit logs live: the default directory under
//! `$XDG_STATE_HOME/sandmux/audit`, an instance's log in it, and the
//! finished logs `sandmux journal` reads.

use std::path::PathBuf;

/// Why no audit log could be named or found.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PathsError {
    /// Neither `XDG_STATE_HOME` nor `HOME` is set.
    #[error("no XDG_STATE_HOME or HOME for the audit log; pass --audit-log PATH")]
    NoBase,
    /// The audit directory could not be listed.
    #[error("{}: {source}", dir.display())]
    List {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// No log is named after the prefix.
    #[error("no running instance {prefix:?} (see sandmux ps), and no audit log named after it in {}", dir.display())]
    NoMatch { prefix: String, dir: PathBuf },
    /// The prefix names several instances.
    #[error("{prefix:?} matches {n} instances' audit logs; give more of the id")]
    Ambiguous { prefix: String, n: usize },
}

/// The default audit directory: `$XDG_STATE_HOME/sandmux/audit` (or
/// `~/.local/state/sandmux/audit`).
pub(crate) fn default_dir() -> Result<PathBuf, PathsError> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .ok_or(PathsError::NoBase)?;
    Ok(base.join("sandmux").join("audit"))
}

/// A new log for instance `id` in [`default_dir`]: `<unix time>-<id>.jsonl`.
pub(crate) fn default_path(id: &str) -> Result<PathBuf, PathsError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dir = default_dir()?;
    Ok(dir.join(format!("{secs}-{id}.jsonl")))
}

/// Instance `id`'s log in [`default_dir`], if it has one (the newest).
pub(crate) fn of_instance(id: &str) -> Option<PathBuf> {
    let tail = format!("-{id}.jsonl");
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(default_dir().ok()?)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let secs = name.strip_suffix(&tail)?.parse::<u64>().ok()?;
            Some((secs, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// The log of the instance whose id starts with `prefix`, in
/// [`default_dir`] (a finished instance: `sandmux journal ID`); an error
/// names what matched.
pub(crate) fn finished(prefix: &str) -> Result<PathBuf, PathsError> {
    let dir = default_dir()?;
    let mut found: Vec<(String, u64, PathBuf)> = std::fs::read_dir(&dir)
        .map_err(|source| PathsError::List {
            dir: dir.clone(),
            source,
        })?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (secs, id) = name.strip_suffix(".jsonl")?.split_once('-')?;
            (id.starts_with(prefix) && !prefix.is_empty())
                .then(|| Some((id.to_string(), secs.parse().ok()?, e.path())))?
        })
        .collect();
    found.sort();
    let ids: std::collections::BTreeSet<&String> = found.iter().map(|f| &f.0).collect();
    match ids.len() {
        0 => Err(PathsError::NoMatch {
            prefix: prefix.into(),
            dir,
        }),
        1 => Ok(found.pop().map(|f| f.2).expect("one")),
        n => Err(PathsError::Ambiguous {
            prefix: prefix.into(),
            n,
        }),
    }
}
