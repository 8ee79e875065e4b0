//! OOM kills in the audit log (P5, P7).
//!
//! The kernel counts the instance's OOM kills in its cgroup
//! (`memory.events` `oom_kill` on v2, `memory.oom_control` on v1). A kill is
//! no tool call, so it gets a record of its own: `tool` `(oom-kill)`,
//! `outcome` `event`, and `args` `{"oom_kills": TOTAL, "new": N}`. The count is
//! read once a second; kills within one second share one record.

use super::audit::{Audit, Entry};
use crate::sandbox::cgroup::Cgroup;
use serde_json::json;
use std::time::Duration;

/// How often the count is read.
const EVERY: Duration = Duration::from_secs(1);

/// Tool name of the records this writes.
pub const TOOL: &str = "(oom-kill)";

/// Records every rise of the cgroup's OOM-kill count until the task is
/// dropped with the runtime. An instance without a cgroup has nothing to
/// watch (`sandbox_status` then says `oom_kills: null`).
pub async fn watch(audit: std::sync::Arc<Audit>, cgroup: Cgroup) {
    let mut seen = cgroup.oom_kills();
    loop {
        tokio::time::sleep(EVERY).await;
        let now = cgroup.oom_kills();
        if now > seen {
            if let Err(e) = audit.record(Entry {
                tool: TOOL,
                toolset: None,
                outcome: "event",
                error_type: Some("oom_kill"),
                duration_ms: 0,
                request_id: String::new(),
                client_id: None,
                args: &json!({"oom_kills": now, "new": now - seen}),
            }) {
                eprintln!("sandmux: {e}");
            }
            seen = now;
        }
    }
}
