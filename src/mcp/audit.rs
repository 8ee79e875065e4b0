//! The audit log (P7): one JSON line per tool call and resource read —
//! allowed, refused and malformed alike — and per sandbox event (OOM kills,
//! [`super::oom`]), appended outside the sandbox and
//! hash-chained: each record carries `seq`, the previous record's hash and its
//! own, so `sandmux audit verify` finds any edited, removed or reordered line.
//!
//! Secrets are redacted: `keys`, `text`, `command`, `value`, `content`,
//! `shell` and `environment` values become `{len, sha256}` where `sha256` is
//! the first 12 hex digits of SHA-256 over a random per-log key and the value
//! (equal inputs are equal within one log; short secrets cannot be brute-forced
//! from it). Other strings over 200 characters are cut with a marker.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const DIGESTED: &[&str] = &[
    "keys",
    "text",
    "command",
    "value",
    "content",
    "shell",
    "environment",
];
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

struct State {
    file: std::fs::File,
    seq: u64,
    prev: String,
}

/// An open audit log.
pub struct Audit {
    path: PathBuf,
    key: [u8; 16],
    state: Mutex<State>,
    recent: Mutex<std::collections::VecDeque<Value>>,
}

/// One call to record.
pub struct Entry<'a> {
    /// Tool name (or `resource:<uri>`).
    pub tool: &'a str,
    /// The tool's toolset, if it has one.
    pub toolset: Option<&'a str>,
    /// ok | error | refused | malformed | event.
    pub outcome: &'a str,
    /// Error kind, if any.
    pub error_type: Option<&'a str>,
    /// Duration in milliseconds.
    pub duration_ms: u64,
    /// JSON-RPC request id.
    pub request_id: String,
    /// The client's name, if it said.
    pub client_id: Option<String>,
    /// The raw arguments (redacted here).
    pub args: &'a Value,
}

fn hash_line(prev: &str, body: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(body.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn now_rfc3339() -> String {
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

impl Audit {
    /// Opens (or continues) the log at `path`, mode 0600, append-only.
    pub fn open(path: &Path) -> Result<Audit, String> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("audit log directory {}: {e}", dir.display()))?;
        }
        let (mut seq, mut prev) = (0u64, GENESIS.to_string());
        if let Ok(f) = std::fs::File::open(path) {
            for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    seq = v["seq"].as_u64().unwrap_or(seq);
                    prev = v["hash"].as_str().unwrap_or(&prev).to_string();
                }
            }
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| format!("audit log {}: {e}", path.display()))?;
        let mut key = [0u8; 16];
        let _ = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key));
        Ok(Audit {
            path: path.to_path_buf(),
            key,
            state: Mutex::new(State { file, seq, prev }),
            recent: Mutex::new(Default::default()),
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn digest(&self, v: &Value) -> Value {
        let bytes = match v {
            Value::String(s) => s.as_bytes().to_vec(),
            other => other.to_string().into_bytes(),
        };
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(&bytes);
        let hex: String = h
            .finalize()
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        json!({"len": bytes.len(), "sha256": hex})
    }

    /// Redacts an argument object for the log.
    pub fn redact(&self, args: &Value) -> Value {
        match args {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, v) in m {
                    let r = if k == "operations" {
                        match v {
                            Value::Array(a) => {
                                Value::Array(a.iter().map(|op| self.redact(op)).collect())
                            }
                            other => self.digest(other),
                        }
                    } else if k == "arguments" && v.is_object() {
                        self.redact(v)
                    } else if DIGESTED.contains(&k.as_str()) {
                        match v {
                            Value::Object(env) if k == "environment" => Value::Object(
                                env.iter()
                                    .map(|(n, val)| (n.clone(), self.digest(val)))
                                    .collect(),
                            ),
                            Value::Array(items) => {
                                Value::Array(items.iter().map(|i| self.digest(i)).collect())
                            }
                            other => self.digest(other),
                        }
                    } else {
                        cut(v)
                    };
                    out.insert(k.clone(), r);
                }
                Value::Object(out)
            }
            Value::Null => Value::Null,
            other => json!({"malformed": self.digest(other)}),
        }
    }

    /// Appends one record. A failure to write is reported, never ignored.
    pub fn record(&self, e: Entry<'_>) -> Result<(), String> {
        let args = if e.outcome == "malformed" {
            json!({"digest": self.digest(e.args)})
        } else {
            self.redact(e.args)
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let seq = st.seq + 1;
        let mut rec = json!({
            "seq": seq,
            "ts": now_rfc3339(),
            "tool": cut(&Value::String(e.tool.to_string())),
            "toolset": e.toolset,
            "outcome": e.outcome,
            "error_type": e.error_type,
            "duration_ms": e.duration_ms,
            "request_id": e.request_id,
            "client_id": e.client_id,
            "args": args,
            "prev": st.prev,
        });
        let body = rec.to_string();
        let hash = hash_line(&st.prev, &body);
        // The record is the body with "hash" added as its last key (`verify`
        // parses the line and re-serialises it without that key).
        let mut line = body;
        line.pop();
        line.push_str(&format!(",\"hash\":\"{hash}\"}}\n"));
        rec["hash"] = Value::String(hash.clone());
        st.file
            .write_all(line.as_bytes())
            .map_err(|e| format!("writing the audit log: {e}"))?;
        st.seq = seq;
        st.prev = hash;
        drop(st);
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.push_back(rec);
        while r.len() > 200 {
            r.pop_front();
        }
        Ok(())
    }

    /// The last `n` records (for the journal resource).
    pub fn recent(&self, n: usize) -> Vec<Value> {
        let r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().rev().take(n).rev().cloned().collect()
    }
}

fn cut(v: &Value) -> Value {
    match v {
        Value::String(s) if s.chars().count() > 200 => {
            let head: String = s.chars().take(200).collect();
            Value::String(format!("{head}…[cut, {} chars]", s.chars().count()))
        }
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), cut(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(cut).collect()),
        other => other.clone(),
    }
}

/// Checks a log's hash chain. Returns the number of records, or the first
/// problem with its line number.
pub fn verify(path: &Path) -> Result<u64, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut prev = GENESIS.to_string();
    let mut expect_seq: Option<u64> = None;
    let mut n = 0;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|e| format!("line {lineno}: {e}"))?;
        let mut v: Value = serde_json::from_str(&line)
            .map_err(|e| format!("line {lineno}: not a JSON record ({e})"))?;
        let hash = v
            .get("hash")
            .and_then(Value::as_str)
            .ok_or(format!("line {lineno}: no hash"))?
            .to_string();
        let seq = v
            .get("seq")
            .and_then(Value::as_u64)
            .ok_or(format!("line {lineno}: no seq"))?;
        if let Some(e) = expect_seq {
            if seq != e {
                return Err(format!("line {lineno}: seq {seq}, expected {e} (a record was removed, inserted or reordered)"));
            }
        }
        if v.get("prev").and_then(Value::as_str) != Some(prev.as_str()) {
            return Err(format!("line {lineno}: prev does not match the hash of the record before it (removed or reordered records)"));
        }
        if let Value::Object(m) = &mut v {
            m.remove("hash");
        }
        let computed = hash_line(&prev, &v.to_string());
        if computed != hash {
            return Err(format!(
                "line {lineno}: hash mismatch (the record was edited)"
            ));
        }
        prev = hash;
        expect_seq = Some(seq + 1);
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(tool: &'a str, args: &'a Value) -> Entry<'a> {
        Entry {
            tool,
            toolset: Some("execute"),
            outcome: "ok",
            error_type: None,
            duration_ms: 1,
            request_id: "1".into(),
            client_id: None,
            args,
        }
    }

    #[test]
    fn chain_detects_edit_removal_and_reorder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        let a = Audit::open(&p).unwrap();
        for i in 0..4 {
            a.record(entry(
                "send_keys",
                &json!({"text": format!("secret-{i}"), "pane_id": "%1"}),
            ))
            .unwrap();
        }
        assert_eq!(verify(&p).unwrap(), 4);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.contains("secret-"), "secret in the log: {text}");
        let lines: Vec<&str> = text.lines().collect();
        let edited = text.replace("%1", "%2");
        std::fs::write(&p, &edited).unwrap();
        assert!(verify(&p).unwrap_err().contains("edited"));
        std::fs::write(&p, format!("{}\n{}\n{}\n", lines[0], lines[2], lines[3])).unwrap();
        assert!(verify(&p).is_err());
        std::fs::write(
            &p,
            format!("{}\n{}\n{}\n{}\n", lines[0], lines[2], lines[1], lines[3]),
        )
        .unwrap();
        assert!(verify(&p).is_err());
        // Reopening continues the chain.
        std::fs::write(&p, format!("{}\n", lines.join("\n"))).unwrap();
        let b = Audit::open(&p).unwrap();
        b.record(entry("list_panes", &json!({}))).unwrap();
        assert_eq!(verify(&p).unwrap(), 5);
    }

    #[test]
    fn redaction_rules() {
        let dir = tempfile::tempdir().unwrap();
        let a = Audit::open(&dir.path().join("r.jsonl")).unwrap();
        let r = a.redact(&json!({"environment": {"TOKEN": "abc"}, "keys": ["C-c"], "pattern": "x".repeat(300), "operations": [{"text": "pw", "pane_id": "%1"}]}));
        assert_eq!(r["environment"]["TOKEN"]["len"], 3);
        assert!(r["keys"][0]["sha256"].is_string());
        assert!(r["pattern"].as_str().unwrap().contains("[cut, 300 chars]"));
        assert_eq!(r["operations"][0]["pane_id"], "%1");
        assert_eq!(r["operations"][0]["text"]["len"], 2);
    }
}
