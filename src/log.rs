//! Diagnostics: `tracing` events, one subscriber set up by `main` for the
//! processes outside the sandbox (the supervisor and the process that
//! starts a sandbox). Nothing inside the sandbox installs one: `__init`
//! learns its level from the plan ([`crate::sandbox::Plan::log`]) and sends
//! its notes over the report pipe, and the pane gate writes only what the
//! agent's pane is meant to show.
//!
//! Levels come from `SANDMUX_LOG` (env-filter syntax, default `info`: the
//! messages sandmux always printed). Events go to stderr only, never
//! stdout (`serve`'s stdout is the MCP channel), as `sandmux: ` lines or,
//! with `--log-format json`, as JSON lines. Only sandmux's own events are
//! written, whatever the filter says: a dependency's events (the MCP SDK
//! logs whole messages at debug) could carry a tool call's secret
//! arguments. Every field value is escaped as [`crate::term`] escapes text
//! for a terminal, so agent-chosen strings cannot act on it; the JSON form
//! escapes the same characters as `\uXXXX`.

use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::OnceLock;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Microseconds on the monotonic clock, which every process of the host
/// shares: `__init`'s notes and the supervisor's steps line up, and a
/// benchmark's own clock too (`bench/start-steps`).
pub(crate) fn mono_us() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}

/// A start-up step reached (trace level, target `sandmux::steps`), with
/// its time on the monotonic clock as `at_us`; nothing is read unless the
/// level is on.
pub(crate) fn step(what: &'static str) {
    tracing::trace!(target: "sandmux::steps", at_us = mono_us(), "{what}");
}

/// The variable that sets the levels (env-filter syntax).
pub(crate) const ENV: &str = "SANDMUX_LOG";
/// The filter without `SANDMUX_LOG`: what sandmux always printed.
pub(crate) const DEFAULT: &str = "info";

/// How events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum Format {
    /// `sandmux: message key=value` lines for a human.
    #[default]
    Text,
    /// One JSON object per line (containers, clusters).
    Json,
}

/// This process's instance, added to every event once known.
static INSTANCE: OnceLock<String> = OnceLock::new();

/// The format [`init`] installed, for the helper processes `serve` starts.
static FORMAT: OnceLock<Format> = OnceLock::new();

/// The format in use (text if none was installed).
pub(crate) fn format() -> Format {
    FORMAT.get().copied().unwrap_or_default()
}

/// Names this process's instance in every later event.
pub(crate) fn set_instance(id: &str) {
    let _ = INSTANCE.set(id.to_string());
}

/// Why the log could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// `SANDMUX_LOG` does not parse; `shown` is its value, escaped.
    #[error("{ENV}={shown}: {source}")]
    Filter {
        shown: String,
        source: tracing_subscriber::filter::ParseError,
    },
    /// `SANDMUX_LOG` is not Unicode.
    #[error("{ENV}: {0}")]
    Var(#[source] std::env::VarError),
    /// A subscriber was installed already.
    #[error("{0}")]
    Installed(#[source] tracing_subscriber::util::TryInitError),
}

/// Installs the subscriber: levels from `SANDMUX_LOG`, writing to stderr.
/// An unparseable `SANDMUX_LOG` is an error (nothing is guessed).
pub(crate) fn init(format: Format) -> Result<(), LogError> {
    let filter = match std::env::var(ENV) {
        Ok(s) => EnvFilter::builder()
            .parse(&s)
            .map_err(|source| LogError::Filter {
                shown: crate::term::printable(&s),
                source,
            })?,
        Err(std::env::VarError::NotPresent) => EnvFilter::new(DEFAULT),
        Err(e) => return Err(LogError::Var(e)),
    };
    let _ = FORMAT.set(format);
    tracing_subscriber::registry()
        .with(filter)
        .with(Stderr { format })
        .try_init()
        .map_err(LogError::Installed)
}

/// The most verbose level enabled for `__init`'s notes, for the plan.
pub(crate) fn init_level() -> String {
    let enabled = [
        (
            Level::TRACE,
            tracing::enabled!(target: "sandmux::sandbox::init", Level::TRACE),
        ),
        (
            Level::DEBUG,
            tracing::enabled!(target: "sandmux::sandbox::init", Level::DEBUG),
        ),
    ];
    enabled
        .iter()
        .find(|(_, on)| *on)
        .map(|(l, _)| l.as_str().to_ascii_lowercase())
        .unwrap_or_else(|| "off".into())
}

/// Whether an event is sandmux's own.
fn ours(target: &str) -> bool {
    target == "sandmux" || target.starts_with("sandmux::")
}

/// The layer that writes events to stderr.
struct Stderr {
    format: Format,
}

impl<S> Layer<S> for Stderr
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn enabled(&self, m: &Metadata<'_>, _: Context<'_, S>) -> bool {
        ours(m.target())
    }

    /// A span's fields (a traced call's `trace_id`, `span_id`) are kept
    /// with it and written with every event inside it.
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        // Only sandmux's own spans: another library's fields are not ours
        // to print.
        if !ours(attrs.metadata().target()) {
            return;
        }
        if let Some(span) = ctx.span(id) {
            let mut f = Fields::default();
            attrs.record(&mut f);
            span.extensions_mut().insert(f);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let m = event.metadata();
        if !ours(m.target()) {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(sf) = span.extensions().get::<Fields>() {
                    f.fields.extend(sf.fields.iter().cloned());
                }
            }
        }
        if let Some(id) = INSTANCE.get() {
            f.fields
                .push(("instance".into(), Value::String(id.clone())));
        }
        let line = match self.format {
            Format::Text => text(*m.level(), &f),
            Format::Json => json(m, f),
        };
        // One write per event, so lines of concurrent events do not mix.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// An event's message and fields, in order.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(String, Value)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
}

/// Longest field value written, in bytes (an audit record fits).
const FIELD_MAX: usize = 8192;

impl Fields {
    fn put(&mut self, field: &Field, v: Value) {
        match (field.name(), v) {
            ("message", Value::String(s)) => self.message = s,
            (name, Value::String(mut s)) => {
                if s.len() > FIELD_MAX {
                    let mut end = FIELD_MAX;
                    while !s.is_char_boundary(end) {
                        end -= 1;
                    }
                    s.truncate(end);
                    s.push('…');
                }
                self.fields.push((name.into(), Value::String(s)))
            }
            (name, v) => self.fields.push((name.into(), v)),
        }
    }
}

/// `sandmux: [LEVEL: ]message key=value …`, every part escaped.
fn text(level: Level, f: &Fields) -> String {
    let tag = match level {
        Level::WARN => "WARNING: ",
        Level::DEBUG => "debug: ",
        Level::TRACE => "trace: ",
        _ => "",
    };
    let mut s = format!("sandmux: {tag}{}", crate::term::message(&f.message));
    for (k, v) in &f.fields {
        let v = match v {
            Value::String(s) => crate::term::printable(s),
            other => other.to_string(),
        };
        let quote = v.is_empty() || v.contains([' ', '"', '=']);
        let _ = if quote {
            write!(s, " {k}=\"{}\"", v.replace('"', "\\\""))
        } else {
            write!(s, " {k}={v}")
        };
    }
    s.push('\n');
    s
}

/// One JSON line: time, level, target, message, then the fields.
fn json(m: &Metadata<'_>, f: Fields) -> String {
    let mut o = Map::new();
    o.insert("ts".into(), now_rfc3339().into());
    o.insert("level".into(), m.level().as_str().into());
    o.insert("target".into(), m.target().into());
    o.insert("message".into(), f.message.into());
    for (k, v) in f.fields {
        o.insert(k, v);
    }
    let mut line = crate::term::json_text(&Value::Object(o));
    line.push('\n');
    line
}

/// Now, as RFC 3339 UTC with milliseconds.
pub(crate) fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let dd = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(message: &str, kv: &[(&str, &str)]) -> Fields {
        Fields {
            message: message.into(),
            fields: kv
                .iter()
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect(),
        }
    }

    #[test]
    fn only_sandmux_targets_are_written() {
        for (t, want) in [
            ("sandmux", true),
            ("sandmux::mcp::server", true),
            ("rmcp::service", false),
            ("sandmuxer", false),
            ("tokio", false),
        ] {
            assert_eq!(ours(t), want, "{t}");
        }
    }

    #[test]
    fn text_escapes_message_and_fields() {
        let f = fields("a\x1b[2Jb\nc", &[("session", "x\u{202e}y z"), ("n", "1")]);
        let t = text(Level::WARN, &f);
        assert_eq!(
            t,
            "sandmux: WARNING: a\\x1b[2Jb\n  c session=\"x\\u{202e}y z\" n=1\n"
        );
    }
}
