//! The door's audit records: every `apply`, `apply --undo`, `--on-end
//! apply` and `discard` is one record in the instance's audit log (the one
//! `serve` wrote, continued and sealed again, or a new
//! `<time>-<id>.jsonl` beside the layers when the instance had none), so
//! the log says what reached the host tree, and by whose hand. The log is
//! opened before the door does anything: a door that cannot record does
//! not open.

use super::error::RecordError;
use super::report::{Kind, Line};
use crate::audit::{Audit, Entry, Secrets};
use serde_json::{json, Value};
use std::path::Path;

/// Bytes the door may add to a log in one action.
const BUDGET: u64 = 1 << 20;
/// Names listed per kind in a record; the rest are counted.
const LISTED: usize = 5;
/// Longest name listed, in bytes (a record stays under its bound).
const NAME_MAX: usize = 200;

/// Nothing in the door's arguments is secret: names are the agent's.
static NONE: Secrets = (Vec::new(), Vec::new());

/// An open log for one door action on instance `id`.
pub(super) struct Record {
    audit: Audit,
    id: String,
    started: std::time::Instant,
}

impl Record {
    /// Opens instance `id`'s log: its `serve` log at the default place,
    /// else a new one in the state directory that holds `layer_dir`.
    pub(super) fn open(id: &str, layer_dir: &Path) -> Result<Record, RecordError> {
        let path = match crate::audit::of_instance(id) {
            Some(p) => p,
            None => {
                let state = layer_dir
                    .parent()
                    .and_then(Path::parent)
                    .ok_or(RecordError::NoStateDir)?;
                let name = crate::audit::default_path(id)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_owned()))
                    .ok_or(RecordError::NoName)?;
                state.join("audit").join(name)
            }
        };
        let audit = match Audit::open(&path, BUDGET, &NONE) {
            Ok(a) => a,
            // A log the door cannot continue (torn, another writer): a new
            // one beside it, said.
            Err(e) if path.exists() => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                // Never the name that just failed (the same second).
                let name = |s: u64| path.with_file_name(format!("{s}-{id}.jsonl"));
                let fresh = if name(secs) == path {
                    name(secs + 1)
                } else {
                    name(secs)
                };
                let a = Audit::open(&fresh, BUDGET, &NONE).map_err(RecordError::Refused)?;
                eprintln!(
                    "sandmux: {}; the door's record goes to {}",
                    crate::term::printable(&e.to_string()),
                    fresh.display()
                );
                a
            }
            Err(e) => return Err(RecordError::Refused(e)),
        };
        Ok(Record {
            audit,
            id: id.to_string(),
            started: std::time::Instant::now(),
        })
    }

    /// Records `action` (`apply`, `undo`, `on-end apply`, `discard`) with
    /// what it said (`lines`) and its exit status, then seals the log.
    pub(super) fn done(
        self,
        action: &str,
        paths: &[std::path::PathBuf],
        lines: &[Line],
        code: i32,
    ) {
        let args = summary(&self.id, paths, lines, code);
        let ok = self.audit.event(
            Entry::event("(door)", Some(action), &args)
                .took(self.started.elapsed().as_millis() as u64),
        );
        if !ok {
            eprintln!(
                "sandmux: the audit log {} did not take the door's record",
                self.audit.path().display()
            );
        }
        self.audit.seal(code);
    }
}

/// The record's arguments: counts of each kind of line, the first few
/// names of each, and the paths asked for.
fn summary(id: &str, paths: &[std::path::PathBuf], lines: &[Line], code: i32) -> Value {
    let mut out = json!({
        "instance": id,
        "exit_status": code,
        "by_uid": nix::unistd::geteuid().as_raw(),
        "paths": paths.iter().take(LISTED).map(|p| cut(&p.to_string_lossy())).collect::<Vec<_>>(),
    });
    for k in Kind::COUNTED {
        let of: Vec<&str> = lines
            .iter()
            .filter(|l| l.kind == k)
            .map(|l| l.text.as_str())
            .collect();
        let Some(key) = k.key().filter(|_| !of.is_empty()) else {
            continue;
        };
        out[format!("{key}_count")] = json!(of.len());
        out[key] = json!(of.iter().take(LISTED).map(|l| cut(l)).collect::<Vec<_>>());
    }
    out
}

fn cut(s: &str) -> String {
    if s.len() <= NAME_MAX {
        return s.to_string();
    }
    let mut end = NAME_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
