//! The checkpoint store of one layer (`LAYER/history/`): taking a
//! checkpoint, the state at any kept checkpoint, the bound.

pub(crate) use super::files::{objects_bytes, write_new};
use super::walk::{self, Listing, Node};
use super::{hex_of, Cause, Delta, HistoryError, Line, State, PATHS_LOGGED};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The history of one layer, open for checkpoints.
pub(crate) struct History {
    /// `LAYER/history`.
    dir: PathBuf,
    /// Where the agent's writes are (`upper/`, or a copy's copy).
    writes: PathBuf,
    /// The bound of the store's objects, in bytes.
    bound: u64,
    /// The last checkpoint's number and digest.
    last: (u64, String),
    /// The state at the last checkpoint, and how each entry was listed.
    state: State,
    seen: Listing,
    /// When that listing began (ns since the epoch): an entry changed
    /// within [`RACY_NS`] of it may change again with the same ctime.
    listed_at: i128,
    /// Bytes the objects take.
    used: u64,
    /// The change feed (None: every checkpoint lists the whole layer).
    feed: Option<super::feed::Feed>,
}

/// An entry whose ctime is this close to the listing before (or after it)
/// is read again at the next checkpoint (git's "racily clean"): a second
/// write in the same clock tick leaves the ctime as it was.
const RACY_NS: i128 = 20_000_000;

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

fn io<'a>(what: &'static str, p: &'a Path) -> impl FnOnce(std::io::Error) -> HistoryError + 'a {
    move |e| HistoryError::io(what, p, e)
}

impl History {
    /// The history directory of the layer at `layer`.
    pub(crate) fn dir_of(layer: &Path) -> PathBuf {
        layer.join("history")
    }

    /// Opens (or starts, with checkpoint 0: the layer as it is now) the
    /// history of the layer at `layer`, whose writes are at `writes`.
    pub(crate) fn open(layer: &Path, writes: &Path, bound: u64) -> Result<History, HistoryError> {
        let dir = Self::dir_of(layer);
        for d in [dir.clone(), dir.join("objects"), dir.join("deltas")] {
            match std::fs::DirBuilder::new().mode(0o700).create(&d) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(HistoryError::io("making", &d, e))
                }
                _ => {}
            }
        }
        let mut h = History {
            dir,
            writes: writes.to_path_buf(),
            bound,
            last: (0, String::new()),
            state: State::new(),
            seen: Listing::new(),
            listed_at: 0,
            used: 0,
            feed: None,
        };
        h.used = objects_bytes(&h.dir.join("objects"));
        match h.lines()?.last() {
            Some(l) => {
                h.last = (l.n, l.digest.clone());
                h.state = h.state_at(l.n)?;
            }
            None => {
                let start = Cause {
                    tool: "(start)".into(),
                    request_id: String::new(),
                    args: serde_json::Value::Null,
                };
                h.take_numbered(0, &start)?;
            }
        }
        Ok(h)
    }

    /// Takes the next checkpoint, after `cause`.
    pub(crate) fn take(&mut self, cause: &Cause) -> Result<Line, HistoryError> {
        self.take_numbered(self.last.0 + 1, cause)
    }

    /// Takes the next checkpoint from a whole listing of the layer (every
    /// entry's stamps compared with the last), not from the change feed's
    /// events: a write through a shared memory mapping makes none. A
    /// rewind's checkpoints before and after are taken so.
    pub(crate) fn take_whole(&mut self, cause: &Cause) -> Result<Line, HistoryError> {
        if let Some(f) = self.feed.as_mut() {
            f.blind_now();
        }
        self.take(cause)
    }

    fn take_numbered(&mut self, n: u64, cause: &Cause) -> Result<Line, HistoryError> {
        let root = crate::sandbox::beneath::open_root(&self.writes)
            .map_err(|e| HistoryError::io("opening", &self.writes, e.into()))?;
        let listed_at = now_ns();
        let mut stored = 0u64;
        let (listing, delta, folded) = match self.patched(&root)? {
            Some((listing, touched)) => {
                let r = self.compare_touched(&root, &listing, &touched, &mut stored);
                let (delta, folded) = r.inspect_err(|_| self.forget_all())?;
                (listing, delta, folded)
            }
            None => {
                if self.feed.is_none() {
                    self.feed = super::feed::Feed::new();
                }
                let listing = match self.feed.as_mut() {
                    Some(f) => f.list_all(&root)?,
                    None => walk::list(&root)?,
                };
                let (delta, state, folded) = self.compare(&root, &listing, &mut stored)?;
                self.state = state;
                (listing, delta, folded)
            }
        };
        let digest = chain(&self.last.1, &delta);
        let text = serde_json::to_vec(&delta).unwrap_or_default();
        write_new(&self.dir.join("deltas").join(format!("{n}.json")), &text)?;
        let folded_upto = self.make_room(n)?.or(folded);
        let line = Line {
            n,
            ts: crate::log::now_rfc3339(),
            tool: cause.tool.clone(),
            request_id: cause.request_id.clone(),
            args: cause.args.clone(),
            digest: digest.clone(),
            changed: delta.changed.len(),
            removed: delta.removed.len(),
            paths: delta
                .changed
                .keys()
                .chain(delta.removed.iter())
                .take(PATHS_LOGGED)
                .cloned()
                .collect(),
            stored,
            folded_upto,
        };
        self.append(&line)?;
        self.last = (n, digest);
        self.seen = listing;
        self.listed_at = listed_at;
        Ok(line)
    }

    /// What changed since the last checkpoint: entries listed as before
    /// keep their node; the others are read (their content stored).
    fn compare(
        &self,
        root: &OwnedFd,
        listing: &Listing,
        stored: &mut u64,
    ) -> Result<(Delta, State, Option<u64>), HistoryError> {
        let mut delta = Delta::default();
        let mut state = State::new();
        let mut keeper = Keeper::new(&self.dir, self.bound, self.last.0, self.used, stored);
        let mut store = |fd: OwnedFd, size: u64| keeper.keep(fd, size);
        for (path, s) in listing {
            let before = self.state.get(path);
            let racy = s.stamp.1 + RACY_NS >= self.listed_at;
            let same = self.seen.get(path) == Some(s) && !racy;
            let node = match (same, before) {
                (true, Some(n)) => Some(n.clone()),
                _ => walk::node(root, path, s, &mut store)?,
            };
            let Some(node) = node else { continue };
            if before != Some(&node) {
                delta.changed.insert(hex_of(path), node.clone());
            }
            state.insert(path.clone(), node);
        }
        delta.removed = self
            .state
            .keys()
            .filter(|p| !state.contains_key(*p))
            .map(|p| hex_of(p))
            .collect();

        Ok((delta, state, keeper.folded))
    }

    /// The listing as the feed brings it up to date, and what may have
    /// changed; None: list the whole layer.
    fn patched(
        &mut self,
        root: &OwnedFd,
    ) -> Result<Option<(Listing, super::feed::Touched)>, HistoryError> {
        let Some(f) = self.feed.as_mut() else {
            return Ok(None);
        };
        if self.seen.is_empty() && !self.state.is_empty() {
            return Ok(None);
        }
        let mut listing = std::mem::take(&mut self.seen);
        match f.patch(root, &mut listing) {
            Ok(Some(t)) => Ok(Some((listing, t))),
            // A whole listing next: it compares with what was listed (only
            // entries whose stamps moved are read again).
            Ok(None) => {
                self.seen = listing;
                Ok(None)
            }
            Err(e) => {
                self.seen.clear();
                Err(e)
            }
        }
    }

    /// A checkpoint that failed half-way: the next one starts from the
    /// last checkpoint's state, on disk, and lists everything.
    fn forget_all(&mut self) {
        self.seen.clear();
        self.state = self.state_at(self.last.0).unwrap_or_default();
        if let Some(f) = self.feed.as_mut() {
            f.blind_now();
        }
    }

    /// [`History::compare`] for the paths the feed says may have changed
    /// (each with how it was listed before); the state changes in place.
    fn compare_touched(
        &mut self,
        root: &OwnedFd,
        listing: &Listing,
        touched: &super::feed::Touched,
        stored: &mut u64,
    ) -> Result<(Delta, Option<u64>), HistoryError> {
        let mut delta = Delta::default();
        let dir = self.dir.clone();
        let mut keeper = Keeper::new(&dir, self.bound, self.last.0, self.used, stored);
        let mut store = |fd: OwnedFd, size: u64| keeper.keep(fd, size);
        for (path, was) in touched {
            let before = self.state.get(path).cloned();
            let node = match listing.get(path) {
                None => None,
                Some(s) => {
                    let racy = s.stamp.1 + RACY_NS >= self.listed_at;
                    match (was.as_ref() == Some(s) && !racy, &before) {
                        (true, Some(n)) => Some(n.clone()),
                        _ => walk::node(root, path, s, &mut store)?,
                    }
                }
            };
            match node {
                Some(n) if before.as_ref() != Some(&n) => {
                    delta.changed.insert(hex_of(path), n.clone());
                    self.state.insert(path.clone(), n);
                }
                Some(_) => {}
                None if before.is_some() => {
                    delta.removed.push(hex_of(path));
                    self.state.remove(path);
                }
                None => {}
            }
        }
        Ok((delta, keeper.folded))
    }

    /// Every line of the log.
    pub(crate) fn lines(&self) -> Result<Vec<Line>, HistoryError> {
        read_lines(&self.dir)
    }

    /// The state at checkpoint `n`.
    pub(crate) fn state_at(&self, n: u64) -> Result<State, HistoryError> {
        state_at(&self.dir, n)
    }

    fn append(&self, line: &Line) -> Result<(), HistoryError> {
        let p = self.dir.join("log.jsonl");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&p)
            .map_err(io("opening", &p))?;
        let mut text = serde_json::to_vec(line).unwrap_or_default();
        text.push(b'\n');
        f.write_all(&text).map_err(io("writing", &p))
    }

    /// Folds the oldest checkpoints into the base until the objects fit
    /// the bound (checkpoint `last`, just written, always stays); returns
    /// the last folded.
    fn make_room(&mut self, last: u64) -> Result<Option<u64>, HistoryError> {
        let objects = self.dir.join("objects");
        self.used = objects_bytes(&objects);
        if self.used <= self.bound {
            return Ok(None);
        }
        let folded = super::rewind::fold(&self.dir, last, self.bound, &Default::default());
        self.used = objects_bytes(&objects);
        folded
    }
}

/// What one checkpoint stores: objects within the bound, folding the
/// oldest checkpoints to make room first.
struct Keeper<'a> {
    dir: &'a Path,
    objects: PathBuf,
    bound: u64,
    last: u64,
    used: u64,
    stored: &'a mut u64,
    /// Objects this checkpoint stored (a fold keeps them).
    fresh: std::collections::HashSet<String>,
    /// The last checkpoint folded to make room, if any.
    folded: Option<u64>,
}

impl<'a> Keeper<'a> {
    fn new(dir: &'a Path, bound: u64, last: u64, used: u64, stored: &'a mut u64) -> Self {
        Keeper {
            dir,
            objects: dir.join("objects"),
            bound,
            last,
            used,
            stored,
            fresh: Default::default(),
            folded: None,
        }
    }

    /// Stores the content of `fd` (`size` bytes); None: no room for it.
    fn keep(&mut self, fd: OwnedFd, size: u64) -> Result<Option<String>, HistoryError> {
        let (dir, last, bound) = (self.dir, self.last, self.bound);
        make_room_for(
            dir,
            last,
            bound,
            size,
            &self.fresh,
            &mut self.used,
            &mut self.folded,
        )?;
        if self.used.saturating_add(size) > bound {
            return Ok(None);
        }
        let before = *self.stored;
        let name = store_object(&self.objects, fd, size, self.stored)?;
        self.used += *self.stored - before;
        self.fresh.insert(name.clone());
        Ok(Some(name))
    }
}

/// Apparent size: a sparse file stores densely. Past the bound the oldest
/// checkpoints fold first (never what this one stored, `fresh`); what
/// still does not fit is not kept (the caller sees `used + size` over).
fn make_room_for(
    dir: &Path,
    last: u64,
    bound: u64,
    size: u64,
    fresh: &std::collections::HashSet<String>,
    used: &mut u64,
    folded: &mut Option<u64>,
) -> Result<(), HistoryError> {
    if used.saturating_add(size) <= bound {
        return Ok(());
    }
    if let Some(k) = super::rewind::fold(dir, last, bound.saturating_sub(size), fresh)? {
        *folded = Some(k);
    }
    *used = objects_bytes(&dir.join("objects"));
    Ok(())
}

/// The state at checkpoint `n` of the history at `dir`.
pub(crate) fn state_at(dir: &Path, n: u64) -> Result<State, HistoryError> {
    let base = base_of(dir)?;
    if n < base.0 {
        return Err(HistoryError::Folded(n, base.0));
    }
    let mut state = base.1;
    for k in base.0 + 1..=n {
        delta_of(dir, k)?.apply(&mut state)?;
    }
    Ok(state)
}

/// The base: (the checkpoint it is the state at, the state).
pub(crate) fn base_of(dir: &Path) -> Result<(u64, State), HistoryError> {
    let p = dir.join("base.json");
    match std::fs::read(&p) {
        Ok(text) => {
            let (n, hexed): (u64, std::collections::BTreeMap<String, Node>) =
                serde_json::from_slice(&text)
                    .map_err(|e| HistoryError::Corrupt("base".into(), e.to_string()))?;
            let mut state = State::new();
            for (h, node) in hexed {
                state.insert(super::path_of(&h)?, node);
            }
            Ok((n, state))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // No fold yet: checkpoint 0's delta is the whole state at 0.
            let mut s = State::new();
            delta_of(dir, 0)?.apply(&mut s)?;
            Ok((0, s))
        }
        Err(e) => Err(HistoryError::io("reading", &p, e)),
    }
}

/// Checkpoint `n`'s delta.
pub(crate) fn delta_of(dir: &Path, n: u64) -> Result<Delta, HistoryError> {
    let p = dir.join("deltas").join(format!("{n}.json"));
    let text = match std::fs::read(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(HistoryError::NoCheckpoint(n))
        }
        Err(e) => return Err(HistoryError::io("reading", &p, e)),
    };
    serde_json::from_slice(&text)
        .map_err(|e| HistoryError::Corrupt(format!("delta {n}"), e.to_string()))
}

/// Whether the history of the layer at `layer` holds a change (a layer
/// the agent emptied again still holds its work, for `rewind`).
pub(crate) fn changed_ever(layer: &Path) -> bool {
    read_lines(&History::dir_of(layer))
        .is_ok_and(|l| l.iter().any(|l| l.n > 0 && l.changed + l.removed > 0))
}

/// The log of the history at `dir`.
pub(crate) fn read_lines(dir: &Path) -> Result<Vec<Line>, HistoryError> {
    let p = dir.join("log.jsonl");
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(HistoryError::io("reading", &p, e)),
    };
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|e| HistoryError::Corrupt("log".into(), e.to_string()))
        })
        .collect()
}

/// The digest chain: SHA-256 of the previous digest and the delta.
fn chain(prev: &str, delta: &Delta) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(serde_json::to_vec(delta).unwrap_or_default());
    walk::hex(&h.finalize())
}

/// Stores the content of `fd` (`size` bytes) as an object named by its
/// SHA-256, once; adds the bytes of a new object to `stored`.
fn store_object(
    objects: &Path,
    fd: OwnedFd,
    size: u64,
    stored: &mut u64,
) -> Result<String, HistoryError> {
    let mut file = std::fs::File::from(fd);
    // Hashed first: content the store has already costs no write.
    let (first, _) = pass(&mut file, size, None, objects)?;
    if objects.join(&first).exists() {
        return Ok(first);
    }
    let tmp = objects.join(format!(".new-{}", crate::nonce::hex()));
    let r = copy_in(&tmp, &mut file, size, objects).and_then(|(name, total)| {
        // What was copied is named by what was copied (it may have
        // changed since the first pass; the next checkpoint sees it).
        let dst = objects.join(&name);
        if dst.exists() {
            let _ = std::fs::remove_file(&tmp);
        } else {
            std::fs::rename(&tmp, &dst).map_err(io("storing", &dst))?;
            *stored += total;
        }
        Ok(name)
    });
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Copies `size` bytes at most of `file` (from its start) into the new
/// file `tmp`; its SHA-256 (hex) and the bytes copied.
fn copy_in(
    tmp: &Path,
    file: &mut std::fs::File,
    size: u64,
    objects: &Path,
) -> Result<(String, u64), HistoryError> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(io("writing", tmp))?;
    std::io::Seek::seek(file, std::io::SeekFrom::Start(0)).map_err(io("reading", objects))?;
    pass(file, size, Some(&mut out), tmp)
}

/// Reads at most `size` bytes of `file` from where it is, hashing them
/// (and writing them to `out`); the SHA-256 (hex) and the bytes read.
fn pass(
    file: &mut std::fs::File,
    size: u64,
    mut out: Option<&mut std::fs::File>,
    at: &Path,
) -> Result<(String, u64), HistoryError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io("reading", at))?;
        if n == 0 || total >= size {
            break;
        }
        let n = n.min((size - total) as usize);
        h.update(&buf[..n]);
        if let Some(o) = out.as_mut() {
            o.write_all(&buf[..n]).map_err(io("writing", at))?;
        }
        total += n as u64;
    }
    Ok((walk::hex(&h.finalize()), total))
}

impl History {
    /// The next checkpoint reads every entry again, trusting no listing
    /// (the tests' check of the feed).
    #[cfg(test)]
    pub(crate) fn forget_listing(&mut self) {
        self.seen.clear();
    }

    /// The state at the last checkpoint.
    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// The history's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the agent's writes are.
    pub(crate) fn writes(&self) -> &Path {
        &self.writes
    }
}
