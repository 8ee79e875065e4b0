//! The copy-on-write layers instances leave for the human, together:
//! `sandmux ps --all` lists them; when an instance starts, those whose
//! instance has ended and that are older than `[workspace] keep_days` of
//! `config.toml` are removed, and if the rest hold more than `[workspace]
//! kept_bytes` the instance refuses to start (nothing the human has not
//! seen is removed for room).

use super::layer::{self, Meta};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Entries looked at per layer when it is measured; past this the size is
/// a lower bound (and said to be).
const MEASURE_MAX: u64 = 1_000_000;

/// One kept layer.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Kept {
    /// The instance's id.
    pub id: String,
    /// What its `meta.json` says.
    pub meta: Meta,
    /// Its instance still runs (its lock is held).
    pub running: bool,
    /// An `apply` (or `--undo`) has run on it: its journal has a step.
    pub applied: bool,
    /// Bytes on disk of the agent's writes (`upper/`).
    pub bytes: u64,
    /// Entries in `upper/`.
    pub files: u64,
    /// More entries than were counted: `bytes` and `files` are lower bounds.
    pub more: bool,
}

/// Every layer in the state directory, oldest first.
pub(crate) fn list() -> Vec<Kept> {
    let Ok(state) = crate::guard::quarantine::existing_state_dir() else {
        return Vec::new();
    };
    let mut out: Vec<Kept> = std::fs::read_dir(state.join("layers"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .filter_map(|id| {
            let (dir, meta) = layer::find_in(&state, &id).ok()?;
            let running = layer::ended(&dir, &id).is_err();
            let (bytes, files, more) = match running {
                true => with_views(&dir, usage(&super::layer::writes(&dir))),
                false => ended_usage(&dir),
            };
            let applied = dir
                .join("apply.jsonl")
                .symlink_metadata()
                .is_ok_and(|m| m.is_file() && m.len() > 0)
                || super::history::views::applied(&dir);
            Some(Kept {
                id,
                meta,
                running,
                applied,
                bytes,
                files,
                more,
            })
        })
        .collect();
    out.sort_by_key(|k| k.meta.created_ns);
    out
}

/// The name of an ended layer's measure, kept beside its `meta.json` (an
/// ended layer changes only through `apply`, which removes it).
pub(crate) const USAGE: &str = "usage.json";

/// An ended layer's usage: measured once, then read back, so that starting
/// an instance does not walk every kept layer each time.
fn ended_usage(dir: &Path) -> (u64, u64, bool) {
    let cached = crate::sandbox::beneath::read_small(&dir.join(USAGE), 4096)
        .and_then(|t| serde_json::from_str::<(u64, u64, bool)>(&t).ok());
    if let Some(u) = cached {
        return u;
    }
    let u = with_views(dir, usage(&super::layer::writes(dir)));
    if let Ok(t) = serde_json::to_string(&u) {
        let _ = std::fs::write(dir.join(USAGE), t);
    }
    u
}

/// `upper`'s usage `u` and that of the layer's views of checkpoints
/// (`door::upto`: `diff`/`apply --upto N` write them in the layer's
/// directory, and they stay until `discard`), a file with several names
/// in a view counted once (a view links repeated content).
fn with_views(dir: &Path, u: (u64, u64, bool)) -> (u64, u64, bool) {
    let mut once = std::collections::HashSet::new();
    super::history::views::dirs(dir)
        .iter()
        .fold(u, |(b, f, m), v| {
            let (vb, vf, vm) = measure(v, MEASURE_MAX, Some(&mut once));
            (b.saturating_add(vb), f.saturating_add(vf), m || vm)
        })
}

/// Bytes below `dir` (on disk, or a file's apparent size where that is
/// larger: holes count) and entries, links not followed.
pub(crate) fn usage(dir: &Path) -> (u64, u64, bool) {
    usage_upto(dir, MEASURE_MAX)
}

/// [`usage`], counting at most `max` entries (`true`: there are more).
pub(crate) fn usage_upto(dir: &Path, max: u64) -> (u64, u64, bool) {
    measure(dir, max, None)
}

/// [`usage_upto`]; with `once`, a file of several names counts once (its
/// device and inode kept there).
fn measure(
    dir: &Path,
    max: u64,
    mut once: Option<&mut std::collections::HashSet<(u64, u64)>>,
) -> (u64, u64, bool) {
    let (mut bytes, mut files) = (0u64, 0u64);
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let listed = crate::sandbox::beneath::entries(&d).or_else(|e| {
            // A directory the agent made unreadable to its owner (the
            // supervisor's uid): its owner's rights back, else the measure
            // would miss what it holds.
            if let (Some(parent), Some(name)) = (d.parent(), d.file_name()) {
                if let Ok(p) = crate::sandbox::beneath::open_root(parent) {
                    crate::sandbox::beneath::unlock_dir(&p, Path::new(name));
                }
            }
            crate::sandbox::beneath::entries(&d).map_err(|_| e)
        });
        let Ok(listed) = listed else {
            return (bytes, files, true); // unreadable: a lower bound
        };
        for (name, _) in listed {
            files += 1;
            if files > max {
                return (bytes, files - 1, true);
            }
            let p = d.join(name);
            let Ok(m) = p.symlink_metadata() else {
                continue;
            };
            let again = |o: &mut std::collections::HashSet<_>| !o.insert((m.dev(), m.ino()));
            if m.nlink() > 1 && !m.is_dir() && once.as_deref_mut().is_some_and(again) {
                continue;
            }
            // A sparse file costs the layer nothing but a copy of it would
            // cost the host its apparent size: the larger counts.
            bytes += (m.blocks() * 512).max(if m.is_file() { m.len() } else { 0 });
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    (bytes, files, false)
}

/// When the layer was made or last applied (its journal, its `taken/`, a
/// view's):
/// `keep_days` counts from there, so the human's files an `apply` just set
/// aside get the whole time.
fn last_used(k: &Kept) -> i128 {
    let Ok((dir, _)) = layer::find(&k.id) else {
        return k.meta.created_ns;
    };
    // A view's too: `apply --upto N` keeps its journal and `taken/` there.
    let at = std::iter::once(dir.clone()).chain(super::history::views::dirs(&dir));
    at.flat_map(|d| [d.join("apply.jsonl"), d.join("taken")])
        .filter_map(|p| p.symlink_metadata().ok())
        .map(|m| i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()))
        .fold(k.meta.created_ns, i128::max)
}

/// Whether `apply` kept anything in layer `id`: a journal, or the human's
/// files in `taken/`, the layer's or a view's (`apply --upto N`).
fn kept_anything(id: &str) -> bool {
    let Ok((dir, _)) = layer::find(id) else {
        return true;
    };
    let journal = dir.join("apply.jsonl").symlink_metadata().is_ok();
    let taken = match crate::sandbox::beneath::entries(&dir.join("taken")) {
        Ok(t) => !t.is_empty(),
        Err(e) => e != nix::Error::ENOENT,
    };
    // An `apply --upto`'s are in its view (`door::upto`).
    journal || taken || super::history::views::applied(&dir)
}

/// Before a layer is made: removes ended layers older than `keep_days` (0
/// keeps them), then refuses when the rest hold more than `cap` bytes.
/// The lines say what was removed.
pub(crate) fn make_room(keep_days: u32, cap: u64) -> Result<Vec<String>, layer::LayerError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0);
    let limit = i128::from(keep_days) * 86_400 * 1_000_000_000;
    let mut said = Vec::new();
    let mut total = 0u64;
    for k in list() {
        let old = keep_days > 0 && now - last_used(&k) > limit;
        // An ended layer with no change and nothing `apply` kept (its
        // supervisor was killed before it could remove it) holds nothing
        // to lose.
        if !k.running
            && k.files == 0
            && !k.more
            && !kept_anything(&k.id)
            && layer::discard(&k.id).is_ok()
        {
            said.push(format!("removed layer {} (no change in it)", k.id));
            continue;
        }
        if old && !k.running && layer::discard(&k.id).is_ok() {
            said.push(format!(
                "removed layer {} of {} (older than [workspace] keep_days = {keep_days} of config.toml)",
                k.id,
                k.meta.workspace.display()
            ));
            continue;
        }
        total = total.saturating_add(k.bytes);
    }
    if total > cap {
        return Err(layer::LayerError::OverKept {
            total,
            cap,
            config: crate::profile::user::path(),
        });
    }
    Ok(said)
}
