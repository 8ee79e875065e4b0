//! `sandmux diff ID [PATHS…]`: what the layer changed, as review shows it
//! — a summary line per path (what git ignores one line per top
//! directory, other agents' instructions apart), the unified diff of the
//! text, and the digest of what it showed, kept for `apply` (`review.rs`).

use super::diff::{self, Change};
use super::hold::{shown_name, Why};
use super::plan::Plan;
use super::review::Reviewed;
use super::{ignored_summary, DoorError};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// What `diff` was asked: the paths, the summary alone, what git ignores
/// shown path by path.
#[derive(Debug, Clone, Default)]
pub(crate) struct Look {
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) names_only: bool,
    pub(crate) include_ignored: bool,
    /// `--upto N`: the work up to tool call N (`upto.rs`).
    pub(crate) upto: Option<u64>,
}

/// `sandmux diff ID [PATHS…]`: 0 when the layer holds no change, 1 when it
/// does (as `diff(1)`), 2 when it cannot be read.
pub(crate) fn show(id: &str, look: &Look) -> i32 {
    match render(id, look) {
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

/// The summary, the diff and the digest of layer `id` under `paths`, and
/// whether it changed anything; the review kept for `apply`.
fn render(id: &str, look: &Look) -> Result<(String, bool), DoorError> {
    let (top, meta) = crate::supervisor::layer::find(id)?;
    let lock = crate::supervisor::layer::ended(&top, id);
    let running = lock.is_err();
    if !running {
        crate::supervisor::layer::mark_ended(&top);
    }
    let mut text = String::new();
    // `--upto N`: the same review of a view of checkpoint N (`upto.rs`).
    let (dir, upto) = match look.upto {
        None => (top.clone(), String::new()),
        Some(_) if running => return Err(DoorError::Running(id.to_string())),
        Some(n) => {
            text.push_str(&format!("# the work up to tool call {n} of instance {id} (checkpoint {n}, `sandmux log {id}`), not what came after it\n"));
            (
                super::upto::view(&top, &meta, id, n)?,
                format!(" --upto {n}"),
            )
        }
    };
    let plan = Plan::open(&dir, &meta, &look.paths)?;
    if running {
        text.push_str(&format!("# instance {id} is still running: the agent can change what follows until it ends; `sandmux apply {id}` refuses until you `sandmux diff {id}` again after its end\n"));
    }
    let shown = listed(&plan, look, &mut text);
    if !look.names_only && !shown.is_empty() {
        text.push('\n');
        text.push_str(&diff::unified(&plan.trees, &shown));
    }
    let manifest = plan.manifest();
    let digest = manifest.digest();
    let seen = Reviewed {
        paths: look.paths.clone(),
        running,
        digest: digest.clone(),
        manifest,
    };
    // The last review wins, across views: every other state's is stale,
    // once this one is saved (a failed save leaves the others, so an apply
    // of this state still finds a review elsewhere and refuses).
    match seen.save(&dir) {
        Ok(()) => super::upto::forget_others(&top, &dir),
        Err(e) => eprintln!(
            "sandmux: {}: a plain `apply` will not check this review; `--expect` does",
            crate::term::printable(&e.to_string())
        ),
    }
    if running {
        text.push_str(&format!("# no digest while instance {id} runs: `sandmux diff {id}` again once it has ended gives the one `apply` checks\n"));
    } else if !plan.items.is_empty() {
        let sel: String = look
            .paths
            .iter()
            .map(|p| format!(" {}", shown_name(p)))
            .collect();
        text.push_str(&format!(
            "# digest {digest}: `sandmux apply {id}{upto}{sel} --expect {digest}` brings exactly this, or nothing\n"
        ));
    }
    drop(lock);
    Ok((text, !plan.items.is_empty()))
}

/// One line per change of the plan into `text` (held-back instructions
/// for coding agents last, apart; ignored paths summarised); the changes
/// whose text the diff then shows.
fn listed<'p>(plan: &'p Plan, look: &Look, text: &mut String) -> Vec<&'p Change> {
    let mut shown = Vec::new();
    let mut apart = Vec::new();
    let mut ignored = ignored_summary::Summary::default();
    for item in &plan.items {
        let (c, why) = (&item.change, &item.why);
        if item.ignored && !look.include_ignored {
            ignored.add(&plan.trees, c);
            continue;
        }
        let name = shown_name(c.rel());
        if let Some(why) = why {
            let line = format!("H {name} (held back: {why})\n");
            match why {
                Why::Instructions => apart.push(line),
                _ => text.push_str(&line),
            }
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
    text.push_str(&ignored.lines());
    if !apart.is_empty() {
        text.push_str("# instructions for coding agents, held back (your next agent would obey them; read them before `--include-control`):\n");
        apart.iter().for_each(|l| text.push_str(l));
    }
    shown
}
