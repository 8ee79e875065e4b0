//! `sandmux audit verify`: the hash chain, a torn last line, and the seal.

use super::{hash_line, GENESIS, SEAL};
use serde_json::Value;
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// The first problem found in a log, with its line number.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VerifyError {
    /// The log could not be opened.
    #[error("{}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A line could not be read.
    #[error("line {line}: {source}")]
    Read { line: usize, source: std::io::Error },
    /// The last line has no newline.
    #[error("line {line}: torn: the last record is incomplete ({bytes} bytes and no newline): a write was cut short (the disk filled, an I/O error, or the supervisor died mid-write); the {intact} records before it are intact")]
    Torn {
        line: usize,
        bytes: usize,
        intact: u64,
    },
    /// A line is not UTF-8.
    #[error("line {0}: not UTF-8")]
    NotUtf8(usize),
    /// A line is not JSON.
    #[error("line {line}: not a JSON record ({source})")]
    NotJson {
        line: usize,
        source: serde_json::Error,
    },
    /// A record has no hash.
    #[error("line {0}: no hash")]
    NoHash(usize),
    /// A record has no seq.
    #[error("line {0}: no seq")]
    NoSeq(usize),
    /// A record's seq is out of order.
    #[error(
        "line {line}: seq {seq}, expected {expected} (a record was removed, inserted or reordered)"
    )]
    Seq {
        line: usize,
        seq: u64,
        expected: u64,
    },
    /// A record's prev is not the hash before it.
    #[error("line {0}: prev does not match the hash of the record before it (removed or reordered records)")]
    Prev(usize),
    /// A record's hash does not match it.
    #[error("line {0}: hash mismatch (the record was edited)")]
    Hash(usize),
}

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
pub(crate) fn verify(path: &Path) -> Result<Verified, VerifyError> {
    let f = std::fs::File::open(path).map_err(|source| VerifyError::Open {
        path: path.into(),
        source,
    })?;
    let mut r = std::io::BufReader::new(f);
    let mut prev = GENESIS.to_string();
    let (mut n, mut lineno, mut sealed) = (0u64, 0usize, false);
    let mut expect: Option<u64> = None;
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let got = r
            .read_until(b'\n', &mut raw)
            .map_err(|source| VerifyError::Read {
                line: lineno + 1,
                source,
            })?;
        if got == 0 {
            break;
        }
        lineno += 1;
        if raw.last() != Some(&b'\n') {
            return Err(VerifyError::Torn {
                line: lineno,
                bytes: raw.len(),
                intact: n,
            });
        }
        let line =
            std::str::from_utf8(&raw[..raw.len() - 1]).map_err(|_| VerifyError::NotUtf8(lineno))?;
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
) -> Result<(String, Value), VerifyError> {
    let mut v: Value = serde_json::from_str(line).map_err(|source| VerifyError::NotJson {
        line: lineno,
        source,
    })?;
    let hash = v
        .get("hash")
        .and_then(Value::as_str)
        .ok_or(VerifyError::NoHash(lineno))?
        .to_string();
    let seq = v
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or(VerifyError::NoSeq(lineno))?;
    if let Some(e) = expect.filter(|e| *e != seq) {
        return Err(VerifyError::Seq {
            line: lineno,
            seq,
            expected: e,
        });
    }
    if v.get("prev").and_then(Value::as_str) != Some(prev) {
        return Err(VerifyError::Prev(lineno));
    }
    if let Value::Object(m) = &mut v {
        m.remove("hash");
    }
    if hash_line(prev, &crate::term::json_text(&v)) != hash {
        return Err(VerifyError::Hash(lineno));
    }
    Ok((hash, v))
}
