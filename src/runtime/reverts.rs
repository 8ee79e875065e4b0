//! The workspace guard's reverts in the audit log (P7, P8).
//!
//! When the guard takes a planted entry out of the workspace (a guarded name
//! or `.git` that appeared, a repository created during the instance), that is
//! no tool call, so it gets a record of its own: `tool` `(workspace-revert)`,
//! `outcome` `event`, and `args` with the path, the reason and where the entry
//! is kept. Reverts are read four times a second and once more after the end
//! sweep. The line that says where the agent's work went at the end (a
//! kept or discarded layer) is a record of its own, `(workspace-layer)`.

use crate::audit::{Audit, Entry};
use crate::guard::quarantine::Taken;
use crate::term::printable;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tool name of the records this writes.
pub(crate) const TOOL: &str = "(workspace-revert)";
/// Tool name of the record that says where the agent's work went when the
/// instance ended (a kept layer, a discarded one): no revert.
pub(crate) const LAYER_TOOL: &str = "(workspace-layer)";

/// Reverts already recorded, out of the guard's list.
pub(crate) struct Reverts {
    /// The quarantine directory of the instance.
    pub quarantine: std::path::PathBuf,
    audit: Arc<Audit>,
    taken: Arc<Mutex<Vec<Taken>>>,
    seen: Mutex<usize>,
}

impl Reverts {
    /// Records what `taken` gains into `audit`.
    pub(crate) fn new(
        audit: Arc<Audit>,
        taken: Arc<Mutex<Vec<Taken>>>,
        quarantine: std::path::PathBuf,
    ) -> Arc<Reverts> {
        Arc::new(Reverts {
            quarantine,
            audit,
            taken,
            seen: Mutex::new(0),
        })
    }

    /// Records the entries of `all` (the guard's list, or the final one
    /// including the end sweep) not recorded yet.
    pub(crate) fn record(&self, all: &[Taken]) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for t in all.iter().skip(*seen) {
            // Paths are the agent's bytes: escaped text, never raw (and
            // never a serialization that fails on invalid UTF-8).
            let esc = |p: &std::path::Path| printable(&p.to_string_lossy());
            use crate::guard::quarantine::How;
            let (tool, kind, args) = if t.how == How::LayerNotice {
                let args = json!({"layer": printable(&t.why)});
                (LAYER_TOOL, "workspace_layer", args)
            } else if t.how == How::Warning {
                (
                    TOOL,
                    "workspace_revert",
                    json!({"warning": printable(&t.why)}),
                )
            } else {
                let args = json!({
                    "path": esc(&t.path),
                    "why": printable(&t.why),
                    "how": t.how_said(),
                    "kept": t.kept.as_deref().map(esc),
                });
                (TOOL, "workspace_revert", args)
            };
            self.audit.event(Entry::event(tool, Some(kind), &args));
        }
        *seen = (*seen).max(all.len());
    }

    /// How many entries the guard has taken so far.
    pub(crate) fn count(&self) -> usize {
        self.taken.lock().map(|t| t.len()).unwrap_or(0)
    }

    /// Records new reverts four times a second until dropped with the runtime.
    pub(crate) async fn run(self: Arc<Reverts>) {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.taken.lock().unwrap_or_else(|p| p.into_inner()).clone();
            self.record(&now);
        }
    }
}
