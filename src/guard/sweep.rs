//! Sweeps (W3): what the guard planned at start against what is there now —
//! at the end of an instance, and at the next start after an unclean end
//! (a manifest no live instance holds). Also the lines said to the human.

use super::quarantine::{How, Quarantine, Taken};
use super::{scan, GitMode, Guard, TreeGuard};
use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What the manifest holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) id: String,
    pub(crate) pid: u32,
    pub(crate) guard: Guard,
    /// SHA-256 of each guarded file that existed at start (git configs
    /// included): after an unclean end, what changed is named.
    #[serde(default)]
    pub(crate) digests: std::collections::BTreeMap<PathBuf, String>,
}

/// Digests of the guarded files that exist at start (regular files up to 1 MiB).
pub(crate) fn digests(guard: &Guard) -> std::collections::BTreeMap<PathBuf, String> {
    use sha2::Digest;
    let mut out = std::collections::BTreeMap::new();
    for t in &guard.trees {
        let Ok(fd) = crate::sandbox::beneath::open_root(&t.root) else {
            continue;
        };
        let configs = t.at_start.repos.iter().map(|r| r.join("config"));
        for rel in t.at_start.names.iter().cloned().chain(configs).take(4096) {
            let Ok(f) = crate::sandbox::beneath::beneath(
                &fd,
                &rel,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
            ) else {
                continue;
            };
            let mut b = Vec::new();
            let file = std::fs::File::from(f);
            if file.metadata().map(|m| m.is_file()).unwrap_or(false)
                && std::io::Read::read_to_end(&mut std::io::Read::take(file, 1 << 20), &mut b)
                    .is_ok()
            {
                let d: String = sha2::Sha256::digest(&b)
                    .iter()
                    .map(|x| format!("{x:02x}"))
                    .collect();
                out.insert(t.root.join(rel), d);
            }
        }
    }
    out
}

/// Guarded files whose digest differs from the manifest's (or that are gone).
fn changed_since(m: &Manifest) -> Vec<String> {
    let now = digests(&m.guard);
    m.digests
        .iter()
        .filter(|(p, d)| now.get(*p) != Some(*d))
        .map(|(p, _)| crate::term::printable(&p.to_string_lossy()))
        .collect()
}

/// What the end sweep takes from one tree, shallowest first: depth, the
/// path relative to the tree's root, and why.
type New = BTreeSet<(usize, PathBuf, &'static str)>;

/// The end sweep: what the guard planned against what is there now. Returns
/// what it took, and warnings for what it could not check.
pub(crate) fn sweep(guard: &Guard, q: &mut Quarantine) -> (Vec<Taken>, Vec<String>) {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for t in &guard.trees {
        let Ok(fd) = crate::sandbox::beneath::open_root(&t.root) else {
            continue;
        };
        if let Some(w) = restore_mode(&fd, &t.root, t.mode) {
            warnings.push(w);
        }
        let mut new = New::new();
        if !t.at_start.complete {
            warnings.push(format!(
                "{}: the walk at start stopped after {} entries, so the end sweep could not tell new repositories and guarded names below the top from old ones; check the tree yourself",
                crate::term::printable(&t.root.to_string_lossy()),
                scan::MAX_ENTRIES
            ));
        } else if let Ok(now) = scan::walk_unlocking(
            &t.root,
            &guard.names,
            guard.git != GitMode::Unguarded,
            &t.at_start.unreadable,
        ) {
            let mut seen = Seen {
                guard,
                t,
                now: &now,
                new: &mut new,
                warnings: &mut warnings,
            };
            seen.not_checked();
            seen.new_repos();
            seen.new_special(&fd);
            seen.new_names();
        }
        for w in &t.watched {
            new.insert((w.components().count(), w.clone(), "guarded name"));
        }
        take_new(q, &fd, &t.root, new, &mut out);
    }
    (out, warnings)
}

/// One tree's walk at the end against its walk at start.
struct Seen<'a> {
    guard: &'a Guard,
    t: &'a TreeGuard,
    now: &'a scan::Found,
    new: &'a mut New,
    warnings: &'a mut Vec<String>,
}

impl Seen<'_> {
    /// Whether `p` is below a directory that could not be read at start
    /// (what is there cannot be told new from old).
    fn unknown(&self, p: &Path) -> bool {
        self.t.at_start.unreadable.iter().any(|u| p.starts_with(u))
    }

    /// Warnings for what the end walk could not read.
    fn not_checked(&mut self) {
        let root = &self.t.root;
        for u in self.now.unreadable.iter() {
            self.warnings.push(format!(
                "{}: a directory that could not be read; repositories and guarded names below it were not checked",
                crate::term::printable(&root.join(u).to_string_lossy())
            ));
        }
        if !self.now.complete {
            self.warnings.push(format!(
                "{}: the end sweep stopped after {} entries; repositories and guarded names deeper down were not checked",
                crate::term::printable(&root.to_string_lossy()),
                scan::MAX_ENTRIES
            ));
        }
    }

    /// Repositories that were not there at start: left in place if the
    /// profile allows them, a `.git` whole, a bare shape as [`Shape`] says.
    fn new_repos(&mut self) {
        let (t, guard) = (self.t, self.guard);
        let now = self.now;
        for r in now.repos.difference(&t.at_start.repos) {
            if self.unknown(r) {
                continue;
            }
            if guard.new_repositories == super::NewRepos::Allow {
                self.warnings.push(format!(
                    "left in place, as the profile allows new repositories: {} (host git obeys its config and hooks)",
                    crate::term::printable(&t.root.join(r).to_string_lossy())
                ));
            } else if r.file_name().is_some_and(|n| n == ".git") {
                self.new
                    .insert((r.components().count(), r.clone(), "new repository"));
            } else {
                let mut shape = Shape {
                    root: &t.root,
                    names: &guard.names,
                    at_start: &t.at_start,
                    take: Vec::new(),
                    warnings: self.warnings,
                };
                shape.visit(r, 0);
                for (p, why) in shape.take {
                    self.new.insert((p.components().count(), p, why));
                }
            }
        }
    }

    /// Sockets, FIFOs and device nodes that were not there at start: removed
    /// (unless the walk at start recorded too many to tell).
    fn new_special(&mut self, fd: &impl std::os::fd::AsFd) {
        let t = self.t;
        if t.at_start.special_overflow {
            self.warnings.push(format!(
                "{}: the walk at start found more than {} sockets, FIFOs and device nodes, so new ones were not removed",
                crate::term::printable(&t.root.to_string_lossy()),
                scan::MAX_SPECIAL
            ));
            return;
        }
        for p in self.now.special.difference(&t.at_start.special) {
            if !self.unknown(p) {
                self.warnings.push(remove_special(fd, &t.root, p));
            }
        }
    }

    /// Guarded names that were not there at start.
    fn new_names(&mut self) {
        for n in self.now.names.difference(&self.t.at_start.names) {
            if !self.unknown(n) {
                self.new
                    .insert((n.components().count(), n.clone(), "guarded name"));
            }
        }
    }
}

/// Takes what is new into the quarantine, shallowest first, skipping what
/// is below something already taken.
fn take_new(
    q: &mut Quarantine,
    fd: &std::os::fd::OwnedFd,
    root: &Path,
    new: New,
    out: &mut Vec<Taken>,
) {
    let mut done: Vec<PathBuf> = Vec::new();
    for (_, rel, why) in new {
        if done.iter().any(|d| rel.starts_with(d)) {
            continue;
        }
        let why = if why == "guarded name" {
            rel.display().to_string()
        } else {
            why.to_string()
        };
        if let Some(taken) = q.take(fd, root, &rel, &why) {
            done.push(rel);
            out.push(taken);
        }
    }
}

/// What to take for directories newly shaped as bare repositories: each
/// may be one of the human's with the shape added beside their files, so
/// only its `HEAD` (without which git discovers nothing there), and what
/// the walk finds inside it (the walk stops at a repository's shape) that
/// was not there at start: nested `.git`s whole, nested shapes the same
/// way, guarded names. Never a whole directory, never anything the human
/// had: where the inside cannot be read whole (too deep, too big, a
/// directory it cannot open), a warning says so.
struct Shape<'a> {
    root: &'a Path,
    names: &'a [PathBuf],
    at_start: &'a scan::Found,
    take: Vec<(PathBuf, &'static str)>,
    warnings: &'a mut Vec<String>,
}

impl Shape<'_> {
    fn visit(&mut self, r: &Path, depth: usize) {
        self.take.push((
            r.join("HEAD"),
            "new repository's HEAD (a directory shaped as a bare repository)",
        ));
        let shown = crate::term::printable(&self.root.join(r).to_string_lossy());
        if depth >= 8 {
            self.warnings.push(format!("{shown}: shaped as a repository 8 levels deep in other shapes; only its HEAD was taken, and what is below it was not checked"));
            return;
        }
        // The human's locked directories below stay locked.
        let keep: BTreeSet<PathBuf> = self
            .at_start
            .unreadable
            .iter()
            .filter_map(|u| u.strip_prefix(r).ok().map(Path::to_path_buf))
            .collect();
        let found = match scan::walk_unlocking(&self.root.join(r), self.names, true, &keep) {
            Ok(f) => f,
            Err(e) => {
                self.warnings.push(format!("{shown}: shaped as a repository; its HEAD was taken, but its inside could not be read ({e}): check it yourself"));
                return;
            }
        };
        if !found.complete || !found.unreadable.is_empty() {
            self.warnings.push(format!("{shown}: shaped as a repository; its HEAD was taken, but its inside could not be read whole: repositories and guarded names below it were not all checked"));
        }
        let had = |p: &PathBuf| self.at_start.repos.contains(p) || self.at_start.names.contains(p);
        for x in &found.repos {
            let p = r.join(x);
            if had(&p) {
                continue;
            }
            if x.file_name().is_some_and(|n| n == ".git") {
                self.take.push((p, "new repository"));
            } else {
                self.visit(&p, depth + 1);
            }
        }
        for n in &found.names {
            let p = r.join(n);
            if !had(&p) {
                self.take.push((p, "guarded name"));
            }
        }
    }
}

/// Removes the socket, FIFO or device node at `rel` (checked again through
/// its parent, never following a link); what happened, for the human.
fn remove_special(fd: &impl std::os::fd::AsFd, root: &Path, rel: &Path) -> String {
    use nix::fcntl::AtFlags;
    let shown = crate::term::printable(&root.join(rel).to_string_lossy());
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return format!("{shown}: a special file the agent left; remove it yourself");
    };
    let done = crate::sandbox::beneath::beneath(fd, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)
        .and_then(|dir| {
            let st = nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
            if !scan::is_special(st.st_mode) {
                return Err(nix::Error::EEXIST);
            }
            nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
        });
    match done {
        Ok(()) => format!("{shown}: a socket, FIFO or device node the agent left in the tree; removed"),
        Err(nix::Error::EEXIST) => format!("{shown}: was a special file the agent made, is now something else; left as it is"),
        Err(e) => format!("{shown}: a socket, FIFO or device node the agent left could not be removed ({e}); remove it yourself"),
    }
}

/// Puts a tree root's permission bits back to `start` (through the
/// descriptor opened without following links); what it did, for the human.
fn restore_mode(fd: &impl std::os::fd::AsFd, root: &Path, start: Option<u32>) -> Option<String> {
    let start = start?;
    let now = nix::sys::stat::fstat(fd).ok()?.st_mode & 0o7777;
    if now == start {
        return None;
    }
    let root = crate::term::printable(&root.to_string_lossy());
    let m = nix::sys::stat::Mode::from_bits_truncate(start);
    Some(match nix::sys::stat::fchmod(fd, m) {
        Ok(()) => format!("{root}: its mode was changed to {now:o} during the instance; {start:o} restored"),
        Err(e) => format!("{root}: its mode was changed to {now:o} during the instance and could not be restored to {start:o} ({e}); restore it yourself"),
    })
}

/// Sweeps the trees of every manifest that no live instance holds.
pub(crate) fn sweep_stale(state: &Path) -> Vec<Taken> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(state.join("guard")) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(&p) else {
            continue;
        };
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue; // a live instance holds it
        };
        let m: Option<Manifest> =
            serde_json::from_reader(std::io::Read::take(&*lock, 16 << 20)).ok();
        if let Some(m) = m {
            for p in changed_since(&m) {
                tracing::warn!(earlier = %m.id, "workspace guard: {p} changed while instance {} ran and it ended uncleanly; check it before a host program reads it", m.id);
            }
            if let Ok(mut q) = Quarantine::open(state, &m.id) {
                let (taken, warnings) = sweep(&m.guard, &mut q);
                for w in warnings {
                    tracing::warn!(earlier = %m.id, "workspace guard: {w}");
                }
                out.extend(taken);
                let _ = std::fs::remove_dir(&q.dir);
            }
        }
        let _ = std::fs::remove_file(&p);
    }
    out
}

/// Lines for a human: what was taken and where it is kept.
pub(crate) fn summary(taken: &[Taken]) -> Vec<String> {
    taken
        .iter()
        .map(|t| {
            format!(
                "{} ({}): {}",
                crate::term::printable(&t.path.to_string_lossy()),
                crate::term::printable(&t.why),
                match (&t.kept, t.how) {
                    (Some(k), _) if t.restored => format!(
                        "moved to {}; the original restored",
                        crate::term::printable(&k.to_string_lossy())
                    ),
                    (Some(k), How::CopiedInPart) => format!(
                        "copied IN PART to {} (the quarantine's budget was spent, or entries could not be read); what did not fit is gone",
                        crate::term::printable(&k.to_string_lossy())
                    ),
                    (Some(k), _) =>
                        format!("moved to {}", crate::term::printable(&k.to_string_lossy())),
                    (None, _) if t.restored => "the original restored".into(),
                    (None, How::Failed) =>
                        "COULD NOT BE REMOVED: remove it yourself before a host program reads it"
                            .into(),
                    (None, _) => "removed, not kept (the quarantine's budget is spent)".into(),
                }
            )
        })
        .collect()
}
