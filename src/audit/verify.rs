//! `sandmux audit verify`: the hash chain, a torn last line, and the seal.

use super::{hash_line, GENESIS, SEAL};
use serde_json::Value;
use std::io::BufRead;
use std::path::Path;

/// What an intact log holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verified {
    /// Records in the chain.
    pub records: u64,
    /// Whether the last record is a seal (the instance stopped cleanly and
    /// nothing after its final record was removed).
    pub sealed: bool,
}

/// Checks a log's hash chain. Returns what it holds, or the first problem
/// with its line number.
pub(crate) fn verify(path: &Path) -> Result<Verified, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = std::io::BufReader::new(f);
    let mut prev = GENESIS.to_string();
    let (mut n, mut lineno, mut sealed) = (0u64, 0usize, false);
    let mut expect: Option<u64> = None;
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let got = r
            .read_until(b'\n', &mut raw)
            .map_err(|e| format!("line {}: {e}", lineno + 1))?;
        if got == 0 {
            break;
        }
        lineno += 1;
        if raw.last() != Some(&b'\n') {
            return Err(format!("line {lineno}: torn: the last record is incomplete ({} bytes and no newline): a write was cut short (the disk filled, an I/O error, or the supervisor died mid-write); the {n} records before it are intact", raw.len()));
        }
        let line = std::str::from_utf8(&raw[..raw.len() - 1])
            .map_err(|_| format!("line {lineno}: not UTF-8"))?;
        let (hash, v) = check_line(line, lineno, &prev, expect)?;
        sealed = is_seal(&v);
        expect = v["seq"].as_u64().map(|s| s + 1);
        prev = hash;
        n += 1;
    }
    Ok(Verified { records: n, sealed })
}

/// Whether a record is a seal `serve` wrote: an agent can choose the tool
/// name `(sealed)`, never the outcome `event` nor the count of the records
/// before it.
fn is_seal(v: &Value) -> bool {
    v["tool"] == SEAL
        && v["outcome"] == "event"
        && v["error_type"] == "sealed"
        && v["args"]["records"].as_u64().map(|r| r + 1) == v["seq"].as_u64()
}

/// One record against the chain so far: its hash, and the record.
fn check_line(
    line: &str,
    lineno: usize,
    prev: &str,
    expect: Option<u64>,
) -> Result<(String, Value), String> {
    let mut v: Value = serde_json::from_str(line)
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
    if let Some(e) = expect.filter(|e| *e != seq) {
        return Err(format!(
            "line {lineno}: seq {seq}, expected {e} (a record was removed, inserted or reordered)"
        ));
    }
    if v.get("prev").and_then(Value::as_str) != Some(prev) {
        return Err(format!("line {lineno}: prev does not match the hash of the record before it (removed or reordered records)"));
    }
    if let Value::Object(m) = &mut v {
        m.remove("hash");
    }
    if hash_line(prev, &crate::term::json_text(&v)) != hash {
        return Err(format!(
            "line {lineno}: hash mismatch (the record was edited)"
        ));
    }
    Ok((hash, v))
}
