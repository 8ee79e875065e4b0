//! The proxy's decisions in the audit log (`serve`): one record per
//! decision — tool `(proxy)`, outcome `event`, `error_type`
//! `proxy_allowed` or `proxy_denied`, `args` with the name, port, method,
//! address, reason, bytes and duration — up to [`PER_INTERVAL`] records per
//! [`INTERVAL`]; past that, decisions are counted per name and verdict and
//! written as one summary record when the interval ends (`args.aggregated:
//! true`, the decisions, the distinct names and the [`TOP`] most frequent).
//! All of them share an eighth of the audit budget ([`Audit::proxy`]):
//! past it decisions are only counted (`proxy_unrecorded` in the seal), so
//! a flood from a pane can crowd out neither tool calls nor sandmux's
//! events. At the stop, connections still open are one record
//! (`args.open_at_stop`).

use crate::audit::{Audit, Entry};
use crate::proxy::refusals::Refusals;
use crate::proxy::tally::{self, Tally};
use crate::proxy::{Config, Event, Sink};
use crate::term::printable;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tool name of the records this writes.
pub(crate) const TOOL: &str = "(proxy)";
/// Records written one by one per interval.
pub(crate) const PER_INTERVAL: usize = 32;
/// Names a summary record lists.
pub(crate) const TOP: usize = 5;
/// The aggregation interval.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    written: usize,
    pending: Tally,
}

/// Where the decisions are counted besides (the protocol's metrics,
/// `mcp::metrics`, implement it).
pub(crate) trait Counts: Send + Sync {
    /// One decision, with the bytes of its ended connection.
    fn decision(&self, allowed: bool, up: u64, down: u64);
    /// The count of connections open, once the proxy serves.
    fn open(&self, open: Arc<AtomicUsize>);
}

/// The decisions on their way to the audit log.
pub(crate) struct Flood {
    state: Mutex<State>,
    counts: &'static dyn Counts,
    /// The last refusals, for the agent (`sandbox_status`, `run_command`).
    pub(crate) refusals: Arc<Refusals>,
    audit: Arc<Audit>,
    open: Arc<AtomicUsize>,
}

impl Flood {
    /// Decisions for `audit`, counted in `counts`.
    pub(crate) fn new(audit: Arc<Audit>, counts: &'static dyn Counts) -> Arc<Flood> {
        Arc::new(Flood {
            state: Mutex::default(),
            counts,
            refusals: Arc::default(),
            audit,
            open: Arc::default(),
        })
    }

    fn add(&self, ev: Event) {
        self.counts
            .decision(ev.denied.is_none(), ev.bytes_up, ev.bytes_down);
        self.refusals.add(&ev);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.written < PER_INTERVAL || ev.exfiltration {
            s.written += 1;
            drop(s);
            write_one(&self.audit, &ev);
        } else {
            s.pending.add(&ev);
        }
    }

    /// At the stop: what was aggregated, and how many connections were
    /// still open (their records never come).
    pub(crate) fn finish(&self) {
        self.flush();
        let open = self.open.load(Ordering::Relaxed);
        if open > 0 {
            write(&self.audit, true, json!({"open_at_stop": open}), 0);
        }
    }

    /// Writes what was aggregated (each interval, and once more at the end).
    pub(crate) fn flush(&self) {
        let pending = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.written = 0;
            s.pending.take()
        };
        if pending.is_empty() {
            return;
        }
        let args = summary(&pending);
        let ok = args["denied"] == 0;
        write(&self.audit, ok, args, 0);
    }

    /// Starts serving `listener` on the current runtime (after confinement,
    /// so its tasks are confined too).
    pub(crate) fn start(
        self: &Arc<Flood>,
        listener: std::net::TcpListener,
        cfg: Config,
        hooks: crate::proxy::ask::Hooks,
    ) {
        let me = self.clone();
        let sink: Sink = Arc::new(move |ev: Event| me.add(ev));
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                let open = self.open.clone();
                self.counts.open(open.clone());
                tokio::spawn(crate::proxy::serve(l, Arc::new(cfg), sink, open, hooks));
            }
            Err(e) => tracing::error!("the proxy's listener: {e}"),
        }
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(INTERVAL).await;
                me.flush();
            }
        });
    }
}

/// One record for an interval's aggregated decisions.
fn summary(pending: &std::collections::BTreeMap<tally::Key, tally::Count>) -> serde_json::Value {
    let (mut allowed, mut denied, mut up, mut down) = (0u64, 0u64, 0u64, 0u64);
    for ((_, ok), c) in pending {
        *(if *ok { &mut allowed } else { &mut denied }) += c.n;
        up += c.up;
        down += c.down;
    }
    let mut by_count: Vec<_> = pending.iter().collect();
    by_count.sort_by_key(|e| std::cmp::Reverse(e.1.n));
    let top: Vec<_> = by_count
        .iter()
        .take(TOP)
        .map(|((name, ok), c)| json!({"name": printable(name), "allowed": ok, "count": c.n}))
        .collect();
    json!({
        "aggregated": true,
        "interval_s": INTERVAL.as_secs(),
        "allowed": allowed,
        "denied": denied,
        "names": pending.len(),
        "top": top,
        "bytes_up": up,
        "bytes_down": down,
    })
}

fn write_one(audit: &Audit, ev: &Event) {
    let args = json!({
        "name": printable(&tally::label(ev)),
        "method": printable(&ev.method),
        "address": ev.address.map(|a| a.to_string()),
        "reason": ev.denied.as_deref().map(printable),
        "bytes_up": ev.bytes_up,
        "bytes_down": ev.bytes_down,
    });
    let mut args = args;
    if let Some(n) = ev.requests {
        args["intercepted_requests"] = n.into();
    }
    if ev.exfiltration {
        // Never aggregated: an attempt is always its own record.
        args["exfiltration"] = true.into();
        audit.proxy(
            Entry::event(TOOL, Some("proxy_exfiltration"), &args)
                .took(ev.duration.as_millis() as u64),
        );
        return;
    }
    write(
        audit,
        ev.denied.is_none(),
        args,
        ev.duration.as_millis() as u64,
    );
}

fn write(audit: &Audit, ok: bool, args: serde_json::Value, ms: u64) {
    audit.proxy(
        Entry::event(
            TOOL,
            Some(if ok { "proxy_allowed" } else { "proxy_denied" }),
            &args,
        )
        .took(ms),
    );
}
