//! Metrics in the Prometheus text exposition format (version 0.0.4), for
//! `GET /metrics` on `serve --http` and `sandmux metrics ID` (the operator
//! endpoint). Counters are atomics in fixed arrays, one slot per tool of
//! the catalogue (plus unknown names, resource reads and prompts): a call
//! adds to them without a lock or an allocation, and every label value is
//! one sandmux chose (a tool of the catalogue, an outcome, an error kind,
//! an operator's credential name), never one the agent or client spelled.
//! Gauges (questions open, audit bytes left, proxy connections open) are
//! read from the instance's state when the text is made.

use super::catalog::{ToolDef, TOOLS};
use super::ctx::State;
use serde_json::Value;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The content type of the text.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Audit outcomes counted (`Entry::outcome`), in label order.
const OUTCOMES: [&str; 4] = ["ok", "error", "refused", "malformed"];
/// Error kinds a refusal may have (`ToolError::kind`); others count as `other`.
const KINDS: [&str; 12] = [
    "refused",
    "audit_unavailable",
    "drift",
    "limit_reached",
    "frozen",
    "invalid_argument",
    "not_found",
    "timeout",
    "server_gone",
    "tmux_error",
    "internal",
    "other",
];
/// Upper bounds of the latency buckets, in seconds (waits may last minutes).
const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Slots past the catalogue's: a name it does not know, a resource read, a prompt.
const EXTRA: [&str; 3] = ["(unknown)", "(resource)", "(prompt)"];

/// The counters of this process (one `serve`, one instance).
pub(crate) struct Metrics {
    /// Per slot and outcome.
    calls: Box<[AtomicU64]>,
    /// Per slot: each bucket's own count (not cumulative), then `+Inf`'s.
    buckets: Box<[AtomicU64]>,
    /// Per slot: microseconds.
    sum_us: Box<[AtomicU64]>,
    /// Per refusal kind.
    refusals: [AtomicU64; KINDS.len()],
    proxy_allowed: AtomicU64,
    proxy_denied: AtomicU64,
    proxy_up: AtomicU64,
    proxy_down: AtomicU64,
    /// The proxy's connections being served, once it runs.
    proxy_open: OnceLock<Arc<AtomicUsize>>,
}

fn zeros(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// The process's counters.
pub(crate) fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let slots = TOOLS.len() + EXTRA.len();
        Metrics {
            calls: zeros(slots * OUTCOMES.len()),
            buckets: zeros(slots * (BUCKETS.len() + 1)),
            sum_us: zeros(slots),
            refusals: Default::default(),
            proxy_allowed: AtomicU64::new(0),
            proxy_denied: AtomicU64::new(0),
            proxy_up: AtomicU64::new(0),
            proxy_down: AtomicU64::new(0),
            proxy_open: OnceLock::new(),
        }
    })
}

/// The slot of a call: its tool in the catalogue, else what it is.
fn slot(def: Option<&'static ToolDef>, name: &str) -> usize {
    let known = def
        .and_then(|d| TOOLS.iter().position(|t| std::ptr::eq(t, d)))
        .or_else(|| TOOLS.iter().position(|t| t.name == name));
    known.unwrap_or_else(|| {
        TOOLS.len()
            + if name.starts_with("resource:") {
                1
            } else if name.starts_with("prompt:") {
                2
            } else {
                0
            }
    })
}

fn slot_name(i: usize) -> &'static str {
    TOOLS
        .get(i)
        .map_or_else(|| EXTRA[i - TOOLS.len()], |t| t.name)
}

impl Metrics {
    /// Counts one request (a tool call, a resource read, a prompt) with its
    /// audit outcome, error kind and time taken.
    pub(crate) fn call(
        &self,
        def: Option<&'static ToolDef>,
        name: &str,
        outcome: &str,
        kind: Option<&str>,
        took: Duration,
    ) {
        let s = slot(def, name);
        if let Some(o) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.calls[s * OUTCOMES.len() + o].fetch_add(1, Relaxed);
        }
        if outcome == "refused" {
            let k = kind
                .and_then(|k| KINDS.iter().position(|x| *x == k))
                .unwrap_or(KINDS.len() - 1);
            self.refusals[k].fetch_add(1, Relaxed);
        }
        let secs = took.as_secs_f64();
        let b = BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(BUCKETS.len());
        self.buckets[s * (BUCKETS.len() + 1) + b].fetch_add(1, Relaxed);
        self.sum_us[s].fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// Counts one decision of the proxy.
    pub(crate) fn proxy(&self, allowed: bool, up: u64, down: u64) {
        let c = if allowed {
            &self.proxy_allowed
        } else {
            &self.proxy_denied
        };
        c.fetch_add(1, Relaxed);
        self.proxy_up.fetch_add(up, Relaxed);
        self.proxy_down.fetch_add(down, Relaxed);
    }

    /// The proxy's count of connections open (once it serves).
    pub(crate) fn proxy_open(&self, open: Arc<AtomicUsize>) {
        let _ = self.proxy_open.set(open);
    }
}

/// A label value as the format quotes it; control characters (none of the
/// values sandmux uses has any) become `?`.
fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c if c.is_control() => s.push('?'),
            c => s.push(c),
        }
    }
    s
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The text for a scrape.
pub(crate) fn render(s: &State) -> String {
    let m = get();
    let mut out = String::with_capacity(8192);
    let version = env!("CARGO_PKG_VERSION");
    head(
        &mut out,
        "sandmux_info",
        "gauge",
        "The sandmux version serving this instance.",
    );
    let _ = writeln!(out, "sandmux_info{{version=\"{version}\"}} 1");
    calls(&mut out, m);
    head(
        &mut out,
        "sandmux_refusals_total",
        "counter",
        "Requests refused, by the refusal's kind.",
    );
    for (k, c) in KINDS.iter().zip(&m.refusals) {
        let _ = writeln!(
            out,
            "sandmux_refusals_total{{kind=\"{k}\"}} {}",
            c.load(Relaxed)
        );
    }
    state(&mut out, s, m);
    crate::otlp::render(&mut out);
    layer(&mut out);
    out
}

/// The copy-on-write layer's size at the bound watcher's last measure
/// (`supervisor::bound`; nothing before it, or without a layer).
fn layer(out: &mut String) {
    let Some((bytes, files)) = crate::supervisor::bound::last() else {
        return;
    };
    head(
        out,
        "sandmux_layer_bytes",
        "gauge",
        "Bytes the copy-on-write layer holds (measured every 1-30 s).",
    );
    let _ = writeln!(out, "sandmux_layer_bytes {bytes}");
    head(
        out,
        "sandmux_layer_files",
        "gauge",
        "Entries the copy-on-write layer holds (measured every 1-30 s).",
    );
    let _ = writeln!(out, "sandmux_layer_files {files}");
}

/// Calls by tool and outcome, and their latency histograms; a tool never
/// called has no series.
fn calls(out: &mut String, m: &Metrics) {
    let slots = TOOLS.len() + EXTRA.len();
    let per = BUCKETS.len() + 1;
    let used: Vec<usize> = (0..slots)
        .filter(|s| {
            m.buckets[s * per..(s + 1) * per]
                .iter()
                .any(|b| b.load(Relaxed) > 0)
        })
        .collect();
    let name = "sandmux_tool_calls_total";
    head(
        out,
        name,
        "counter",
        "Tool calls (and resource reads, prompts), by tool and audit outcome.",
    );
    for &s in &used {
        for (o, outcome) in OUTCOMES.iter().enumerate() {
            let v = m.calls[s * OUTCOMES.len() + o].load(Relaxed);
            let _ = writeln!(
                out,
                "{name}{{tool=\"{}\",outcome=\"{outcome}\"}} {v}",
                slot_name(s)
            );
        }
    }
    let name = "sandmux_tool_call_duration_seconds";
    head(
        out,
        name,
        "histogram",
        "Time from a request's arrival to its audit record, by tool.",
    );
    for &s in &used {
        let tool = slot_name(s);
        let mut cum = 0u64;
        for (b, le) in BUCKETS
            .iter()
            .map(|b| b.to_string())
            .chain(["+Inf".into()])
            .enumerate()
        {
            cum += m.buckets[s * per + b].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{tool=\"{tool}\",le=\"{le}\"}} {cum}");
        }
        let sum = m.sum_us[s].load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{tool=\"{tool}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{tool=\"{tool}\"}} {cum}");
    }
}

/// What the instance's state says now: questions, audit room, proxy,
/// credentials, HTTP refusals.
fn state(out: &mut String, s: &State, m: &Metrics) {
    let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
        head(out, name, "gauge", help);
        let _ = writeln!(out, "{name} {v}");
    };
    let open = s.approvals.open_count() as u64;
    gauge(
        out,
        "sandmux_approval_questions_open",
        "Questions waiting for a human's answer.",
        open,
    );
    let enabled = s.enabled.read().map(|e| e.len()).unwrap_or(0) as u64;
    gauge(out, "sandmux_tools_enabled", "Tools enabled now.", enabled);
    let left = s.audit.bytes_left();
    gauge(
        out,
        "sandmux_audit_bytes_left",
        "Bytes left in this instance's audit budget ([mcp] audit_max_bytes).",
        left,
    );
    let ok = u64::from(s.audit.status()["state"] == "ok");
    gauge(
        out,
        "sandmux_audit_ok",
        "1 while audit records can be written (else calls are refused).",
        ok,
    );
    proxy(out, m);
    credentials(out, s);
    rejected(out, s);
}

/// The allowlist proxy's connections and bytes.
fn proxy(out: &mut String, m: &Metrics) {
    head(
        out,
        "sandmux_proxy_connections_total",
        "counter",
        "Connections the allowlist proxy decided, by verdict.",
    );
    for (v, c) in [("allowed", &m.proxy_allowed), ("denied", &m.proxy_denied)] {
        let _ = writeln!(
            out,
            "sandmux_proxy_connections_total{{verdict=\"{v}\"}} {}",
            c.load(Relaxed)
        );
    }
    head(
        out,
        "sandmux_proxy_bytes_total",
        "counter",
        "Bytes through the proxy's ended connections, by direction.",
    );
    for (d, c) in [("up", &m.proxy_up), ("down", &m.proxy_down)] {
        let _ = writeln!(
            out,
            "sandmux_proxy_bytes_total{{direction=\"{d}\"}} {}",
            c.load(Relaxed)
        );
    }
    let open = m.proxy_open.get().map_or(0, |o| o.load(Relaxed)) as u64;
    head(
        out,
        "sandmux_proxy_connections_open",
        "gauge",
        "Connections the proxy serves now.",
    );
    let _ = writeln!(out, "sandmux_proxy_connections_open {open}");
}

/// `--http`'s refusals before MCP, by reason.
fn rejected(out: &mut String, s: &State) {
    if let Some(h) = s.http.get() {
        let name = "sandmux_http_rejected_total";
        head(
            out,
            name,
            "counter",
            "HTTP requests refused before MCP, by reason.",
        );
        if let Some(by) = h.status()["rejected"].as_object() {
            for (why, n) in by {
                let _ = writeln!(
                    out,
                    "{name}{{reason=\"{}\"}} {}",
                    label(why),
                    n.as_u64().unwrap_or(0)
                );
            }
        }
    }
}

/// Uses and refused exfiltrations per credential (`[[credentials]]`; the
/// operator's names).
fn credentials(out: &mut String, s: &State) {
    let Some(v) = &s.vault else { return };
    let all = v.status();
    let list = all.as_array().map(Vec::as_slice).unwrap_or_default();
    for (name, key, help) in [
        (
            "sandmux_credential_uses_total",
            "times_used",
            "Requests the proxy put a credential into.",
        ),
        (
            "sandmux_credential_exfiltration_refused_total",
            "exfiltration_refused",
            "Requests refused for carrying a credential's value.",
        ),
    ] {
        head(out, name, "counter", help);
        for c in list {
            let cred = label(c["name"].as_str().unwrap_or_default());
            let n = c[key].as_u64().unwrap_or(0);
            let _ = writeln!(out, "{name}{{credential=\"{cred}\"}} {n}");
        }
    }
}

/// The endpoint's answer to `metrics`.
pub(crate) fn answer(s: &State) -> Value {
    serde_json::json!({"ok": true, "text": render(s)})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_catalogue_then_what_it_does_not_know() {
        let d = TOOLS.iter().find(|t| t.name == "list_panes").unwrap();
        assert_eq!(slot_name(slot(Some(d), "x")), "list_panes");
        assert_eq!(slot_name(slot(None, "list_panes")), "list_panes");
        assert_eq!(slot_name(slot(None, "rm -rf /")), "(unknown)");
        assert_eq!(slot_name(slot(None, "resource:sandmux://x")), "(resource)");
        assert_eq!(slot_name(slot(None, "prompt:p")), "(prompt)");
    }

    #[test]
    fn latency_lands_in_its_bucket_and_the_sum() {
        let m = get();
        let s = slot(None, "prompt:t");
        let per = BUCKETS.len() + 1;
        let before: Vec<u64> = (0..per)
            .map(|b| m.buckets[s * per + b].load(Relaxed))
            .collect();
        m.call(
            None,
            "prompt:t",
            "refused",
            Some("drift"),
            Duration::from_millis(3),
        );
        m.call(None, "prompt:t", "ok", None, Duration::from_secs(1000));
        let after: Vec<u64> = (0..per)
            .map(|b| m.buckets[s * per + b].load(Relaxed))
            .collect();
        assert_eq!(after[2] - before[2], 1, "3 ms is under 5 ms");
        assert_eq!(
            after[per - 1] - before[per - 1],
            1,
            "past the last bound: +Inf"
        );
    }

    #[test]
    fn label_values_are_quoted_and_carry_no_control() {
        assert_eq!(label("a\"b\\c\nd\u{1b}e"), "a\\\"b\\\\c\\nd?e");
    }
}
