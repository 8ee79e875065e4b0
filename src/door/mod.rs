//! The one way the agent's work in a copy-on-write workspace reaches the
//! human: `sandmux diff ID` shows what the instance changed (a summary line
//! per path, then a unified diff of the text, which `patch -p1` applies in
//! the workspace), `sandmux apply ID` brings it in through one chokepoint
//! (`apply.rs`), and `sandmux discard ID` removes the layer.

pub(crate) mod apply;
pub(crate) mod diff;
pub(crate) mod history;
pub(crate) mod hold;
pub(crate) mod precious;
pub(crate) mod record;
pub(crate) mod refs;
mod undo;
pub(crate) mod xattr;

use diff::Change;
use hold::{held, shown_name, unsafe_name, Hold};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// `sandmux diff ID`: 0 when the layer holds no change, 1 when it does
/// (as `diff(1)`), 2 when it cannot be read. `names_only`: the summary alone.
pub(crate) fn show(id: &str, names_only: bool) -> i32 {
    match render(id, names_only) {
        Ok((text, changed)) => {
            let mut out = std::io::stdout().lock();
            // The layer's names and text are the agent's: a terminal gets
            // them escaped, a pipe (to `patch`) gets the bytes.
            let text = if out.is_terminal() {
                text.lines()
                    .map(|l| crate::term::printable(l) + "\n")
                    .collect()
            } else {
                text
            };
            let _ = out.write_all(text.as_bytes());
            i32::from(changed)
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            2
        }
    }
}

/// The summary and the diff of layer `id`, and whether it changed anything.
fn render(id: &str, names_only: bool) -> Result<(String, bool), String> {
    let (dir, meta) = crate::supervisor::layer::find(id).map_err(|e| e.to_string())?;
    let trees = diff::Trees::open(&dir, &meta.workspace)?;
    let changes = diff::changes(&trees)?;
    let bare = |p: &std::path::Path| trees.bare_shape(p);
    let mut hold = Hold::new(&meta.workspace, meta.held_names.clone());
    hold.add_nested(&meta.workspace, changes.iter().map(|c| c.rel()));
    let mut text = String::new();
    let mut shown = Vec::new();
    for c in &changes {
        let name = shown_name(c.rel());
        if let Some(why) = held(c, &hold, &bare) {
            text.push_str(&format!("H {name} (held back: {why})\n"));
            continue;
        }
        let line = match c {
            Change::Added { what, .. } => format!("A {name} ({what})"),
            Change::Modified { mode: None, .. } => format!("M {name}"),
            Change::Modified {
                mode: Some((a, b)), ..
            } => format!("M {name} (mode {a:o} -> {b:o})"),
            Change::Removed { .. } => format!("D {name}"),
            Change::Unreadable { .. } => continue, // held above
        };
        shown.push(c);
        text.push_str(&line);
        text.push('\n');
    }
    if !names_only && !shown.is_empty() {
        text.push('\n');
        text.push_str(&diff::unified(&trees, &shown)?);
    }
    Ok((text, !changes.is_empty()))
}

/// The held-back control directory `vcs` (`n` entries) and, for a git
/// directory on a whole `apply`, the agent's commits fetched as refs
/// (`refs.rs`), unless the repository lies at or below a path the door
/// holds back (a link of the human's, tool configuration…). The lines and
/// the conflicts.
fn commits(
    (trees, layer, ws, id): (&diff::Trees, &std::path::Path, &std::path::Path, &str),
    vcs: &std::path::Path,
    n: usize,
    whole: bool,
    check: refs::Check<'_>,
    made: &dyn Fn(&std::path::Path) -> bool,
) -> (Vec<String>, usize) {
    let name = shown_name(vcs);
    let plain = format!("held back {name}/ (version-control data, {n} entries)");
    let Some(root) = refs::repositories(std::iter::once(vcs))
        .pop()
        .filter(|_| whole)
    else {
        return (vec![plain], 0);
    };
    let at = root
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .find_map(|a| check(a, "directory").map(|why| (a.to_path_buf(), why)));
    let fetched = match at {
        Some((a, why)) => Err(format!("{} is held back: {why}", shown_name(&a))),
        None => refs::fetch(&trees.lower, (layer, ws), &root, id, (check, made(&root))),
    };
    match fetched {
        Ok(said) => {
            let moved = said.iter().any(|l| l.starts_with("fetched "));
            let refused = said.iter().filter(|l| l.starts_with("conflict ")).count();
            let what = match (moved, refused) {
                (_, r) if r > 0 => "some branches not fetched",
                (true, _) => "its branches fetched",
                (false, _) => "no new commits",
            };
            let mut lines = vec![format!(
                "held back {name}/ (version-control data, {n} entries; {what})"
            )];
            lines.extend(said);
            (lines, refused)
        }
        Err(e) => (
            vec![
                plain,
                format!("conflict {name}: the agent's commits were not fetched ({e})"),
            ],
            1,
        ),
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

/// `sandmux apply ID [PATHS…]`: 0 applied, 1 nothing to do, 3 applied
/// what it could and left conflicts (nothing lost), 2 refused or failed.
pub(crate) fn apply(
    id: &str,
    paths: &[std::path::PathBuf],
    include_control: bool,
    undo: bool,
) -> i32 {
    match apply_all(id, paths, include_control, undo) {
        Ok((lines, code)) => {
            let mut out = std::io::stdout().lock();
            for l in lines {
                let l = if out.is_terminal() {
                    crate::term::printable(&l)
                } else {
                    l
                };
                let _ = writeln!(out, "{l}");
            }
            code
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            2
        }
    }
}

/// `--on-end apply` of `run` and `shell`, once the instance has ended:
/// everything `sandmux apply ID` would bring in, moved (renamed) out of the
/// layer where it shares the workspace's file system. A layer left with
/// nothing held back and no conflict is removed; otherwise it is kept and
/// the last line says so. The lines are for stderr; the flag says whether
/// anything is left for the human.
pub(crate) fn on_end(id: &str) -> (Vec<String>, bool) {
    let (mut lines, _) = match apply_all_moving(id, &[], false, false, true) {
        Ok(r) => r,
        Err(e) => {
            let lines = vec![
                format!("--on-end apply: {e}"),
                crate::supervisor::layer::kept(id),
            ];
            return (lines, true);
        }
    };
    // Left for the human: what was held back or in conflict, but a git
    // directory whose branches came in as refs (its files are applied).
    let handled =
        |l: &str| l.ends_with("; its branches fetched)") || l.ends_with("; no new commits)");
    let left = lines.iter().any(|l| {
        l.starts_with("conflict ")
            || l.starts_with("kept ")
            || l.starts_with("held back ") && !handled(l)
    });
    let n = lines.len();
    lines.retain(|l| !l.starts_with("applied "));
    let applied = n - lines.len();
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

fn apply_all(
    id: &str,
    paths: &[std::path::PathBuf],
    include_control: bool,
    undo: bool,
) -> Result<(Vec<String>, i32), String> {
    apply_all_moving(id, paths, include_control, undo, false)
}

fn apply_all_moving(
    id: &str,
    paths: &[std::path::PathBuf],
    include_control: bool,
    undo: bool,
    moving: bool,
) -> Result<(Vec<String>, i32), String> {
    let (dir, meta) = crate::supervisor::layer::find(id).map_err(|e| e.to_string())?;
    let _ended = crate::supervisor::layer::ended(&dir, id).map_err(|e| e.to_string())?;
    let rec = record::Record::open(id, &dir)?;
    // What the layer holds changes: measured again when next listed.
    let _ = std::fs::remove_file(dir.join(crate::supervisor::kept::USAGE));
    let action = match (undo, moving) {
        (true, _) => "undo",
        (false, true) => "on-end apply",
        (false, false) => "apply",
    };
    let ctx = Through {
        id,
        dir: &dir,
        meta: &meta,
    };
    let done = through(ctx, paths, include_control, undo, moving);
    match &done {
        Ok((lines, code)) => rec.done(action, paths, lines, *code),
        Err(e) => rec.done(action, paths, &[format!("failed: {e}")], 2),
    }
    done
}

/// What the door works on: the instance, its layer and what it says.
#[derive(Clone, Copy)]
struct Through<'a> {
    id: &'a str,
    dir: &'a std::path::Path,
    meta: &'a crate::supervisor::layer::Meta,
}

/// `apply` (or `--undo`) once the layer is locked and the log open.
fn through(
    t: Through<'_>,
    paths: &[std::path::PathBuf],
    include_control: bool,
    undo: bool,
    moving: bool,
) -> Result<(Vec<String>, i32), String> {
    let (id, dir, meta) = (t.id, t.dir.to_path_buf(), t.meta);
    if undo {
        let trees = diff::Trees::open(&dir, &meta.workspace)?;
        let (n, left) = undo::undo(&trees, &dir)?;
        let mut lines = vec![format!("undone: {n} steps")];
        lines.extend(left.iter().map(|l| format!("not undone: {l}")));
        return Ok((lines, if left.is_empty() { 0 } else { 3 }));
    }
    if let Some(p) = paths
        .iter()
        .find(|p| p.is_absolute() || p.components().any(|c| c.as_os_str() == ".."))
    {
        return Err(format!(
            "{}: paths are relative to the workspace, without '..'",
            p.display()
        ));
    }
    let trees = diff::Trees::open(&dir, &meta.workspace)?;
    let changes = diff::changes(&trees)?;
    let bare = |p: &std::path::Path| trees.bare_shape(p);
    let mut hold = Hold::new(&meta.workspace, meta.held_names.clone());
    hold.add_nested(&meta.workspace, changes.iter().map(|c| c.rel()));
    let mut door = apply::Door::open(&trees, &dir, meta.created_ns)?;
    if moving {
        door.moving = Some(precious::Precious::of(&meta.workspace));
    }
    let (mut lines, mut applied, mut conflicts) = (Vec::new(), 0, 0);
    let mut vcs: Vec<(PathBuf, usize)> = Vec::new();
    for c in &changes {
        let rel = c.rel();
        let named = paths.iter().any(|p| rel.starts_with(p));
        if !paths.is_empty() && !named {
            continue;
        }
        let name = shown_name(rel);
        let never = matches!(c, Change::Unreadable { .. })
            || matches!(c, Change::Added { what, .. } if *what != "file" && *what != "directory")
            || unsafe_name(rel);
        if hold.is_exe(diff::stat_at(&trees.lower, rel)) {
            lines.push(format!(
                "held back {name} (a link of the sandmux binary that runs this)"
            ));
            continue;
        }
        if let Some(why) = held(c, &hold, &bare) {
            if never || !(include_control && named) {
                match hold::vcs_root(rel) {
                    // One line per control directory, not per object.
                    Some(root) if why == "version-control data" => {
                        match vcs.iter_mut().find(|(r, _)| *r == root) {
                            Some((_, n)) => *n += 1,
                            None => vcs.push((root, 1)),
                        }
                    }
                    _ => lines.push(format!("held back {name} ({why})")),
                }
                continue;
            }
        }
        match door.apply(c) {
            Ok(true) => {
                applied += 1;
                lines.push(format!("applied {name}"));
            }
            Ok(false) => {}
            Err(why) => {
                conflicts += 1;
                lines.push(format!("conflict {name} ({why})"));
            }
        }
    }
    let check = |rel: &std::path::Path, what: &'static str| {
        let c = Change::Added {
            rel: rel.to_path_buf(),
            what,
        };
        held(&c, &hold, &bare)
    };
    let whole = paths.is_empty();
    // Directories the agent made: a repository there may be made by host
    // git even inside the human's (as `cargo new` does).
    let made = |r: &std::path::Path| {
        changes
            .iter()
            .any(|c| matches!(c, Change::Added { rel, what: "directory" } if rel == r))
    };
    for (root, n) in &vcs {
        let ctx = (&trees, dir.as_path(), meta.workspace.as_path(), id);
        let (said, bad) = commits(ctx, root, *n, whole, &check, &made);
        lines.extend(said);
        conflicts += bad;
    }
    if door.precious > 0 {
        lines.push(format!(
            "kept {} of your files, replaced or removed, in the layer (git could not give them back): `sandmux apply {id} --undo` puts them back",
            door.precious
        ));
    }
    let code = match (applied, conflicts) {
        (_, c) if c > 0 => 3,
        (0, _) => 1,
        _ => 0,
    };
    Ok((lines, code))
}
