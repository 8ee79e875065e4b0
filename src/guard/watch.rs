//! Watch and revert (W2, W3): guarded names and `.git` that did not exist at
//! start are watched with inotify (on the top of each tree and on the
//! directories leading to a deeper guarded path) and moved into the
//! quarantine the moment they appear. When the instance ends, the end sweep
//! ([`super::sweep`]) finds what appeared deeper down: new repositories and
//! guarded names at any depth.
//!
//! A manifest (`<state>/guard/<id>.json`, flock-held while the instance
//! lives) records the guard as planned; a start that finds one no live
//! instance holds sweeps its trees before anything else (unclean end).

use super::quarantine::{state_dir, How, Quarantine, Taken};
use super::sweep::{digests, summary, sweep, sweep_stale, Manifest};
use super::{Guard, GuardError};
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running watch; [`Watch::finish`] ends it with the end sweep.
pub(crate) struct Watch {
    taken: Arc<Mutex<Vec<Taken>>>,
    quarantine: Arc<Mutex<Quarantine>>,
    guard: Guard,
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<Armed>>,
    manifest: Option<(PathBuf, Flock<std::fs::File>)>,
    /// What a sweep after an earlier unclean end took, for the caller to say.
    pub swept_stale: Vec<Taken>,
    /// What the end sweep could not check (said when the instance ends).
    pub warnings: Vec<String>,
    /// Commit mode: the line that tells the human how to fetch.
    pub commit_note: Option<String>,
    restore_mode: Arc<std::sync::atomic::AtomicU8>,
    unlisted: Arc<AtomicUsize>,
    /// How the watching thread confined itself, when it was asked to.
    pub confined: Option<Result<String, super::ThreadConfineError>>,
    /// The guard's state directory (quarantine, manifests).
    pub state: PathBuf,
}

impl Watch {
    /// Sweeps stale manifests, writes this instance's, and starts watching.
    /// With `confine`, the watching thread first restricts itself to its
    /// trees and state (`confine`), under that profile's ABI.
    pub(crate) fn start(
        guard: &Guard,
        snapshots: Vec<super::restore::Snapshot>,
        id: &str,
        confine: Option<&crate::profile::Policy>,
    ) -> Result<Watch, GuardError> {
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source: std::io::Error| GuardError::Io { what, path, source }
        };
        let roots: Vec<PathBuf> = guard.trees.iter().map(|t| t.root.clone()).collect();
        let state = state_dir(&roots)?;
        let swept_stale = sweep_stale(&state);
        let q = Quarantine::open(&state, id)?;
        let gdir = state.join("guard");
        std::fs::create_dir_all(&gdir).map_err(io("creating", &gdir))?;
        let mpath = gdir.join(format!("{id}.json"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&mpath)
            .map_err(io("creating", &mpath))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| io("locking", &mpath)(e.into()))?;
        let m = Manifest {
            id: id.into(),
            pid: std::process::id(),
            guard: guard.clone(),
            digests: digests(guard),
        };
        // One write, not one per JSON token.
        let bytes = serde_json::to_vec(&m).map_err(|e| io("writing", &mpath)(e.into()))?;
        std::io::Write::write_all(&mut &*lock, &bytes).map_err(io("writing", &mpath))?;
        let taken = Arc::new(Mutex::new(Vec::new()));
        let quarantine = Arc::new(Mutex::new(q));
        let unlisted = Arc::new(AtomicUsize::new(0));
        // Nothing to watch (copy-on-write: the workspace is no tree of the
        // guard's): no thread and no inotify instance, whose closing waits
        // for the kernel's grace period. The end sweep and the manifest stay.
        let watching = !snapshots.is_empty() || guard.trees.iter().any(|t| !t.watched.is_empty());
        let (thread, stop, restore_mode, confined) = if watching {
            let mut armed = Armed::new(
                guard,
                snapshots,
                quarantine.clone(),
                taken.clone(),
                unlisted.clone(),
            )?;
            // The first pass runs here, before the sandbox starts: nothing
            // the agent does can come before the watches.
            armed.arm_all();
            let restore_mode = armed.restore_mode.clone();
            use crate::confine::{prepare, Needs};
            let rules = confine.map(|p| prepare(p, &Needs::guard(&roots, &state)));
            let (thread, stop, confined) = spawn(armed, rules)?;
            (Some(thread), Some(stop), restore_mode, confined)
        } else {
            let off = Arc::new(std::sync::atomic::AtomicU8::new(RESTORE_OFF));
            (None, None, off, None)
        };
        Ok(Watch {
            taken,
            quarantine,
            guard: guard.clone(),
            stop,
            thread,
            manifest: Some((mpath, lock)),
            swept_stale,
            warnings: Vec::new(),
            commit_note: None,
            restore_mode,
            unlisted,
            confined,
            state,
        })
    }

    /// Tells the watch how the sandbox started: with the mount layer in
    /// force, guarded files are read-only and snapshot-and-restore stays off;
    /// without it, it starts restoring (and checks everything once).
    pub(crate) fn mount_in_force(&self, yes: bool) {
        let v = if yes { RESTORE_OFF } else { RESTORE_ON };
        self.restore_mode
            .store(v, std::sync::atomic::Ordering::SeqCst);
    }

    /// What the watch took so far (shared with the audit ticker).
    pub(crate) fn taken(&self) -> Arc<Mutex<Vec<Taken>>> {
        self.taken.clone()
    }

    /// The quarantine directory of this instance.
    pub(crate) fn quarantine_dir(&self) -> PathBuf {
        lock(&self.quarantine).dir.clone()
    }

    /// Stops watching, sweeps the trees (call it once the sandbox is gone),
    /// removes the manifest, and returns everything taken during the instance.
    pub(crate) fn finish(mut self) -> (Vec<Taken>, Vec<String>) {
        let taken = self.end();
        (taken, std::mem::take(&mut self.warnings))
    }

    fn end(&mut self) -> Vec<Taken> {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            if let Ok(mut armed) = t.join() {
                armed.restore(None); // the last word: what changed since
            }
        }
        let (swept, warnings) = sweep(&self.guard, &mut lock(&self.quarantine));
        self.warnings = warnings;
        push_bounded(&self.taken, &self.unlisted, swept);
        let n = self.unlisted.load(Ordering::SeqCst);
        if n > 0 {
            self.warnings.push(format!(
                "{n} more planted entries were taken out and are not listed (the list keeps {MAX_LISTED}; the quarantine has what was kept)"
            ));
        }
        let all = lock(&self.taken);
        if let Some((p, l)) = self.manifest.take() {
            let _ = std::fs::remove_file(&p);
            drop(l);
        }
        let dir = lock(&self.quarantine).dir.clone();
        let _ = std::fs::remove_dir(&dir); // only when nothing was kept
        all.clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.manifest.is_some() {
            self.end();
        }
    }
}

/// The watching thread, confined by `rules` when given; returns it, the
/// pipe whose closing stops it, and how it confined itself.
#[allow(clippy::type_complexity)]
fn spawn(
    mut armed: Armed,
    rules: Option<Result<crate::confine::Prepared, crate::confine::ConfineError>>,
) -> Result<
    (
        std::thread::JoinHandle<Armed>,
        OwnedFd,
        Option<Result<String, super::ThreadConfineError>>,
    ),
    GuardError,
> {
    let (stop_r, stop_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| GuardError::Thread(e.into()))?;
    let (said, heard) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("sandmux-guard".into())
        .spawn(move || {
            let confined = rules.map(|r| {
                r.and_then(|p| p.restrict())
                    .map_err(|e| super::ThreadConfineError::Confine(Arc::new(e)))
            });
            let _ = said.send(confined);
            armed.run(stop_r);
            armed
        })
        .map_err(GuardError::Thread)?;
    let confined = heard
        .recv()
        .unwrap_or(Some(Err(super::ThreadConfineError::Ended)));
    Ok((thread, stop_w, confined))
}

/// Entries listed (in memory, on stderr, in the audit log) per instance;
/// past that, reverts still happen and are only counted, so an agent that
/// plants in a loop cannot grow the supervisor or the log (P9).
pub(crate) const MAX_LISTED: usize = 1000;

/// Appends `new` to `list` up to [`MAX_LISTED`], counting the rest.
fn push_bounded(
    list: &Mutex<Vec<Taken>>,
    unlisted: &AtomicUsize,
    new: impl IntoIterator<Item = Taken>,
) {
    let mut l = lock(list);
    for t in new {
        if l.len() < MAX_LISTED {
            l.push(t);
        } else {
            unlisted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The inotify side: one watch per directory on the way to a watched path.
struct Armed {
    ino: Inotify,
    trees: Vec<(PathBuf, OwnedFd, BTreeSet<PathBuf>)>,
    dirs: HashMap<WatchDescriptor, (usize, PathBuf)>,
    /// Snapshot and restore, where the mount layer may be missing; acts
    /// only once the sandbox reported the mount layer dropped.
    snapshots: Vec<super::restore::Snapshot>,
    restore_mode: Arc<std::sync::atomic::AtomicU8>,
    restore_dirs: HashMap<WatchDescriptor, (usize, PathBuf)>,
    quarantine: Arc<Mutex<Quarantine>>,
    taken: Arc<Mutex<Vec<Taken>>>,
    unlisted: Arc<AtomicUsize>,
    /// Paths whose revert failed: listed once, not at every recheck.
    failing: std::collections::HashSet<PathBuf>,
}

/// How often every watched path is checked again without an event
/// ([`Armed::recheck`]).
const RECHECK: Duration = Duration::from_secs(2);

const RESTORE_UNKNOWN: u8 = 0;
const RESTORE_ON: u8 = 1;
const RESTORE_OFF: u8 = 2;

const RESTORE_MASK: AddWatchFlags = AddWatchFlags::from_bits_retain(libc::IN_MASK_ADD)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_ONLYDIR);

// Every watch is added with IN_MASK_ADD: one directory can be watched for
// both purposes (the top of a tree is), and a second add must not replace the
// first one's mask.
const MASK: AddWatchFlags = AddWatchFlags::from_bits_retain(libc::IN_MASK_ADD)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

impl Armed {
    fn new(
        guard: &Guard,
        snapshots: Vec<super::restore::Snapshot>,
        quarantine: Arc<Mutex<Quarantine>>,
        taken: Arc<Mutex<Vec<Taken>>>,
        unlisted: Arc<AtomicUsize>,
    ) -> Result<Armed, GuardError> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(GuardError::Inotify)?;
        let mut trees = Vec::new();
        for t in &guard.trees {
            if t.watched.is_empty() {
                continue;
            }
            let fd = crate::sandbox::beneath::open_root(&t.root).map_err(|source| {
                GuardError::OpenTree {
                    root: t.root.clone(),
                    source,
                }
            })?;
            trees.push((t.root.clone(), fd, t.watched.iter().cloned().collect()));
        }
        Ok(Armed {
            ino,
            trees,
            dirs: HashMap::new(),
            snapshots,
            restore_mode: Arc::new(std::sync::atomic::AtomicU8::new(RESTORE_UNKNOWN)),
            restore_dirs: HashMap::new(),
            quarantine,
            taken,
            unlisted,
            failing: Default::default(),
        })
    }

    /// Lists what was taken; a revert that failed again at the same path
    /// (the recheck retries it) is not listed again until it succeeds.
    fn report(&mut self, new: impl IntoIterator<Item = Taken>) {
        let failing = &mut self.failing;
        let fresh: Vec<Taken> = new
            .into_iter()
            .filter(|t| match t.how {
                // A failure whose original was restored is listed each time,
                // as before it had a type of its own.
                How::Failed if !t.restored => failing.insert(t.path.clone()),
                _ => {
                    failing.remove(&t.path);
                    true
                }
            })
            .collect();
        push_bounded(&self.taken, &self.unlisted, fresh);
    }

    fn arm_all(&mut self) {
        for i in 0..self.trees.len() {
            self.arm(i, PathBuf::new());
        }
        for (i, s) in self.snapshots.iter().enumerate() {
            for d in s.dirs() {
                let Ok(fd) = crate::sandbox::beneath::beneath(
                    &s.fd(),
                    &d,
                    OFlag::O_PATH | OFlag::O_DIRECTORY,
                ) else {
                    continue;
                };
                let proc = PathBuf::from(format!(
                    "/proc/self/fd/{}",
                    std::os::fd::AsRawFd::as_raw_fd(&fd)
                ));
                if let Ok(wd) = self.ino.add_watch(&proc, RESTORE_MASK) {
                    self.restore_dirs.insert(wd, (i, d));
                }
            }
        }
        self.restore(None);
    }

    /// Restores what changed in the snapshots (one directory, or all),
    /// once the mount layer is known to be missing.
    fn restore(&mut self, which: Option<&(usize, PathBuf)>) {
        use std::sync::atomic::Ordering;
        match self.restore_mode.load(Ordering::SeqCst) {
            RESTORE_ON => {}
            RESTORE_OFF => {
                self.snapshots.clear();
                return;
            }
            _ => return,
        }
        let mut out = Vec::new();
        {
            let mut q = lock(&self.quarantine);
            for (i, s) in self.snapshots.iter().enumerate() {
                match which {
                    Some((j, d)) if *j == i => out.extend(s.check(Some(d), &mut q)),
                    Some(_) => {}
                    None => out.extend(s.check(None, &mut q)),
                }
            }
        }
        self.report(out);
    }

    /// Watches `dir` (relative to tree `i`) and handles what is already in it.
    fn arm(&mut self, i: usize, dir: PathBuf) {
        let depth = dir.components().count();
        let next: BTreeSet<PathBuf> = self.trees[i]
            .2
            .iter()
            .filter(|t| t.starts_with(&dir) && t.components().count() > depth)
            .filter_map(|t| t.components().nth(depth).map(|c| dir.join(c)))
            .collect();
        if next.is_empty() {
            return;
        }
        let Ok(fd) = crate::sandbox::beneath::beneath(
            &self.trees[i].1,
            &dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY,
        ) else {
            return;
        };
        let proc = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ));
        if let Ok(wd) = self.ino.add_watch(&proc, MASK) {
            self.dirs.insert(wd, (i, dir));
        }
        for child in next {
            self.check(i, child);
        }
    }

    /// `rel` appeared (or may have): take it if it is watched, follow it if
    /// it leads to a watched path.
    fn check(&mut self, i: usize, rel: PathBuf) {
        if self.trees[i].2.contains(&rel) {
            let (root, fd, _) = &self.trees[i];
            let why = rel.display().to_string();
            let t = lock(&self.quarantine).take(fd, root, &rel, &why);
            self.report(t);
        } else if self.trees[i].2.iter().any(|t| t.starts_with(&rel)) {
            // A link on the way to a guarded path redirects it: take the link.
            let (root, fd, _) = &self.trees[i];
            let is_link = super::quarantine::redirect_or_self(fd, &rel).is_some()
                && crate::sandbox::beneath::beneath(fd, &rel, OFlag::O_PATH | OFlag::O_NOFOLLOW)
                    .and_then(|f| nix::sys::stat::fstat(&f))
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
            if is_link {
                let why = format!("a link on the way to a guarded name ({})", rel.display());
                let t = lock(&self.quarantine).take(fd, root, &rel, &why);
                self.report(t);
            } else {
                self.arm(i, rel);
            }
        }
    }

    /// Every watched path checked again, and every snapshot compared,
    /// whatever the events said: a revert that failed (a directory the
    /// agent made unwritable, then writable again, with no event the watch
    /// asks for) or a watch that could not be added (the user's inotify
    /// limit) is retried here.
    fn recheck(&mut self) {
        for i in 0..self.trees.len() {
            self.arm(i, PathBuf::new());
        }
        self.restore(None);
    }

    fn run(&mut self, stop: OwnedFd) {
        // On a deadline, not on quiet: a stream of events cannot put it off.
        let mut recheck_at = Instant::now() + RECHECK;
        loop {
            if Instant::now() >= recheck_at {
                self.recheck();
                recheck_at = Instant::now() + RECHECK;
            }
            let mut fds = [
                PollFd::new(self.ino.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            ];
            let mode = self.restore_mode.load(std::sync::atomic::Ordering::SeqCst);
            let waiting = !self.snapshots.is_empty() && mode == RESTORE_UNKNOWN;
            // Rounded up: poll counts whole milliseconds.
            let until =
                recheck_at.saturating_duration_since(Instant::now()) + Duration::from_micros(999);
            let ms = if waiting {
                until.min(Duration::from_millis(50))
            } else {
                until
            };
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, timeout) {
                Ok(0) => {
                    // Woken to see whether the sandbox has said how it started.
                    let now = self.restore_mode.load(std::sync::atomic::Ordering::SeqCst);
                    if now != RESTORE_UNKNOWN {
                        self.restore(None);
                    }
                    continue;
                }
                Ok(_) => {}
                Err(nix::Error::EINTR) => continue,
                Err(_) => return,
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                return;
            }
            let events = match self.ino.read_events() {
                Ok(e) => e,
                Err(nix::Error::EAGAIN) => continue,
                Err(_) => return,
            };
            for e in events {
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.dirs.clear();
                    self.arm_all();
                    continue;
                }
                if e.mask.intersects(
                    AddWatchFlags::IN_MOVE_SELF
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_IGNORED,
                ) {
                    if let Some((i, dir)) = self.dirs.remove(&e.wd) {
                        let _ = self.ino.rm_watch(e.wd);
                        if dir.as_os_str().is_empty() {
                            continue;
                        }
                        // It moved away: whatever now stands at its path is checked afresh.
                        self.check(i, dir);
                    }
                    continue;
                }
                if let Some(w) = self.restore_dirs.get(&e.wd).cloned() {
                    self.restore(Some(&w));
                    if !self.dirs.contains_key(&e.wd) {
                        continue;
                    }
                }
                let (Some((i, dir)), Some(name)) = (self.dirs.get(&e.wd).cloned(), e.name) else {
                    continue;
                };
                self.check(i, dir.join(name));
            }
        }
    }
}

pub(crate) fn say_stale(swept: &[Taken]) {
    if !swept.is_empty() {
        tracing::warn!(
            "an earlier instance ended uncleanly; the workspace guard took what its agent planted:\n{}",
            summary(swept).join("\n")
        );
    }
}

/// Whether instance `id`'s manifest is held by a live instance.
pub(crate) fn is_live(state: &Path, id: &str) -> bool {
    let p = state.join("guard").join(format!("{id}.json"));
    match std::fs::OpenOptions::new().read(true).open(&p) {
        Ok(f) => Flock::lock(f, FlockArg::LockSharedNonblock).is_err(),
        Err(_) => false,
    }
}

/// Ends a watch and says on stderr what it took during the instance.
pub(crate) fn finish_and_say(w: Watch) -> Vec<Taken> {
    let note = w.commit_note.clone();
    let (mut taken, warnings) = w.finish();
    if let Some(n) = note {
        tracing::info!("{n}");
    }
    for w in &warnings {
        tracing::warn!("workspace guard: {w}");
    }
    if !taken.is_empty() {
        tracing::warn!(
            "the workspace guard took {} planted entr{} out of the workspace (host programs would have obeyed them):\n{}",
            taken.len(),
            if taken.len() == 1 { "y" } else { "ies" },
            summary(&taken).join("\n")
        );
    }
    // Warnings travel with the reverts (to the audit log in `serve`).
    taken.extend(warnings.into_iter().map(|w| Taken::notice(How::Warning, w)));
    taken
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
