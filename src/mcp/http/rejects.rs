//! Requests refused before MCP sees them (no or a wrong token, a foreign
//! Host or Origin, a body over the cap, the session or request cap) and the
//! readiness probes: counted at once, and the refusals written to the audit
//! log as one aggregated record per [`FLUSH`] (and one at the end), with the
//! client addresses, so outsiders cannot spend the audit budget one request
//! at a time.

use crate::audit::{Audit, Entry};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

/// How often the aggregated record is written (when there was a refusal).
pub(crate) const FLUSH: Duration = Duration::from_secs(60);
/// Most client addresses one record lists; the rest are counted together.
const MAX_CLIENTS: usize = 32;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Why {
    /// No `Authorization: Bearer` header.
    NoToken,
    /// A token that is not this instance's.
    BadToken,
    /// A `Host` header that is not an allowed name.
    Host,
    /// An `Origin` header whose host is not an allowed name.
    Origin,
    /// A body over the cap.
    TooLarge,
    /// The session cap is reached.
    Sessions,
    /// The concurrent request (or connection) cap is reached.
    Busy,
    /// A path other than `/mcp` and `/healthz`.
    NotFound,
    /// An `Mcp-Session-Id` that is not visible ASCII (rmcp would take it
    /// for none and open a session past the cap).
    BadSession,
    /// A 2026-07-28 request whose `Mcp-Method`/`Mcp-Name`/`MCP-Protocol-Version`
    /// header is missing or does not match its body ([`super::headers`]).
    HeaderMismatch,
}

impl Why {
    fn name(self) -> &'static str {
        match self {
            Why::NoToken => "no_token",
            Why::BadToken => "bad_token",
            Why::Host => "host",
            Why::Origin => "origin",
            Why::TooLarge => "too_large",
            Why::Sessions => "sessions_full",
            Why::Busy => "busy",
            Why::NotFound => "not_found",
            Why::BadSession => "bad_session_id",
            Why::HeaderMismatch => "header_mismatch",
        }
    }
}

#[derive(Default)]
struct Window {
    by_reason: BTreeMap<Why, u64>,
    clients: BTreeMap<IpAddr, u64>,
    other_clients: u64,
}

/// The counters.
#[derive(Default)]
pub(crate) struct Rejects {
    window: Mutex<Window>,
    totals: Mutex<(BTreeMap<Why, u64>, u64)>,
}

impl Rejects {
    /// Counts one refusal from `ip`.
    pub(crate) fn count(&self, why: Why, ip: IpAddr) {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        *w.by_reason.entry(why).or_default() += 1;
        if w.clients.contains_key(&ip) || w.clients.len() < MAX_CLIENTS {
            *w.clients.entry(ip).or_default() += 1;
        } else {
            w.other_clients += 1;
        }
        drop(w);
        let mut t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        *t.0.entry(why).or_default() += 1;
    }

    /// Counts one readiness probe (never audited).
    pub(crate) fn probe(&self) {
        self.totals.lock().unwrap_or_else(|p| p.into_inner()).1 += 1;
    }

    /// Totals since start (the operator endpoint's status).
    pub(crate) fn totals(&self) -> Value {
        let t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let by: serde_json::Map<String, Value> =
            t.0.iter()
                .map(|(k, v)| (k.name().to_string(), json!(v)))
                .collect();
        json!({"rejected": by, "healthz": t.1})
    }

    /// Writes the window's record, if anything was refused, and starts a new one.
    pub(crate) fn flush(&self, audit: &Audit) {
        let w = std::mem::take(&mut *self.window.lock().unwrap_or_else(|p| p.into_inner()));
        if w.by_reason.is_empty() {
            return;
        }
        let by: serde_json::Map<String, Value> = w
            .by_reason
            .iter()
            .map(|(k, v)| (k.name().to_string(), json!(v)))
            .collect();
        let clients: serde_json::Map<String, Value> = w
            .clients
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        audit.record(Entry {
            tool: "(http-rejected)",
            toolset: None,
            outcome: "refused",
            error_type: Some("http_rejected"),
            duration_ms: 0,
            request_id: String::new(),
            client_id: None,
            http: None,
            trace: None,
            args: &json!({"by_reason": by, "clients": clients, "other_clients": w.other_clients}),
            checkpoint: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_beyond_the_cap_are_counted_together() {
        let r = Rejects::default();
        for i in 0..100u32 {
            r.count(Why::BadToken, IpAddr::from(i.to_be_bytes()));
        }
        let w = r.window.lock().unwrap();
        assert_eq!(w.clients.len(), MAX_CLIENTS);
        assert_eq!(w.other_clients, 100 - MAX_CLIENTS as u64);
        assert_eq!(w.by_reason[&Why::BadToken], 100);
    }
}
