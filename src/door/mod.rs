//! The one way the agent's work in a copy-on-write workspace reaches the
//! human: `sandmux diff ID [PATHS…]` shows what the instance changed (a
//! summary line per path, then a unified diff of the text, which `patch
//! -p1` applies in the workspace, then the digest of what it showed),
//! `sandmux apply ID` brings it in through one chokepoint (`apply.rs`) —
//! exactly what was reviewed (`review.rs`), or nothing — and `sandmux
//! discard ID` removes the layer. Decisions are made on types ([`Why`],
//! [`Report`], [`DoorError`]); lines are rendered from them.

pub(crate) mod apply;
mod aside;
pub(crate) mod calls;
pub(crate) mod diff;
mod gitask;
pub(crate) mod history;
pub(crate) mod hold;
pub(crate) mod home;
pub(crate) mod ignored;
pub(crate) mod instructions;
mod journal;
mod moved;
pub(crate) mod named;
pub(crate) mod plan;
pub(crate) mod precious;
pub(crate) mod record;
pub(crate) mod refs;
pub(crate) mod review;
pub(crate) mod rewind;
mod show;
pub(crate) mod sparse;
mod undo;
pub(crate) mod upto;
pub(crate) mod xattr;

use diff::Change;
use hold::{shown_name, Why};
use plan::Plan;
mod ignored_summary;
use review::Reviewed;
pub(crate) use show::{show, Look};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// What keeps the door from doing what it was asked: nothing was applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DoorError {
    #[error("{0}")]
    Find(#[from] crate::supervisor::layer::LayerError),
    #[error("the layer: {0}")]
    Layer(String),
    #[error("{0}: paths are relative to the workspace, without '..'")]
    BadPath(String),
    #[error("the last review: {0}")]
    Review(String),
    #[error("{0}")]
    NotAsReviewed(String),
    #[error("this apply writes {need} bytes (apparent sizes) and the workspace's file system has {free} free: nothing applied; free space, or apply fewer PATHS")]
    NoSpace { need: u64, free: u64 },
    #[error("checkpoint {n} written out as a view needs {need} bytes (apparent sizes, each content once) and the layer's file system has {free} free: nothing written; free space, or review the whole layer (`sandmux diff ID`)")]
    ViewNoSpace { n: u64, need: u64, free: u64 },
    #[error("checkpoint {n} written out as a view needs {need} bytes (apparent sizes, each content once) and the kept layers hold {kept}: past [workspace] kept_bytes = {cap} of {}: nothing written; see them with `sandmux ps --all`, or review the whole layer (`sandmux diff ID`)", config.display())]
    ViewOverKept {
        n: u64,
        need: u64,
        kept: u64,
        cap: u64,
        config: PathBuf,
    },
    #[error("{0}")]
    Failed(String),
}

/// The held-back control directory `vcs` (`n` entries) and, for a git
/// directory on a whole `apply`, the agent's commits fetched as refs
/// (`refs.rs`), unless the repository lies at or below a path the door
/// holds back (a link of the human's, tool configuration…).
fn commits(
    (trees, layer, ws, id): (&diff::Trees, &Path, &Path, &str),
    vcs: &Path,
    n: usize,
    whole: bool,
    check: refs::Check<'_>,
    made: &dyn Fn(&Path) -> bool,
) -> Repo {
    let name = shown_name(vcs);
    let plain = format!("held back {name}/ (version-control data, {n} entries)");
    let Some(root) = refs::repositories(std::iter::once(vcs))
        .pop()
        .filter(|_| whole)
    else {
        return Repo::left(vec![plain]);
    };
    let at = root
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .find_map(|a| check(a, "directory").map(|why| (a.to_path_buf(), why)));
    let fetched = match at {
        Some((a, why)) => Err(format!("{} is held back: {why}", shown_name(&a))),
        None => refs::fetch(trees, (layer, ws), &root, id, (check, made(&root))),
    };
    match fetched {
        Ok(f) => {
            let what = match (f.fetched, f.refused) {
                (_, r) if r > 0 => "some branches not fetched",
                (m, _) if m > 0 => "its branches fetched",
                _ => "no new commits",
            };
            let mut lines = vec![format!(
                "held back {name}/ (version-control data, {n} entries; {what})"
            )];
            lines.extend(f.lines);
            Repo {
                lines,
                conflicts: f.refused,
                handled: f.refused == 0,
            }
        }
        Err(e) => Repo {
            lines: vec![
                plain,
                format!("conflict {name}: the agent's commits were not fetched ({e})"),
            ],
            conflicts: 1,
            handled: false,
        },
    }
}

/// What became of one held-back control directory.
struct Repo {
    lines: Vec<String>,
    conflicts: usize,
    /// Its commits came in (or there were none): nothing of it is left
    /// for the human.
    handled: bool,
}

impl Repo {
    fn left(lines: Vec<String>) -> Repo {
        Repo {
            lines,
            conflicts: 0,
            handled: false,
        }
    }
}

/// `sandmux discard ID`: removes the layer; 0, or 2 with the reason.
/// The record is written after the removal: a disk the agent filled must
/// not keep the human from freeing it (a record that cannot be written
/// then is said on stderr).
pub(crate) fn discard(id: &str) -> i32 {
    let dir = match crate::supervisor::layer::find(id) {
        Ok((dir, _)) => dir,
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            return 2;
        }
    };
    let (line, code) = match crate::supervisor::layer::discard(id) {
        Ok(dir) => (format!("removed {}", dir.display()), 0),
        Err(e) => (format!("failed: {e}"), 2),
    };
    eprintln!("sandmux: {}", crate::term::printable(&line));
    match record::Record::open(id, &dir) {
        Ok(rec) => rec.done("discard", &[], &[line], code),
        Err(e) => eprintln!("sandmux: not recorded: {}", crate::term::printable(&e)),
    }
    code
}

/// Records the removal of instance `id`'s layer (at `dir`) when the
/// instance ended (`--on-end apply` once everything came in, `--on-end
/// discard`) as a `discard` in its audit log, like `sandmux discard ID`;
/// written after the removal. A line to say when it could not be written.
pub(crate) fn record_end(id: &str, dir: &Path, line: &str, removed: bool) -> Option<String> {
    // The record's summary keeps lines by their first word.
    let said = match removed {
        true => format!("removed layer {id} at the end: {line}"),
        false => format!("failed: {line}"),
    };
    match record::Record::open(id, dir) {
        Ok(rec) => {
            rec.done("discard", &[], &[said], if removed { 0 } else { 2 });
            None
        }
        Err(e) => Some(format!("not recorded: {e}")),
    }
}

/// What `apply` was asked: the paths, whether held-back control named
/// among them comes too, `--expect`'s digest, `--undo`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ask {
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) include_control: bool,
    /// What git ignores comes too.
    pub(crate) include_ignored: bool,
    pub(crate) expect: Option<String>,
    pub(crate) undo: bool,
    /// `--upto N`: the work up to tool call N (`upto.rs`), not the whole
    /// layer.
    pub(crate) upto: Option<u64>,
}

/// `sandmux apply ID [PATHS…]`: 0 applied, 1 nothing to do, 3 applied
/// what it could and left conflicts (nothing lost), 2 refused or failed.
pub(crate) fn apply(id: &str, ask: &Ask) -> i32 {
    match apply_all(id, ask, false) {
        Ok(r) => {
            let term = std::io::stdout().is_terminal();
            // One write per buffer, not per line (30,000 paths: 30,000 lines).
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for l in r.lines {
                let l = if term { crate::term::printable(&l) } else { l };
                let _ = writeln!(out, "{l}");
            }
            let _ = out.flush();
            r.code
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            2
        }
    }
}

/// What one `apply` did, in types (the lines are rendered from it).
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) lines: Vec<String>,
    /// Which of `lines` say a path was applied (`--on-end apply` leaves
    /// them out of stderr: a CI log names only what needs the human).
    pub(crate) applied_lines: std::collections::BTreeSet<usize>,
    pub(crate) code: i32,
    pub(crate) applied: usize,
    pub(crate) conflicts: usize,
    /// Held-back paths left in the layer (a control directory whose
    /// commits came in is not among them).
    pub(crate) held_left: usize,
    /// The human's entries set aside that git cannot give back.
    pub(crate) unrecoverable: usize,
    /// The human's entries set aside in all.
    pub(crate) set_aside: usize,
}

impl Report {
    /// Whether anything is left in the layer for the human.
    pub(crate) fn left(&self) -> bool {
        self.conflicts > 0 || self.held_left > 0 || self.unrecoverable > 0
    }
}

/// `--on-end apply` of `run` and `shell`, once the instance has ended:
/// everything `sandmux apply ID` would bring in, moved (renamed) out of the
/// layer where it shares the workspace's file system. A layer left with
/// nothing held back, no conflict and none of the human's bytes that git
/// does not have is removed; otherwise it is kept and the last line says
/// so. The lines are for stderr; the flag says whether anything is left.
pub(crate) fn on_end(id: &str) -> (Vec<String>, bool) {
    // Nobody reviews here: every hold-back rule stays, and what git
    // ignores comes too (a CI loop keeps its build output, as before).
    let ask = Ask {
        include_ignored: true,
        ..Ask::default()
    };
    let r = match apply_all(id, &ask, true) {
        Ok(r) => r,
        Err(e) => {
            let lines = vec![
                format!("--on-end apply: {e}"),
                crate::supervisor::layer::kept(id),
            ];
            return (lines, true);
        }
    };
    let left = r.left();
    let applied = r.applied;
    let mut lines: Vec<String> = r
        .lines
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !r.applied_lines.contains(i))
        .map(|(_, l)| l)
        .collect();
    if !left {
        let dir = crate::supervisor::layer::find(id).map(|(d, _)| d);
        let gone = crate::supervisor::layer::discard(id);
        let line = match &gone {
            Ok(_) => format!("--on-end apply: {applied} changes of instance {id} applied to the workspace; its layer is removed"),
            Err(e) => format!("--on-end apply: {applied} changes applied; layer {id} could not be removed: {e}"),
        };
        if let Ok(dir) = dir {
            lines.extend(record_end(id, &dir, &line, gone.is_ok()));
        }
        lines.push(line);
    } else {
        lines.push(format!(
            "--on-end apply: {applied} changes applied; what is listed above is left in the layer: {}",
            crate::supervisor::layer::kept(id)
        ));
    }
    (lines, left)
}

fn apply_all(id: &str, ask: &Ask, moving: bool) -> Result<Report, DoorError> {
    let (dir, meta) = crate::supervisor::layer::find(id)?;
    let _ended = crate::supervisor::layer::ended(&dir, id)?;
    crate::supervisor::layer::mark_ended(&dir);
    let rec = record::Record::open(id, &dir).map_err(DoorError::Failed)?;
    // What the layer holds changes: measured again when next listed.
    let _ = std::fs::remove_file(dir.join(crate::supervisor::kept::USAGE));
    let action = match (ask.undo, moving) {
        (true, _) => "undo",
        (false, true) => "on-end apply",
        (false, false) => "apply",
    };
    // `--upto N`: the same door on a view of checkpoint N (`upto.rs`).
    let (at, action) = match ask.upto {
        // Nothing to undo in a view never made: none is made for it.
        Some(n) if ask.undo && upto::existing(&dir, n).is_none() => {
            let e = DoorError::Failed(format!("no `apply {id} --upto {n}` ran: nothing to undo"));
            rec.done(
                &format!("{action} --upto {n}"),
                &ask.paths,
                &[format!("failed: {e}")],
                2,
            );
            return Err(e);
        }
        Some(n) => match upto::view(&dir, &meta, id, n) {
            Ok(v) => (v, format!("{action} --upto {n}")),
            Err(e) => {
                rec.done(action, &ask.paths, &[format!("failed: {e}")], 2);
                return Err(e);
            }
        },
        None => (dir.clone(), action.to_string()),
    };
    let ctx = Through {
        id,
        dir: &at,
        top: &dir,
        meta: &meta,
    };
    let done = through(ctx, ask, moving);
    match &done {
        Ok(r) => rec.done(&action, &ask.paths, &r.lines, r.code),
        Err(e) => rec.done(&action, &ask.paths, &[format!("failed: {e}")], 2),
    }
    done
}

/// What the door works on: the instance, its layer (or a view of one of
/// its checkpoints, `upto.rs`) and what it says.
#[derive(Clone, Copy)]
struct Through<'a> {
    id: &'a str,
    dir: &'a Path,
    /// The layer's own directory (`dir`, or the view's layer).
    top: &'a Path,
    meta: &'a crate::supervisor::layer::Meta,
}

/// `apply` (or `--undo`) once the layer is locked and the log open.
fn through(t: Through<'_>, ask: &Ask, moving: bool) -> Result<Report, DoorError> {
    let (id, dir, meta) = (t.id, t.dir.to_path_buf(), t.meta);
    if ask.undo {
        undo_names_views(&t, ask)?;
        let trees = diff::Trees::open(&dir, &meta.workspace).map_err(DoorError::Layer)?;
        let (n, left) = undo::undo(&trees, &dir).map_err(DoorError::Failed)?;
        let mut lines = vec![format!("undone: {n} steps")];
        lines.extend(left.iter().map(|l| format!("not undone: {l}")));
        let code = if left.is_empty() { 0 } else { 3 };
        return Ok(Report {
            lines,
            code,
            ..Report::default()
        });
    }
    let plan = Plan::open(&dir, meta, &ask.paths)?;
    let named = |rel: &Path| ask.paths.iter().any(|p| rel.starts_with(p));
    let brings = |i: &plan::Item| {
        let control = match &i.why {
            None => true,
            Some(w) => !w.never() && ask.include_control && named(i.change.rel()),
        };
        control && (!i.ignored || ask.include_ignored)
    };
    let brought: Vec<&Change> = plan
        .items
        .iter()
        .filter(|i| brings(i))
        .map(|i| &i.change)
        .collect();
    let need = plan.bytes(&brought);
    let free = nix::sys::statvfs::fstatvfs(&plan.trees.lower)
        .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
        .map_err(|e| DoorError::Failed(format!("the workspace's free space: {e}")))?;
    if need > free {
        return Err(DoorError::NoSpace { need, free });
    }
    let digest = as_reviewed(&plan, (&dir, t.top, id), ask, &brought)?;
    let mut door =
        apply::Door::open(&plan.trees, &dir, meta.created_ns).map_err(DoorError::Failed)?;
    door.moving = moving;
    let mut r = Report::default();
    let mut vcs: Vec<(PathBuf, usize)> = Vec::new();
    let mut ignored = ignored_summary::Summary::default();
    for item in &plan.items {
        let (c, why) = (&item.change, &item.why);
        let rel = c.rel();
        let name = shown_name(rel);
        if item.ignored && !ask.include_ignored {
            ignored.add(&plan.trees, c);
            continue;
        }
        if let Some(why) = why.as_ref().filter(|_| !brings(item)) {
            match hold::vcs_root(rel) {
                // One line per control directory, not per object.
                Some(root) if *why == Why::Vcs => match vcs.iter_mut().find(|(r, _)| *r == root) {
                    Some((_, n)) => *n += 1,
                    None => vcs.push((root, 1)),
                },
                _ => {
                    r.held_left += 1;
                    r.lines.push(format!("held back {name} ({why})"));
                }
            }
            continue;
        }
        match door.apply(c) {
            Ok(true) => {
                r.applied += 1;
                r.applied_lines.insert(r.lines.len());
                r.lines.push(format!("applied {name}"));
            }
            Ok(false) => {}
            Err(why) => {
                r.conflicts += 1;
                r.lines.push(format!("conflict {name} ({why})"));
            }
        }
    }
    // Before any of the agent's commits are fetched: a repository host git
    // makes for them (`git init`, `git reset`) must not count as having
    // the human's bytes.
    let unrecoverable = match moving {
        true => precious::unrecoverable(&meta.workspace, &door.taken),
        false => 0,
    };
    let bare = |p: &Path| plan.trees.bare_shape(p);
    let check = |rel: &Path, what: &'static str| {
        let c = Change::Added {
            rel: rel.to_path_buf(),
            what,
        };
        hold::held(&c, &plan.hold, &bare).map(|w| w.to_string())
    };
    // Directories the agent made: a repository there may be made by host
    // git even inside the human's (as `cargo new` does).
    let made = |root: &Path| {
        plan.items
            .iter()
            .any(|i| matches!(&i.change, Change::Added { rel, what: "directory" } if rel == root))
    };
    for (root, n) in &vcs {
        let ctx = (&plan.trees, dir.as_path(), meta.workspace.as_path(), id);
        let repo = commits(ctx, root, *n, ask.paths.is_empty(), &check, &made);
        r.lines.extend(repo.lines);
        r.conflicts += repo.conflicts;
        r.held_left += usize::from(!repo.handled);
    }
    r.lines.extend(
        ignored
            .lines()
            .lines()
            .map(|l| format!("left {}", l.trim_start_matches("I "))),
    );
    door.finish().map_err(DoorError::Failed)?;
    r.set_aside = door.taken.len();
    let upto = ask.upto.map(|n| format!(" --upto {n}")).unwrap_or_default();
    if moving {
        r.unrecoverable = unrecoverable;
        if r.unrecoverable > 0 {
            r.lines.push(format!(
                "kept {} of your files, replaced or removed, in the layer (git does not have their bytes): `sandmux apply {id}{upto} --undo` puts them back",
                r.unrecoverable
            ));
        }
    } else if r.set_aside > 0 {
        r.lines.push(format!(
            "kept {} of your files, replaced or removed, in the layer until you discard it: `sandmux apply {id}{upto} --undo` puts them back",
            r.set_aside
        ));
    }
    r.lines
        .push(format!("digest {digest} (what this apply weighed)"));
    r.code = match (r.applied, r.conflicts) {
        (_, c) if c > 0 => 3,
        (0, _) => 1,
        _ => 0,
    };
    Ok(r)
}

/// A plain `--undo` with no journal of a whole apply, where `apply
/// --upto N` ran: the error names the `--undo` that puts the human's
/// files back.
fn undo_names_views(t: &Through<'_>, ask: &Ask) -> Result<(), DoorError> {
    if ask.upto.is_some() || t.dir.join("apply.jsonl").exists() {
        return Ok(());
    }
    let ns = crate::supervisor::history::views::journaled(t.top);
    if ns.is_empty() {
        return Ok(());
    }
    let runs: Vec<String> = ns
        .iter()
        .map(|n| format!("`sandmux apply {} --upto {n} --undo`", t.id))
        .collect();
    Err(DoorError::Failed(format!(
        "no whole `apply {}` ran; `apply --upto` did, and its journal is in that checkpoint's view: {}",
        t.id,
        runs.join(", ")
    )))
}

/// Applied = reviewed: with `--expect`, the plan's digest must be that one;
/// without it, after a `diff` of this layer, every change to be brought
/// must be as that `diff` showed it. The plan's digest.
fn as_reviewed(
    plan: &Plan,
    (dir, top, id): (&Path, &Path, &str),
    ask: &Ask,
    brought: &[&Change],
) -> Result<String, DoorError> {
    let now = plan.manifest();
    let digest = now.digest();
    let seen = Reviewed::load(dir)?;
    let names = |ps: Vec<PathBuf>| {
        let n = ps.len();
        let mut s: Vec<String> = ps.iter().take(10).map(|p| shown_name(p)).collect();
        if n > 10 {
            s.push(format!("and {} more", n - 10));
        }
        s.join(", ")
    };
    if let Some(want) = &ask.expect {
        if *want == digest {
            return Ok(digest);
        }
        let what = match seen.filter(|s| s.digest == *want && !s.running) {
            Some(s) => format!(
                "changed since that diff: {}",
                names(now.differing(&s.manifest, None))
            ),
            None => "no `sandmux diff` of this layer showed it".to_string(),
        };
        return Err(DoorError::NotAsReviewed(format!(
            "the layer's changes are digest {digest}, not {want} ({what}): nothing applied; run `sandmux diff` again"
        )));
    }
    let Some(seen) = seen else {
        // No review of this, but one of another state of the layer (the
        // whole layer, or another `--upto`): not what the human saw.
        return match upto::reviewed_elsewhere(top, dir, id) {
            Some(why) => Err(DoorError::NotAsReviewed(why)),
            None => Ok(digest),
        };
    };
    if seen.running {
        return Err(DoorError::NotAsReviewed(
            "your last `sandmux diff` was of the instance while it ran, when the agent could change what it showed: nothing applied; run `sandmux diff` again now that it has ended".into(),
        ));
    }
    let only: Vec<PathBuf> = brought.iter().map(|c| c.rel().to_path_buf()).collect();
    let differ = now.differing(&seen.manifest, Some(&only));
    if differ.is_empty() {
        return Ok(digest);
    }
    Err(DoorError::NotAsReviewed(format!(
        "not as your last `sandmux diff` showed it: {}: nothing applied; run `sandmux diff` again, or `--expect {digest}` to take the layer as it is now",
        names(differ)
    )))
}
