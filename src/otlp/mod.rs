//! OTLP span export (`serve --otlp-endpoint URL`, or the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`):
//! one span per audited call made under a caller's sampled W3C trace
//! context, with the caller's trace id, its span as the parent, and the
//! span id the audit record carries, so a collector's spans and the audit
//! log join on them. OpenTelemetry's own exporter encodes the protobuf
//! (`opentelemetry-otlp`, OTLP/HTTP); it sends through [`client`], which
//! dials only the address resolved at start.
//!
//! Off unless configured, and then free: no task, no queue, and a call
//! costs one `OnceLock` load. On, a call's span is queued without blocking
//! (a bounded queue: when full the span is dropped and counted), and one
//! task of the server's runtime sends batches. Export failures never fail
//! a call: they are counted and logged once (until an export works again).

mod client;
mod config;

pub(crate) use config::{Config, ConfigError};

use crate::tracectx::TraceContext;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

/// Spans waiting to be sent, at most; past it they are dropped (counted).
pub(crate) const QUEUE_CAP: usize = 2048;
/// Spans sent in one request, at most.
const BATCH_MAX: usize = 512;
/// How long a batch waits for more spans after its first (a call costs
/// one queue push; a busy client's spans go in one request a second).
const BATCH_WAIT: Duration = Duration::from_secs(1);
/// How long the end of `serve` waits for queued spans to be sent.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

struct Otlp {
    tx: mpsc::Sender<SpanData>,
    /// The queue's other end and the exporter, until [`start`] takes them.
    parts: Mutex<Option<(mpsc::Receiver<SpanData>, opentelemetry_otlp::SpanExporter)>>,
    /// The collector's port (the supervisor's Landlock rule).
    port: u16,
    /// The traces URL (named when export fails).
    url: String,
    instance: OnceLock<std::sync::Arc<str>>,
    /// Spans queued, ever (a flush waits until all are accounted for).
    queued: AtomicU64,
    /// Wakes the sending task to send what it holds now (a flush).
    now: tokio::sync::Notify,
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    /// Whether the last export failed (it is logged once, until one works).
    failing: AtomicBool,
}

static OTLP: OnceLock<Otlp> = OnceLock::new();

/// Turns export on (once, at start-up, before confinement): the exporter
/// is built now, its task starts with the runtime ([`start`]).
pub(crate) fn configure(c: Config) -> Result<(), ConfigError> {
    use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
    let port = c.addr.port();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client::Pinned::new(c.addr, c.host.clone()))
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(c.url.clone())
        .with_timeout(client::TIMEOUT)
        // One attempt per batch: the crate's retries sleep with
        // `std::thread::sleep` (no `tokio` feature), which would stop
        // serve's one runtime thread, calls and the proxy included, for up
        // to a collector's `Retry-After`. A failed batch is counted.
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| ConfigError::Exporter(e.to_string()))?;
    exporter.set_resource(
        &opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("sandmux")
            .build(),
    );
    let (tx, rx) = mpsc::channel(QUEUE_CAP);
    let o = Otlp {
        tx,
        parts: Mutex::new(Some((rx, exporter))),
        port,
        url: c.url.clone(),
        instance: OnceLock::new(),
        queued: AtomicU64::new(0),
        now: tokio::sync::Notify::new(),
        exported: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        failing: AtomicBool::new(false),
    };
    OTLP.set(o).map_err(|_| ConfigError::Twice)?;
    tracing::info!(endpoint = %c.url, address = %c.addr, "OTLP span export on");
    Ok(())
}

/// The collector's TCP port, when export is on: the one port the
/// supervisor's Landlock rules add for it.
pub(crate) fn port() -> Option<u16> {
    OTLP.get().map(|o| o.port)
}

/// Starts the sending task on `rt` (confined: it runs on the runtime's
/// threads) for instance `id`. Nothing when export is off.
pub(crate) fn start(rt: &tokio::runtime::Runtime, id: &str) {
    let Some(o) = OTLP.get() else { return };
    let _ = o.instance.set(id.into());
    let Some((rx, exporter)) = o.parts.lock().ok().and_then(|mut p| p.take()) else {
        return;
    };
    rt.spawn(send_loop(o, rx, exporter));
}

async fn send_loop(
    o: &'static Otlp,
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
) {
    let mut batch = Vec::with_capacity(BATCH_MAX);
    while rx.recv_many(&mut batch, BATCH_MAX).await > 0 {
        let until = tokio::time::Instant::now() + BATCH_WAIT;
        while batch.len() < BATCH_MAX {
            let room = BATCH_MAX - batch.len();
            let more = rx.recv_many(&mut batch, room);
            tokio::select! {
                n = more => if n == 0 { break },
                _ = tokio::time::sleep_until(until) => break,
                _ = o.now.notified() => break,
            }
        }
        let n = batch.len() as u64;
        match exporter.export(std::mem::take(&mut batch)).await {
            Ok(()) => {
                o.exported.fetch_add(n, Relaxed);
                if o.failing.swap(false, Relaxed) {
                    tracing::info!("OTLP export works again");
                }
            }
            Err(e) => {
                o.failed.fetch_add(n, Relaxed);
                if !o.failing.swap(true, Relaxed) {
                    let why = crate::term::printable(&e.to_string());
                    tracing::warn!(
                        "OTLP export to {} failed ({why}); spans are counted in sandmux_otlp_spans_total{{result=\"failed\"}} until it works again: check that the collector listens there",
                        o.url
                    );
                }
            }
        }
    }
}

/// At the end of `serve`: sends what is queued, waiting at most
/// [`FLUSH_WAIT`] (a collector that does not answer delays the end by no
/// more). Nothing when export is off.
pub(crate) fn flush(rt: &tokio::runtime::Runtime) {
    let Some(o) = OTLP.get() else { return };
    let done = || o.exported.load(Relaxed) + o.failed.load(Relaxed) >= o.queued.load(Relaxed);
    rt.block_on(async {
        let end = tokio::time::Instant::now() + FLUSH_WAIT;
        while !done() && tokio::time::Instant::now() < end {
            o.now.notify_one();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// What the audit record of a traced call says, for its span.
pub(crate) struct Call<'a> {
    pub trace: &'a TraceContext,
    /// The catalogue's name, when `known`; else the request's class.
    pub tool: &'a str,
    /// Whether `tool` is a catalogue tool (else it was spelled by the
    /// client, and only its class is exported).
    pub known: bool,
    pub outcome: &'a str,
    pub error_type: Option<&'a str>,
    pub duration: Duration,
    /// The audit record's `seq` (none when it was not written).
    pub seq: Option<u64>,
}

/// Queues the span of an audited call (without blocking). Nothing when
/// export is off or the caller's trace is not sampled.
pub(crate) fn span(c: Call<'_>) {
    let Some(o) = OTLP.get() else { return };
    if !c.trace.sampled() {
        return;
    }
    match o.tx.try_send(span_data(o, &c)) {
        Ok(()) => o.queued.fetch_add(1, Relaxed),
        Err(_) => o.dropped.fetch_add(1, Relaxed),
    };
}

/// A name sandmux chose: a catalogue tool, else what the request was.
fn name_of(c: &Call<'_>) -> Cow<'static, str> {
    match c.tool {
        t if c.known => Cow::Owned(t.to_string()),
        t if t.starts_with("resource:") => Cow::Borrowed("(resource)"),
        t if t.starts_with("prompt:") => Cow::Borrowed("(prompt)"),
        _ => Cow::Borrowed("(unknown)"),
    }
}

fn span_data(o: &Otlp, c: &Call<'_>) -> SpanData {
    let end = SystemTime::now();
    let name = name_of(c);
    let t = c.trace;
    let mut attributes = vec![
        KeyValue::new("sandmux.tool", name.clone()),
        KeyValue::new("sandmux.outcome", c.outcome.to_string()),
        KeyValue::new(
            "sandmux.instance",
            o.instance.get().cloned().unwrap_or_else(|| "".into()),
        ),
    ];
    if let Some(s) = c.seq {
        attributes.push(KeyValue::new("sandmux.audit.seq", s as i64));
    }
    if let Some(k) = c.error_type {
        attributes.push(KeyValue::new("sandmux.error_type", k.to_string()));
    }
    let state = t.state().and_then(|s| s.parse().ok()).unwrap_or_default();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(t.trace_bytes()),
            SpanId::from_bytes(t.span_bytes()),
            TraceFlags::SAMPLED,
            false,
            state,
        ),
        parent_span_id: SpanId::from_bytes(t.parent_bytes()),
        parent_span_is_remote: true,
        span_kind: SpanKind::Server,
        name,
        start_time: end.checked_sub(c.duration).unwrap_or(end),
        end_time: end,
        attributes,
        dropped_attributes_count: 0,
        events: Default::default(),
        links: Default::default(),
        status: match c.outcome {
            "ok" => Status::Unset,
            other => Status::error(other.to_string()),
        },
        instrumentation_scope: InstrumentationScope::builder("sandmux")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

/// The export's counters in Prometheus text (nothing when export is off).
pub(crate) fn render(out: &mut String) {
    let Some(o) = OTLP.get() else { return };
    let _ = writeln!(
        out,
        "# HELP sandmux_otlp_spans_total Spans of traced calls for the OTLP collector, by what became of them.\n# TYPE sandmux_otlp_spans_total counter"
    );
    for (r, c) in [
        ("exported", &o.exported),
        ("dropped", &o.dropped),
        ("failed", &o.failed),
    ] {
        let _ = writeln!(
            out,
            "sandmux_otlp_spans_total{{result=\"{r}\"}} {}",
            c.load(Relaxed)
        );
    }
}
