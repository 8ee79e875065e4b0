//! One `apply` through the door, once the layer is locked and the log
//! open: the plan weighed against the free space and the last review,
//! each change applied or held back, the agent's commits fetched, the
//! report said from its counts. (`--undo` plays the journal back.)

use super::diff::{self, Change};
use super::hold::{self, shown_name, Why};
use super::plan::{self, Plan};
use super::report::{Kind, Line};
use super::review::Reviewed;
use super::{apply, ignored_summary, precious, refs, undo, upto, Ask, DoorError, Report};
use std::path::{Path, PathBuf};

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
    let plain = Line::new(
        Kind::HeldBack,
        format!("held back {name}/ (version-control data, {n} entries)"),
    );
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
        Some((a, why)) => Err(super::error::RefsError::HeldBack {
            name: shown_name(&a),
            why,
        }),
        None => refs::fetch(trees, (layer, ws), &root, id, (check, made(&root))),
    };
    match fetched {
        Ok(f) => {
            let what = match (f.fetched, f.refused) {
                (_, r) if r > 0 => "some branches not fetched",
                (m, _) if m > 0 => "its branches fetched",
                _ => "no new commits",
            };
            let mut lines = vec![Line::new(
                Kind::HeldBack,
                format!("held back {name}/ (version-control data, {n} entries; {what})"),
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
                Line::new(
                    Kind::Conflict,
                    format!("conflict {name}: the agent's commits were not fetched ({e})"),
                ),
            ],
            conflicts: 1,
            handled: false,
        },
    }
}

/// What became of one held-back control directory.
struct Repo {
    lines: Vec<Line>,
    conflicts: usize,
    /// Its commits came in (or there were none): nothing of it is left
    /// for the human.
    handled: bool,
}

impl Repo {
    fn left(lines: Vec<Line>) -> Repo {
        Repo {
            lines,
            conflicts: 0,
            handled: false,
        }
    }
}

/// What the door works on: the instance, its layer (or a view of one of
/// its checkpoints, `upto.rs`) and what it says.
#[derive(Clone, Copy)]
pub(super) struct Through<'a> {
    pub(super) id: &'a str,
    pub(super) dir: &'a Path,
    /// The layer's own directory (`dir`, or the view's layer).
    pub(super) top: &'a Path,
    pub(super) meta: &'a crate::supervisor::layer::Meta,
}

/// `apply` (or `--undo`) once the layer is locked and the log open.
pub(super) fn through(t: Through<'_>, ask: &Ask, moving: bool) -> Result<Report, DoorError> {
    if ask.undo {
        return undone(&t, ask);
    }
    let (id, dir, meta) = (t.id, t.dir.to_path_buf(), t.meta);
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
    fits(&plan, &brought)?;
    let digest = as_reviewed(&plan, (&dir, t.top, id), ask, &brought)?;
    let mut door = apply::Door::open(&plan.trees, &dir, meta.created_ns)?;
    door.moving = moving;
    let (mut r, vcs, ignored) = each_item(&plan, &mut door, ask, &brings);
    // Before any of the agent's commits are fetched: a repository host git
    // makes for them (`git init`, `git reset`) must not count as having
    // the human's bytes.
    let unrecoverable = match moving {
        true => precious::unrecoverable(&meta.workspace, &door.taken),
        false => 0,
    };
    let ctx = (&plan.trees, dir.as_path(), meta.workspace.as_path(), id);
    fetch_each(&plan, ctx, &vcs, ask, &mut r);
    r.lines.extend(
        ignored
            .lines()
            .lines()
            .map(|l| Line::note(format!("left {}", l.trim_start_matches("I ")))),
    );
    door.finish()?;
    r.set_aside = door.taken.len();
    r.unrecoverable = if moving { unrecoverable } else { 0 };
    Ok(ended(r, (id, ask.upto), moving, &digest))
}

/// `apply --undo`: the journal played back.
fn undone(t: &Through<'_>, ask: &Ask) -> Result<Report, DoorError> {
    undo_names_views(t, ask)?;
    let trees = diff::Trees::open(t.dir, &t.meta.workspace)?;
    let (n, left) = undo::undo(&trees, t.dir)?;
    let mut lines = vec![Line::new(Kind::Undone, format!("undone: {n} steps"))];
    lines.extend(
        left.iter()
            .map(|l| Line::new(Kind::NotUndone, format!("not undone: {l}"))),
    );
    let code = if left.is_empty() { 0 } else { 3 };
    Ok(Report {
        lines,
        code,
        ..Report::default()
    })
}

/// What is brought must fit in the workspace's free space.
fn fits(plan: &Plan, brought: &[&Change]) -> Result<(), DoorError> {
    let need = plan.bytes(brought);
    let free = nix::sys::statvfs::fstatvfs(&plan.trees.lower)
        .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
        .map_err(|source| DoorError::FreeSpace {
            of: "the workspace's",
            source,
        })?;
    match need > free {
        true => Err(DoorError::NoSpace { need, free }),
        false => Ok(()),
    }
}

/// Each change of the plan: applied, a conflict, held back (one line per
/// control directory, whose roots are returned with their counts), or
/// left as ignored (summarised).
fn each_item(
    plan: &Plan,
    door: &mut apply::Door<'_>,
    ask: &Ask,
    brings: &dyn Fn(&plan::Item) -> bool,
) -> (Report, Vec<(PathBuf, usize)>, ignored_summary::Summary) {
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
                Some(root) if *why == Why::Vcs => match vcs.iter_mut().find(|(r, _)| *r == root) {
                    Some((_, n)) => *n += 1,
                    None => vcs.push((root, 1)),
                },
                _ => {
                    r.held_left += 1;
                    r.lines.push(Line::new(
                        Kind::HeldBack,
                        format!("held back {name} ({why})"),
                    ));
                }
            }
            continue;
        }
        match door.apply(c) {
            Ok(true) => {
                r.applied += 1;
                r.lines
                    .push(Line::new(Kind::Applied, format!("applied {name}")));
            }
            Ok(false) => {}
            Err(why) => {
                r.conflicts += 1;
                r.lines.push(Line::new(
                    Kind::Conflict,
                    format!("conflict {name} ({why})"),
                ));
            }
        }
    }
    (r, vcs, ignored)
}

/// The agent's commits of each held-back git directory, fetched as refs
/// where the door's rules allow (`commits`).
fn fetch_each(
    plan: &Plan,
    ctx: (&diff::Trees, &Path, &Path, &str),
    vcs: &[(PathBuf, usize)],
    ask: &Ask,
    r: &mut Report,
) {
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
    for (root, n) in vcs {
        let repo = commits(ctx, root, *n, ask.paths.is_empty(), &check, &made);
        r.lines.extend(repo.lines);
        r.conflicts += repo.conflicts;
        r.held_left += usize::from(!repo.handled);
    }
}

/// The report's last lines (what was set aside and how to undo it, the
/// digest) and its exit status, from its counts.
fn ended(mut r: Report, (id, upto): (&str, Option<u64>), moving: bool, digest: &str) -> Report {
    let upto = upto.map(|n| format!(" --upto {n}")).unwrap_or_default();
    if moving {
        if r.unrecoverable > 0 {
            r.lines.push(Line::new(Kind::Kept, format!(
                "kept {} of your files, replaced or removed, in the layer (git does not have their bytes): `sandmux apply {id}{upto} --undo` puts them back",
                r.unrecoverable
            )));
        }
    } else if r.set_aside > 0 {
        r.lines.push(Line::new(Kind::Kept, format!(
            "kept {} of your files, replaced or removed, in the layer until you discard it: `sandmux apply {id}{upto} --undo` puts them back",
            r.set_aside
        )));
    }
    r.lines.push(Line::note(format!(
        "digest {digest} (what this apply weighed)"
    )));
    r.code = match (r.applied, r.conflicts) {
        (_, c) if c > 0 => 3,
        (0, _) => 1,
        _ => 0,
    };
    r
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
    Err(DoorError::UndoInView {
        id: t.id.to_string(),
        views: ns,
    })
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
        let want = want.clone();
        return Err(match seen.filter(|s| s.digest == want && !s.running) {
            Some(s) => DoorError::ExpectChanged {
                names: names(now.differing(&s.manifest, None)),
                digest,
                want,
            },
            None => DoorError::ExpectUnseen { digest, want },
        });
    }
    let Some(seen) = seen else {
        // No review of this, but one of another state of the layer (the
        // whole layer, or another `--upto`): not what the human saw.
        return match upto::reviewed_elsewhere(top, dir, id) {
            Some(e) => Err(e),
            None => Ok(digest),
        };
    };
    if seen.running {
        return Err(DoorError::ReviewedRunning);
    }
    let only: Vec<PathBuf> = brought.iter().map(|c| c.rel().to_path_buf()).collect();
    let differ = now.differing(&seen.manifest, Some(&only));
    if differ.is_empty() {
        return Ok(digest);
    }
    Err(DoorError::NotAsShown {
        names: names(differ),
        digest,
    })
}
