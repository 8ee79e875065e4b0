//! Drift detection (P3): sandmux records the server's hooks, aliases, shells
//! and status line at start, and compares before every tool call and after
//! every mutating one. No tool can change them, so any difference means
//! something else reconfigured the server; sandmux then refuses every further
//! call and says why, rather than let a hint (an inspect tool is read-only)
//! silently become false.

use super::error::ToolError;
use crate::tmux::hub::{Cmd, Hub};
use std::sync::Mutex;

/// The commands whose output must not change.
fn probes() -> Vec<Cmd> {
    vec![
        Cmd::new("show-hooks").flag("-g"),
        Cmd::new("show-hooks").flag("-gw"),
        Cmd::new("show-hooks").flag("-gp"),
        Cmd::new("show-options").flag("-s").arg("command-alias"),
        Cmd::new("show-options").flag("-g").arg("default-shell"),
        Cmd::new("show-options").flag("-g").arg("default-command"),
        Cmd::new("show-options").flag("-g").arg("status"),
        Cmd::new("show-options").flag("-g").arg("lock-command"),
        Cmd::new("show-options").flag("-g").arg("lock-after-time"),
        Cmd::new("show-options")
            .flag("-gw")
            .arg("allow-passthrough"),
        Cmd::new("show-options").flag("-s").arg("set-clipboard"),
        Cmd::new("show-options")
            .flag("-g")
            .arg("update-environment"),
    ]
}

/// The baseline and whether drift was seen.
#[derive(Default)]
pub struct Drift {
    baseline: Mutex<Vec<String>>,
    tripped: Mutex<Option<String>>,
}

async fn snapshot(hub: &Hub) -> Result<Vec<String>, ToolError> {
    let replies = hub.run_many(&probes()).await?;
    Ok(replies
        .iter()
        .map(|r| {
            r.iter()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect())
}

impl Drift {
    /// Records the baseline (at start).
    pub async fn record(&self, hub: &Hub) -> Result<(), ToolError> {
        let s = snapshot(hub).await?;
        // Unset hooks are listed by name alone; a set one shows `name[N] command`.
        if let Some(h) = s[..3]
            .iter()
            .flat_map(|x| x.lines())
            .find(|l| l.contains('['))
        {
            return Err(ToolError::Drift(format!("a hook is set at start: {h}")));
        }
        *self.baseline.lock().unwrap_or_else(|p| p.into_inner()) = s;
        Ok(())
    }

    /// Why calls are refused, if they are.
    pub fn tripped(&self) -> Option<String> {
        self.tripped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Compares with the baseline; on a difference, trips for good.
    pub async fn check(&self, hub: &Hub) -> Result<(), ToolError> {
        if let Some(why) = self.tripped() {
            return Err(ToolError::Drift(why));
        }
        let now = snapshot(hub).await?;
        let base = self
            .baseline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (i, (a, b)) in base.iter().zip(&now).enumerate() {
            if a != b {
                let why = format!("`{}` changed from {a:?} to {b:?}", probes()[i].line());
                *self.tripped.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                return Err(ToolError::Drift(why));
            }
        }
        Ok(())
    }
}
