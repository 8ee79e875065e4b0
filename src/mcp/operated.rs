//! What the runtime asks of the protocol: for the operator endpoint
//! ([`crate::runtime::endpoint::Protocol`]) the catalog a `revoke`/`grant`
//! names tools from, the enabled set it changes, the clients told of it,
//! `--http`'s token and the metrics; for the proxy's decisions
//! ([`crate::runtime::proxy::Counts`]) the metrics that count them.

use super::catalog::{toolset_named, toolset_names, TOOLS, TOOLSETS};
use super::ctx::State;
use crate::runtime::endpoint::{Protocol, Request, Surface};
use crate::runtime::shared::Shared;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;

impl Protocol for State {
    fn shared(&self) -> &Arc<Shared> {
        &self.rt
    }

    fn surface(&self) -> Surface {
        let enabled = self.enabled.read().map(|e| e.clone()).unwrap_or_default();
        let toolsets = TOOLSETS
            .iter()
            .filter(|(ts, _)| {
                TOOLS
                    .iter()
                    .any(|t| t.toolset == *ts && enabled.contains(t.name))
            })
            .map(|(_, n)| *n)
            .collect();
        Surface {
            toolsets,
            enabled: enabled.len(),
            ceiling: self.ceiling.len(),
            clients: self.peers.connected(),
            http: self.http.get().map(|h| h.status()),
            drift: self.drift.tripped(),
        }
    }

    fn selected(&self, r: &Request) -> Result<BTreeSet<&'static str>, String> {
        if r.all {
            return Ok(TOOLS.iter().map(|t| t.name).collect());
        }
        if let Some(ts) = &r.toolset {
            let ts = toolset_named(ts)
                .ok_or_else(|| format!("unknown toolset {ts:?}; valid: {}", toolset_names()))?;
            return Ok(TOOLS
                .iter()
                .filter(|t| t.toolset == ts)
                .map(|t| t.name)
                .collect());
        }
        if let Some(t) = &r.tool {
            return TOOLS
                .iter()
                .find(|d| d.name == t)
                .map(|d| [d.name].into())
                .ok_or_else(|| format!("unknown tool {t:?}"));
        }
        Err("name --toolset, --tool or --all".into())
    }

    fn set_enabled(
        &self,
        names: &BTreeSet<&'static str>,
        grant: bool,
    ) -> Result<Vec<&'static str>, String> {
        let mut refused = Vec::new();
        let Ok(mut en) = self.enabled.write() else {
            return Err("state poisoned".into());
        };
        for n in names {
            if !grant {
                en.remove(n);
            } else if self.ceiling.contains(n) {
                en.insert(n);
            } else {
                refused.push(*n);
            }
        }
        Ok(refused)
    }

    async fn tools_changed(&self) {
        self.peers.tools_changed().await
    }

    fn metrics(&self) -> Value {
        super::metrics::answer(self)
    }

    fn set_token(&self, token: &[u8], uid: u32) -> Value {
        super::http::router::set_token(self, token, uid)
    }
}

impl crate::runtime::proxy::Counts for super::metrics::Metrics {
    fn decision(&self, allowed: bool, up: u64, down: u64) {
        self.proxy(allowed, up, down)
    }

    fn open(&self, open: Arc<std::sync::atomic::AtomicUsize>) {
        self.proxy_open(open)
    }
}
