//! A checkpoint of the workspace after each call that can change it
//! (`supervisor::history`): its number and digest go into the call's
//! audit record, so the chain says which call made which change.

use super::Server;
use crate::mcp::catalog::{Class, ToolDef};
use crate::supervisor::history::Cause;
use serde_json::{json, Value};

impl Server {
    /// Takes the checkpoint after `def`'s call (None: a reading tool, or
    /// no history); a checkpoint that fails is named as failed.
    pub(super) async fn checkpoint(
        &self,
        def: &ToolDef,
        tool: &str,
        request_id: &str,
        args: &Value,
    ) -> Option<Value> {
        if matches!(def.class, Class::MetadataRead | Class::ContentRead) {
            return None;
        }
        let h = self.s.history.clone()?;
        let cause = Cause {
            tool: tool.to_string(),
            request_id: request_id.to_string(),
            args: self.s.audit.redacted(args),
        };
        let taken = tokio::task::spawn_blocking(move || {
            h.lock().unwrap_or_else(|p| p.into_inner()).take(&cause)
        })
        .await;
        match taken {
            Ok(Ok(line)) => Some(json!({"n": line.n, "digest": line.digest})),
            Ok(Err(e)) => {
                tracing::warn!("the workspace's checkpoint: {e}");
                Some(json!({"error": crate::term::printable(&e.to_string())}))
            }
            Err(_) => None,
        }
    }
}
