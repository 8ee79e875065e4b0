//! The change feed: inotify on every directory of the layer's writes
//! (overlayfs's writes notify the upper directory's inodes), so a
//! checkpoint lists again only the directories something happened in. A
//! call that changed nothing costs no listing; one that changed k entries
//! costs about the directories they are in. When the feed cannot say
//! (its queue overflowed, a watch could not be added, no inotify at all),
//! the next checkpoint lists the whole layer, as without a feed.
//!
//! What the feed cannot see, the listing would not either: a write through
//! a shared mapping to a page already dirty moves no ctime and sends no
//! event; it is seen once the page is written back and written again.

use super::walk::{self, Listing};
use super::HistoryError;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The paths that may have changed, each with how it was listed before
/// (None: it was not).
pub(crate) type Touched = BTreeMap<PathBuf, Option<walk::Seen>>;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// What the feed watches for in each directory.
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// The feed of one layer's writes.
pub(crate) struct Feed {
    ino: Inotify,
    /// Each watch's directory, relative to the root.
    dirs: HashMap<WatchDescriptor, PathBuf>,
    /// The entries something happened to since the last checkpoint (an
    /// event names the entry in its directory).
    dirty: BTreeSet<PathBuf>,
    /// The feed cannot say: the next checkpoint lists everything.
    blind: bool,
    /// The files listed with more than one name.
    linked: BTreeSet<PathBuf>,
    /// Checkpoints since the last whole listing.
    full: u32,
    /// Directories whose watch ended since the last checkpoint (removed):
    /// a directory at that path now is another one, even when the file
    /// system gave it the same inode number (ext4 does at once).
    lost: BTreeSet<PathBuf>,
}

/// Every this many checkpoints the layer is listed whole (stat only: what
/// no event named — a write through a shared mapping, asynchronous I/O on
/// the overlay — is found by its ctime within this many calls).
const WHOLE_EVERY: u32 = 32;

/// Events one checkpoint reads at most; past it the feed cannot say.
const EVENTS_MAX: usize = 1 << 17;

impl Feed {
    /// A feed watching `root` and every directory `listing` holds; None
    /// without inotify.
    pub(crate) fn new() -> Option<Feed> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        Some(Feed {
            ino,
            dirs: HashMap::new(),
            dirty: BTreeSet::new(),
            blind: false,
            linked: BTreeSet::new(),
            full: 0,
            lost: BTreeSet::new(),
        })
    }

    /// A whole listing, each directory watched before it is read: the feed
    /// sees again from here.
    pub(crate) fn list_all(&mut self, root: &OwnedFd) -> Result<Listing, HistoryError> {
        self.blind = false;
        self.dirty.clear();
        self.lost.clear();
        self.full = 0;
        // Events during the listing stay queued: the next checkpoint looks
        // at those entries again.
        let listing = walk::list_watching(root, Path::new(""), &mut |d| self.watch(root, d))?;
        self.linked = listing
            .iter()
            .filter(|(_, s)| s.linked)
            .map(|(p, _)| p.clone())
            .collect();
        Ok(listing)
    }

    fn watch(&mut self, root: &OwnedFd, rel: &Path) {
        let Ok(fd) = walk::open_dir(root, rel) else {
            // Gone meanwhile: its parent's event says so.
            return;
        };
        // The directory opened beneath the root, never a path that a link
        // could redirect.
        let at = format!("/proc/self/fd/{}", fd.as_raw_fd());
        match self.ino.add_watch(at.as_str(), mask()) {
            Ok(wd) => {
                self.dirs.insert(wd, rel.to_path_buf());
            }
            Err(e) => {
                tracing::debug!("the history's feed: a watch on {}: {e}", rel.display());
                self.blind = true;
            }
        }
    }

    /// The next checkpoint lists everything (one failed half-way).
    pub(crate) fn blind_now(&mut self) {
        self.blind = true;
    }

    /// Reads what happened; marks the directories it happened in.
    fn drain(&mut self) {
        let mut read = 0usize;
        loop {
            if read > EVENTS_MAX {
                self.blind = true;
                self.dirty.clear();
                return;
            }
            let events = match self.ino.read_events() {
                Ok(e) if !e.is_empty() => e,
                _ => return,
            };
            read += events.len();
            for e in events {
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.blind = true;
                    continue;
                }
                if e.mask.contains(AddWatchFlags::IN_IGNORED) {
                    if let Some(d) = self.dirs.remove(&e.wd) {
                        self.dirty.insert(d.clone());
                        self.lost.insert(d);
                    }
                    continue;
                }
                if let Some(d) = self.dirs.get(&e.wd) {
                    match &e.name {
                        Some(n) => self.dirty.insert(d.join(n)),
                        // The directory itself (its modes, its removal).
                        None if !d.as_os_str().is_empty() => self.dirty.insert(d.clone()),
                        None => false,
                    };
                }
            }
        }
    }

    /// Brings `listing` up to date with what happened since the last
    /// checkpoint and returns the paths that may have changed; None: the
    /// feed cannot say, list everything (then [`Feed::arm`]).
    pub(crate) fn patch(
        &mut self,
        root: &OwnedFd,
        listing: &mut Listing,
    ) -> Result<Option<Touched>, HistoryError> {
        self.drain();
        self.full += 1;
        if self.blind || self.full >= WHOLE_EVERY {
            return Ok(None);
        }
        let mut touched = Touched::new();
        // Parents sort first: a new directory is listed whole before
        // anything below it is looked at again.
        for p in std::mem::take(&mut self.dirty) {
            self.restat(root, &p, listing, &mut touched)?;
        }
        self.lost.clear();
        if listing.len() > walk::MAX_ENTRIES {
            return Err(HistoryError::TooLarge(walk::MAX_ENTRIES));
        }
        // A file with more than one name changes by any of them: each name
        // of a linked file, and every other name of a touched one's inode,
        // is looked at again (they are few; no event names them).
        let inodes: BTreeSet<u64> = touched
            .keys()
            .filter_map(|p| listing.get(p))
            .filter(|s| s.linked)
            .map(|s| s.stamp.0)
            .collect();
        let mut linked: BTreeSet<PathBuf> = self.linked.clone();
        if !inodes.is_empty() {
            // Names listed before the file got its second one.
            linked.extend(
                listing
                    .iter()
                    .filter(|(_, s)| inodes.contains(&s.stamp.0) && !walk::is_dir(s))
                    .map(|(p, _)| p.clone()),
            );
        }
        linked.retain(|p| !touched.contains_key(p));
        for p in linked {
            let was = match walk::stat_at(root, &p) {
                Some(now) => listing.insert(p.clone(), now),
                None => listing.remove(&p),
            };
            touched.insert(p, was);
        }
        for (p, _) in touched.iter() {
            match listing.get(p) {
                Some(s) if s.linked => self.linked.insert(p.clone()),
                _ => self.linked.remove(p),
            };
        }
        if self.blind {
            // A watch failed half-way: the listing was partly brought up to
            // date, so it is no measure for the whole listing that follows
            // (every entry is read again).
            listing.clear();
            return Ok(None);
        }
        Ok(Some(touched))
    }

    /// Looks at the entry `p` again: gone, its subtree goes; a new or
    /// replaced directory is watched, then listed whole.
    fn restat(
        &mut self,
        root: &OwnedFd,
        p: &Path,
        listing: &mut Listing,
        touched: &mut Touched,
    ) -> Result<(), HistoryError> {
        let now = walk::stat_at(root, p);
        let was = listing.get(p).cloned();
        let was_dir = was.as_ref().is_some_and(walk::is_dir);
        // A directory where there was none, or another one. Not by the
        // inode alone: a link's freed inode number is soon a new
        // directory's (a running rewind replacing a planted link with a
        // directory lost what it wrote below it).
        let lost = self.lost.contains(p);
        let new_dir = now.as_ref().is_some_and(|s| {
            walk::is_dir(s)
                && (!was_dir || lost || was.as_ref().map(|w| w.stamp.0) != Some(s.stamp.0))
        });
        if now.is_none() || new_dir || (was_dir && !now.as_ref().is_some_and(walk::is_dir)) {
            for old in walk::subtree(listing, p).into_iter().filter(|o| o != p) {
                let w = listing.remove(&old);
                touched.entry(old).or_insert(w);
            }
        }
        touched.entry(p.to_path_buf()).or_insert(was);
        let Some(s) = now else {
            listing.remove(p);
            return Ok(());
        };
        listing.insert(p.to_path_buf(), s);
        if new_dir {
            // Each directory watched before it is read: nothing made
            // meanwhile is missed.
            let below = walk::list_watching(root, p, &mut |d| self.watch(root, d))?;
            for (q, qs) in below {
                let w = listing.insert(q.clone(), qs);
                touched.entry(q).or_insert(w);
            }
        }
        Ok(())
    }
}
