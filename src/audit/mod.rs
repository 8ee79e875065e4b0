//! The audit log (P7): one JSON line per tool call and resource read —
//! allowed, refused and malformed alike — and per sandbox event (OOM kills,
//! [`crate::runtime::oom`]; reverts, [`crate::runtime::reverts`]), appended outside the sandbox
//! and hash-chained: each record carries `seq`, the previous record's hash
//! and its own, so `sandmux audit verify` finds any edited, removed or
//! reordered line, a torn last line, and a log whose end is not the seal a
//! clean stop writes.
//!
//! Bounded ([`redact`]): strings at 1 KiB, records at [`RECORD_MAX`], the
//! in-memory window at [`WINDOW_MAX`], the file at the profile's
//! `[mcp] audit_max_bytes`. Fail closed: a tool call runs only once
//! [`Audit::admit`] has room for its record — inside the budget, and on disk
//! (the room is preallocated, so a disk the agent fills afterwards cannot
//! refuse the record). A call that cannot be admitted is refused, counted,
//! and the human is told (stderr once; `ps`, the operator endpoint and
//! `sandbox_status` report [`Audit::status`]). Nothing is dropped in silence:
//! what could not be written is counted in the seal.

mod entry;
mod error;
mod file;
mod paths;
mod redact;
pub(crate) mod retention;
mod verify;

pub(crate) use entry::Entry;
pub(crate) use error::{OpenError, RetentionError, Unadmitted};
use file::{hash_line, last_link, room};
pub(crate) use paths::{default_path, finished, of_instance};

pub(crate) use redact::Secrets;
pub(crate) use verify::verify;
#[cfg(test)]
use verify::Verified;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Largest record, in bytes.
pub(crate) const RECORD_MAX: usize = 8192;
/// The in-memory window of recent records (the journal resource), in bytes.
pub(crate) const WINDOW_MAX: usize = 1 << 20;
/// The tool name of the final record a clean stop writes.
pub(crate) const SEAL: &str = "(sealed)";
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Whether records can be written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    Ok,
    /// The budget is spent; calls are refused until the instance ends.
    Full,
    /// A write or the room for one failed; calls are refused until the room
    /// can be had again.
    Failing(String),
}

struct State {
    /// Locked while this instance runs: no second writer, and retention
    /// leaves it alone.
    file: nix::fcntl::Flock<std::fs::File>,
    seq: u64,
    prev: String,
    /// Bytes of whole records in the file.
    len: u64,
    health: Health,
    /// Admitted calls whose records are not written yet.
    inflight: u64,
    /// Calls refused because no record could be written.
    refused: u64,
    /// Records that could not be written (events, refusals) since the last one that was.
    unrecorded: u64,
    /// Bytes of the proxy's records (at most [`Audit::proxy_share`]).
    proxy_bytes: u64,
    /// The proxy's decisions past its share: only counted (the seal).
    proxy_unrecorded: u64,
    sealed: bool,
    /// Where the bytes a failed write left end (0: none): the next record
    /// is written over them and padded to cover them all. The file is never
    /// truncated, since that would free the room kept for running calls.
    dirty_end: u64,
}

/// The recent records as their JSON lines (memory is their length).
struct Window {
    records: std::collections::VecDeque<String>,
    bytes: usize,
}

/// An open audit log.
pub(crate) struct Audit {
    path: PathBuf,
    key: [u8; 16],
    /// What is digested in each record's arguments.
    secrets: &'static Secrets,
    /// The profile's budget for this instance's records.
    budget: u64,
    /// The file's size the budget ends at (a continued log's earlier
    /// records do not count).
    limit: u64,
    state: Mutex<State>,
    recent: Mutex<Window>,
}

/// Room for one call's record, held from before the call runs until its
/// record is written ([`Admission::record`]). Dropped unrecorded (a handler
/// cancelled at shutdown), it writes an `abandoned` record into that room.
pub(crate) struct Admission<'a> {
    audit: &'a Audit,
    /// The call, until its record is written.
    tool: Option<String>,
}

impl Admission<'_> {
    /// Writes the admitted call's record (into the room kept for it).
    pub(crate) fn record(mut self, e: Entry<'_>) {
        self.tool = None;
        self.audit.write(e, Kind::Admitted);
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if let Some(tool) = self.tool.take() {
            let e = Entry {
                tool: &tool,
                toolset: None,
                outcome: "error",
                error_type: Some("abandoned"),
                duration_ms: 0,
                request_id: String::new(),
                client_id: None,
                http: None,
                trace: None,
                args: &Value::Null,
                checkpoint: None,
            };
            self.audit.write(e, Kind::Admitted);
        }
        let mut st = self.audit.lock();
        st.inflight = st.inflight.saturating_sub(1);
    }
}

/// What a record is, for the room it may use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An admitted call's record: its room was kept at admission.
    Admitted,
    /// sandmux's own event (an OOM kill, a revert, a restart): written if
    /// there is room beyond what admitted calls and the seal hold, else
    /// counted.
    Event,
    /// A refusal or a malformed line: as `Event`, but it must also leave the
    /// room kept for events (an eighth of the budget), so a flood of cheap
    /// refusals cannot crowd events out.
    Other,
    /// The proxy's decisions (network mode `proxy`): as `Other`, and in
    /// all at most [`Audit::proxy_share`] bytes; past that only counted.
    Proxy,
    /// The final record: the room kept since the start.
    Seal,
}

/// `serve --http --audit-stdout`: every record also goes to stdout as it
/// is written to the log (hash chain and seal included), for a log
/// pipeline that keeps it after the pod and its volumes are gone.
static MIRROR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the stdout copy on (before the log is opened; stdout must not be
/// the MCP channel).
pub(crate) fn mirror_to_stdout() {
    MIRROR.store(true, std::sync::atomic::Ordering::Relaxed);
}

impl Audit {
    /// Opens (or continues) the log at `path`, mode 0600, append-only, with
    /// a budget of `budget` bytes for this instance's records; the
    /// arguments `secrets` names are digested in every record.
    pub(crate) fn open(
        path: &Path,
        budget: u64,
        secrets: &'static Secrets,
    ) -> Result<Audit, OpenError> {
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| OpenError::Dir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|source| OpenError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, source)| OpenError::Held {
                path: path.to_path_buf(),
                source,
            })?;
        let (seq, prev) = last_link(&file, path)?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        room(&file, len, 2 * RECORD_MAX as u64).map_err(|source| OpenError::NoRoom {
            path: path.to_path_buf(),
            source,
        })?;
        let key = crate::nonce::bytes::<16>();
        let st = State {
            file,
            seq,
            prev,
            len,
            health: Health::Ok,
            inflight: 0,
            refused: 0,
            unrecorded: 0,
            proxy_bytes: 0,
            proxy_unrecorded: 0,
            sealed: false,
            dirty_end: 0,
        };
        Ok(Audit {
            path: path.to_path_buf(),
            key,
            secrets,
            budget,
            limit: len + budget,
            state: Mutex::new(st),
            recent: Mutex::new(Window {
                records: Default::default(),
                bytes: 0,
            }),
        })
    }

    /// The log's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for one tool call's record, or why there is none: the call must
    /// then be refused (it is counted, and the seal reports the count).
    pub(crate) fn admit(&self, tool: &str) -> Result<Admission<'_>, Unadmitted> {
        let mut st = self.lock();
        if matches!(st.health, Health::Failing(_)) {
            self.recover(&mut st);
        }
        if st.health == Health::Ok && !st.sealed {
            // This call's record, every other admitted one's, and the seal's.
            let need = (st.inflight + 2) * RECORD_MAX as u64;
            if st.len + need > self.limit {
                self.set(&mut st, Health::Full);
            } else if let Err(e) = room(&st.file, st.len, need) {
                self.set(&mut st, Health::Failing(e.to_string()));
            }
        }
        if st.health != Health::Ok || st.sealed {
            st.refused += 1;
            return Err(self.why(&st));
        }
        st.inflight += 1;
        Ok(Admission {
            audit: self,
            tool: Some(tool.to_string()),
        })
    }

    fn why(&self, st: &State) -> Unadmitted {
        match &st.health {
            Health::Full => Unadmitted::Full {
                budget: self.budget,
            },
            Health::Failing(e) => Unadmitted::Failing { why: e.clone() },
            Health::Ok => Unadmitted::Ending,
        }
    }

    /// A change of health, said on stderr when it turns bad.
    fn set(&self, st: &mut State, h: Health) {
        if st.health == h {
            return;
        }
        let was_ok = st.health == Health::Ok;
        st.health = h;
        if was_ok {
            tracing::error!(path = %self.path.display(), "{}", self.why(st));
        }
    }

    /// Back to writing once the room is there again, with a record that says
    /// how many calls were refused.
    fn recover(&self, st: &mut State) {
        let need = (st.inflight + 3) * RECORD_MAX as u64;
        if st.len + need > self.limit || room(&st.file, st.len, need).is_err() {
            return;
        }
        st.health = Health::Ok;
        let args = json!({"refused_calls": st.refused, "unrecorded": st.unrecorded});
        self.append(st, "(audit-resumed)", "audit_resumed", args, Kind::Event);
        tracing::info!(path = %self.path.display(), "the audit log can be written again");
    }
}

/// Room `append` leaves for the `"hash"` field and the newline.
const HASH_FIELD: usize = 80;

impl Audit {
    /// Records what was not admitted (a refusal, a malformed line) or an
    /// event: written if there is room beyond what admitted calls and the
    /// seal hold, else counted (`status`, the seal). Whether it was written.
    pub(crate) fn record(&self, e: Entry<'_>) -> bool {
        self.write(e, Kind::Other)
    }

    /// Records sandmux's own event (outcome `event`), which may use the room
    /// kept for events. Whether it was written.
    pub(crate) fn event(&self, e: Entry<'_>) -> bool {
        self.write(e, Kind::Event)
    }

    /// Records a decision of the proxy: inside its share of the budget, and
    /// like a refusal it leaves the events' room; past the share it is only
    /// counted (`proxy_unrecorded` in the seal). Whether it was written.
    pub(crate) fn proxy(&self, e: Entry<'_>) -> bool {
        self.write(e, Kind::Proxy)
    }

    /// `args` as the log records them (secrets digested, strings cut).
    pub(crate) fn redacted(&self, args: &Value) -> Value {
        redact::redact(&self.key, self.secrets, args)
    }

    /// The proxy's share of the budget: an eighth, so a pane's flood of
    /// connections can neither crowd out tool calls nor sandmux's events.
    pub(crate) fn proxy_share(&self) -> u64 {
        self.budget / 8
    }

    fn write(&self, e: Entry<'_>, kind: Kind) -> bool {
        let args = if e.outcome == "malformed" {
            json!({"digest": redact::digest(&self.key, e.args)})
        } else {
            redact::redact(&self.key, self.secrets, e.args)
        };
        let rec = json!({
            "tool": redact::cut_str(e.tool),
            "toolset": e.toolset,
            "outcome": e.outcome,
            "error_type": e.error_type,
            "duration_ms": e.duration_ms,
            "request_id": redact::cut_str(&e.request_id),
            "client_id": e.client_id.as_deref().map(redact::cut_str),
            "args": args,
        });
        let mut rec = rec;
        if let Some(h) = e.http {
            rec["http"] = h;
        }
        if let Some(c) = e.checkpoint {
            rec["checkpoint"] = c;
        }
        if let Some(t) = e.trace {
            rec["trace_id"] = json!(t.trace_id());
            rec["span_id"] = json!(t.span_id());
            rec["parent_span_id"] = json!(t.parent_id());
            if let Some(s) = t.state() {
                rec["tracestate"] = json!(s);
            }
        }
        let mut st = self.lock();
        let written = self.append_fields(&mut st, rec, e.args, kind);
        if let Some(trace) = e.trace {
            crate::otlp::span(crate::otlp::Call {
                trace,
                tool: e.tool,
                known: e.toolset.is_some(),
                outcome: e.outcome,
                error_type: e.error_type,
                duration: std::time::Duration::from_millis(e.duration_ms),
                seq: written.then_some(st.seq),
            });
        }
        written
    }

    /// An event of sandmux's own (`tool` in parentheses).
    fn append(&self, st: &mut State, tool: &str, what: &str, args: Value, kind: Kind) -> bool {
        let rec = json!({"tool": tool, "toolset": null, "outcome": "event", "error_type": what, "duration_ms": 0, "request_id": "", "client_id": null, "args": args});
        self.append_fields(st, rec, &Value::Null, kind)
    }

    fn append_fields(&self, st: &mut State, mut rec: Value, raw: &Value, kind: Kind) -> bool {
        // Admitted calls and the seal write into room kept for them, whatever
        // happened since; everything else needs a healthy log and room.
        let kept = matches!(kind, Kind::Admitted | Kind::Seal);
        if st.sealed || (!kept && st.health != Health::Ok) {
            st.unrecorded += 1;
            return false;
        }
        rec["seq"] = json!(st.seq + 1);
        rec["ts"] = json!(crate::log::now_rfc3339());
        rec["prev"] = json!(st.prev);
        let body = self.bounded(&mut rec, raw);
        let hash = hash_line(&st.prev, &body);
        let mut line = body;
        line.pop();
        line.push_str(&format!(",\"hash\":\"{hash}\""));
        // Over what a failed write left: JSON spaces (`verify` hashes the
        // parsed record, so they change nothing).
        let end = st.len + line.len() as u64 + 2;
        line.extend(std::iter::repeat_n(
            ' ',
            st.dirty_end.saturating_sub(end) as usize,
        ));
        line.push_str("}\n");
        if kind == Kind::Proxy && st.proxy_bytes + line.len() as u64 > self.proxy_share() {
            st.proxy_unrecorded += 1;
            return false;
        }
        if !kept && !self.fits(st, line.len() as u64, kind) {
            st.unrecorded += 1;
            return false;
        }
        use std::os::unix::fs::FileExt;
        if let Err(e) = st.file.write_all_at(line.as_bytes(), st.len) {
            self.set(st, Health::Failing(e.to_string()));
            let size = st.file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            st.dirty_end = st.dirty_end.max(size.min(st.len + line.len() as u64));
            st.unrecorded += 1;
            return false;
        }
        st.dirty_end = 0;
        if kind == Kind::Proxy {
            st.proxy_bytes += line.len() as u64;
        }
        st.len += line.len() as u64;
        st.seq += 1;
        st.prev = hash;
        self.remember(line);
        true
    }

    /// The record's text, at most [`RECORD_MAX`] with its hash: arguments
    /// that do not fit become their size and digest; if even that is too
    /// much (strings of controls grow sixfold as JSON), the names shrink.
    fn bounded(&self, rec: &mut Value, raw: &Value) -> String {
        let mut body = crate::term::json_text(rec);
        if body.len() + HASH_FIELD > RECORD_MAX {
            rec["args"] = json!({"cut": redact::digest(&self.key, raw)});
            body = crate::term::json_text(rec);
        }
        if body.len() + HASH_FIELD > RECORD_MAX {
            for k in ["tool", "request_id", "client_id"] {
                if let Some(s) = rec[k].as_str() {
                    rec[k] = json!(redact::cut_to(s, 128));
                }
            }
            body = crate::term::json_text(rec);
        }
        body
    }

    /// Whether a record that was not admitted fits beside the room admitted
    /// calls and the seal hold (and, for a refusal, the events' room), in
    /// the budget and on disk. A miss only counts the record: it says
    /// nothing about the log's health.
    fn fits(&self, st: &State, n: u64, kind: Kind) -> bool {
        let events = if matches!(kind, Kind::Other | Kind::Proxy) {
            self.budget / 8
        } else {
            0
        };
        let need = (st.inflight + 1) * RECORD_MAX as u64 + n;
        st.len + need + events <= self.limit && room(&st.file, st.len, need).is_ok()
    }

    fn remember(&self, mut line: String) {
        if MIRROR.load(std::sync::atomic::Ordering::Relaxed) {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(line.as_bytes()).and_then(|_| out.flush());
        }
        line.pop();
        // The record as written: redacted and bounded like the log itself.
        tracing::trace!(record = %line, "audit record");
        let mut w = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        w.bytes += line.len();
        w.records.push_back(line);
        while w.bytes > WINDOW_MAX {
            match w.records.pop_front() {
                Some(l) => w.bytes -= l.len(),
                None => break,
            }
        }
    }

    /// Writes the final record of a clean stop: how many calls were refused
    /// and records could not be written, and the exit status. `verify`
    /// reports a log whose last record is not a seal.
    pub(crate) fn seal(&self, exit_status: i32) {
        let mut st = self.lock();
        if st.sealed {
            return;
        }
        if matches!(st.health, Health::Failing(_)) {
            self.recover(&mut st);
        }
        let args = json!({"records": st.seq, "refused_calls": st.refused, "unrecorded": st.unrecorded, "proxy_unrecorded": st.proxy_unrecorded, "budget_reached": st.health == Health::Full, "exit_status": exit_status});
        let ok = self.append(&mut st, SEAL, "sealed", args, Kind::Seal);
        st.sealed = true;
        if !ok {
            tracing::error!("the audit log {} could not be sealed; `sandmux audit verify` reports it as not sealed", self.path.display());
        }
    }

    /// The log's state for `ps`, the operator endpoint and `sandbox_status`.
    pub(crate) fn status(&self) -> Value {
        let st = self.lock();
        let state = match (&st.health, st.sealed) {
            (Health::Ok, false) => "ok",
            (Health::Ok, true) => "sealed",
            (Health::Full, _) => "full",
            (Health::Failing(_), _) => "failing",
        };
        let reason = (st.health != Health::Ok).then(|| self.why(&st).to_string());
        json!({"path": self.path, "state": state, "reason": reason, "bytes": st.len, "budget": self.budget, "refused_calls": st.refused, "unrecorded": st.unrecorded})
    }

    /// Bytes left in this instance's budget (the metrics' gauge).
    pub(crate) fn bytes_left(&self) -> u64 {
        self.limit.saturating_sub(self.lock().len)
    }

    /// The last `n` records as JSON, newest last, at most `max_bytes` of
    /// text in all (older records give way).
    pub(crate) fn recent(&self, n: usize, max_bytes: usize) -> Vec<String> {
        let w = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut bytes = 0;
        for l in w.records.iter().rev().take(n) {
            if bytes + l.len() + 1 > max_bytes {
                break;
            }
            bytes += l.len() + 1;
            out.push(l.clone());
        }
        out.reverse();
        out
    }
}
#[cfg(test)]
mod tests;
