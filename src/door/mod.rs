//! The one way the agent's work in a copy-on-write workspace reaches the
//! human: `sandmux diff ID` shows what the instance changed (a summary line
//! per path, then a unified diff of the text, which `patch -p1` applies in
//! the workspace), `sandmux apply ID` brings it in through one chokepoint
//! (`apply.rs`), and `sandmux discard ID` removes the layer.

pub(crate) mod apply;
pub(crate) mod diff;
pub(crate) mod hold;
pub(crate) mod refs;
pub(crate) mod xattr;

use diff::Change;
use hold::{held, shown_name, unsafe_name, Hold};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

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
            eprintln!("sandmux: {}", crate::term::printable(&e));
            2
        }
    }
}

/// The summary and the diff of layer `id`, and whether it changed anything.
fn render(id: &str, names_only: bool) -> Result<(String, bool), String> {
    let (dir, meta) = crate::supervisor::layer::find(id)?;
    let trees = diff::Trees::open(&dir, &meta.workspace)?;
    let changes = diff::changes(&trees)?;
    let bare = |p: &std::path::Path| trees.bare_shape(p);
    let hold = Hold::new(&meta.workspace, meta.held_names.clone());
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

/// `sandmux discard ID`: removes the layer; 0, or 2 with the reason.
pub(crate) fn discard(id: &str) -> i32 {
    match crate::supervisor::layer::discard(id) {
        Ok(dir) => {
            eprintln!("sandmux: removed {}", dir.display());
            0
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e));
            2
        }
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
            eprintln!("sandmux: {}", crate::term::printable(&e));
            2
        }
    }
}

/// `--on-end apply` of `run` and `shell`, once the instance has ended:
/// everything `sandmux apply ID` would bring in, moved (renamed) out of the
/// layer where it shares the workspace's file system. A layer left with
/// nothing held back and no conflict is removed; otherwise it is kept and
/// the last line says so. The lines are for stderr.
pub(crate) fn on_end(id: &str) -> Vec<String> {
    let (mut lines, _) = match apply_all_moving(id, &[], false, false, true) {
        Ok(r) => r,
        Err(e) => {
            return vec![
                format!("--on-end apply: {e}"),
                crate::supervisor::layer::kept(id),
            ]
        }
    };
    // Left for the human: what was held back or in conflict, but a git
    // directory whose branches came in as refs (its files are applied).
    let handled =
        |l: &str| l.ends_with("; its branches fetched)") || l.ends_with("; no new commits)");
    let left = lines
        .iter()
        .any(|l| l.starts_with("conflict ") || l.starts_with("held back ") && !handled(l));
    let n = lines.len();
    lines.retain(|l| !l.starts_with("applied "));
    let applied = n - lines.len();
    if !left {
        let gone = crate::supervisor::layer::discard(id);
        lines.push(match gone {
            Ok(_) => format!("--on-end apply: {applied} changes of instance {id} applied to the workspace; its layer is removed"),
            Err(e) => format!("--on-end apply: {applied} changes applied; layer {id} could not be removed: {e}"),
        });
    } else {
        lines.push(format!(
            "--on-end apply: {applied} changes applied; what is listed above is left in the layer: {}",
            crate::supervisor::layer::kept(id)
        ));
    }
    lines
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
    let (dir, meta) = crate::supervisor::layer::find(id)?;
    let _ended = crate::supervisor::layer::ended(&dir, id)?;
    if undo {
        let trees = diff::Trees::open(&dir, &meta.workspace)?;
        let (n, left) = apply::undo(&trees, &dir)?;
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
    let hold = Hold::new(&meta.workspace, meta.held_names.clone());
    let mut door = apply::Door::open(&trees, &dir, meta.created_ns)?;
    door.moving = moving;
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
    for (root, n) in &vcs {
        let repo = refs::repositories(std::iter::once(root.as_path()));
        let fetched = match repo.first() {
            Some(r) if paths.is_empty() => match refs::fetch(&dir, &meta.workspace, r, id) {
                Ok(said) if said.is_empty() => Ok(vec![]),
                Ok(said) => Ok(said),
                Err(e) => Err(e),
            },
            _ => Err(String::new()),
        };
        let name = shown_name(root);
        match fetched {
            Ok(said) => {
                let what = if said.is_empty() {
                    "no new commits"
                } else {
                    "its branches fetched"
                };
                lines.push(format!(
                    "held back {name}/ (version-control data, {n} entries; {what})"
                ));
                lines.extend(said);
            }
            Err(e) if e.is_empty() => lines.push(format!(
                "held back {name}/ (version-control data, {n} entries)"
            )),
            Err(e) => {
                conflicts += 1;
                lines.push(format!(
                    "held back {name}/ (version-control data, {n} entries)"
                ));
                lines.push(format!(
                    "conflict {name}: the agent's commits were not fetched ({e})"
                ));
            }
        }
    }
    let code = match (applied, conflicts) {
        (_, c) if c > 0 => 3,
        (0, _) => 1,
        _ => 0,
    };
    Ok((lines, code))
}
