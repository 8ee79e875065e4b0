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
pub(crate) mod error;
pub(crate) use error::DoorError;
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
pub(crate) mod report;
use report::{Kind, Line};
pub(crate) mod review;
pub(crate) mod rewind;
mod show;
mod through;
use through::{through, Through};
pub(crate) mod sparse;
mod undo;
pub(crate) mod upto;
pub(crate) mod xattr;

mod ignored_summary;
pub(crate) use show::{show, Look};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

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
        Ok(dir) => (
            Line::new(Kind::Removed, format!("removed {}", dir.display())),
            0,
        ),
        Err(e) => (Line::failed(e), 2),
    };
    eprintln!("sandmux: {}", crate::term::printable(&line.text));
    match record::Record::open(id, &dir) {
        Ok(rec) => rec.done("discard", &[], &[line], code),
        Err(e) => eprintln!(
            "sandmux: not recorded: {}",
            crate::term::printable(&e.to_string())
        ),
    }
    code
}

/// Records the removal of instance `id`'s layer (at `dir`) when the
/// instance ended (`--on-end apply` once everything came in, `--on-end
/// discard`) as a `discard` in its audit log, like `sandmux discard ID`;
/// written after the removal. A line to say when it could not be written.
pub(crate) fn record_end(id: &str, dir: &Path, line: &str, removed: bool) -> Option<String> {
    let said = match removed {
        true => Line::new(
            Kind::Removed,
            format!("removed layer {id} at the end: {line}"),
        ),
        false => Line::failed(line),
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
            for Line { text: l, .. } in r.lines {
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
    /// What it says, line by line (`--on-end apply` leaves the applied
    /// ones out of stderr: a CI log names only what needs the human).
    pub(crate) lines: Vec<Line>,
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
        .filter(|l| l.kind != Kind::Applied)
        .map(|l| l.text)
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
    let rec = record::Record::open(id, &dir)?;
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
            let e = DoorError::NothingToUndo {
                id: id.to_string(),
                n,
            };
            rec.done(
                &format!("{action} --upto {n}"),
                &ask.paths,
                &[Line::failed(&e)],
                2,
            );
            return Err(e);
        }
        Some(n) => match upto::view(&dir, &meta, id, n) {
            Ok(v) => (v, format!("{action} --upto {n}")),
            Err(e) => {
                rec.done(action, &ask.paths, &[Line::failed(&e)], 2);
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
        Err(e) => rec.done(&action, &ask.paths, &[Line::failed(e)], 2),
    }
    done
}
