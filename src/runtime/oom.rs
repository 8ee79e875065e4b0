//! OOM kills in the audit log (P5, P7).
//!
//! The kernel counts the instance's OOM kills in its cgroup
//! (`memory.events` `oom_kill` on v2, `memory.oom_control` on v1). A kill is
//! no tool call, so it gets a record of its own: `tool` `(oom-kill)`,
//! `outcome` `event`, and `args` `{"oom_kills": TOTAL, "new": N}`. The count is
//! read once a second and once more when the instance ends (the kill that
//! matters most may be the one that ended it); kills between two reads share
//! one record.

use crate::audit::{Audit, Entry};
use crate::sandbox::cgroup::Cgroup;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the count is read.
const EVERY: Duration = Duration::from_secs(1);

/// Tool name of the records this writes.
pub(crate) const TOOL: &str = "(oom-kill)";

/// The OOM-kill count of one instance's cgroup, and what was recorded of it.
pub(crate) struct Watch {
    audit: Arc<Audit>,
    cgroup: std::sync::Mutex<Cgroup>,
    /// Kills already recorded. The cgroup is new with the instance, so this
    /// starts at 0 and a kill during start-up is recorded too.
    seen: AtomicU64,
}

impl Watch {
    /// A watch over `cgroup`, recording into `audit`.
    pub(crate) fn new(audit: Arc<Audit>, cgroup: Cgroup) -> Arc<Watch> {
        Arc::new(Watch {
            audit,
            cgroup: std::sync::Mutex::new(cgroup),
            seen: AtomicU64::new(0),
        })
    }

    /// Records what the old cgroup still holds, then watches a new server
    /// generation's cgroup from 0.
    pub(crate) fn replace(&self, cgroup: Cgroup) {
        self.check();
        *self.cgroup.lock().unwrap_or_else(|p| p.into_inner()) = cgroup;
        self.seen.store(0, Ordering::SeqCst);
    }

    /// Reads the count and records a rise since the last read.
    pub(crate) fn check(&self) {
        let now = self
            .cgroup
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .oom_kills();
        let seen = self.seen.fetch_max(now, Ordering::SeqCst);
        if now <= seen {
            return;
        }
        self.audit.event(Entry::event(
            TOOL,
            Some("oom_kill"),
            &json!({"oom_kills": now, "new": now - seen}),
        ));
    }

    /// Checks once a second until the task is dropped with the runtime.
    pub(crate) async fn run(self: Arc<Watch>) {
        loop {
            tokio::time::sleep(EVERY).await;
            self.check();
        }
    }
}
