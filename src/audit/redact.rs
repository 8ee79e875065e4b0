//! What a record may hold: secrets digested, every string and key cut to
//! [`STRING_MAX`] bytes, arguments that would still make the record larger
//! than [`super::RECORD_MAX`] replaced by their size and digest. A call of a
//! hundred bytes can therefore never write more than a record's worth.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// Longest string (or object key) a record keeps, in bytes.
pub(crate) const STRING_MAX: usize = 1024;

/// `{len, sha256}`: the first 12 hex digits of SHA-256 over the log's key
/// and the value (equal inputs are equal within one log; short secrets
/// cannot be brute-forced from it).
pub(super) fn digest(key: &[u8; 16], v: &Value) -> Value {
    let bytes = match v {
        Value::String(s) => s.as_bytes().to_vec(),
        other => other.to_string().into_bytes(),
    };
    let mut h = Sha256::new();
    h.update(key);
    h.update(&bytes);
    let hex: String = h
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    json!({"len": bytes.len(), "sha256": hex})
}

/// The argument names whose values are digested, and those of them that are
/// maps whose names are kept (the MCP catalogue's, `mcp::catalog::secrets`;
/// none for the door's records).
pub(crate) type Secrets = (Vec<&'static str>, Vec<&'static str>);

/// Redacts an argument object for the log: the arguments `secrets` names
/// are digested, in a batch's operations too.
pub(super) fn redact(key: &[u8; 16], secrets: &Secrets, args: &Value) -> Value {
    let (digested, maps) = secrets;
    let Value::Object(m) = args else {
        return match args {
            Value::Null => Value::Null,
            other => json!({"malformed": digest(key, other)}),
        };
    };
    let mut out = Map::new();
    for (k, v) in m {
        let r = match (k.as_str(), v) {
            ("operations", Value::Array(a)) => {
                Value::Array(a.iter().map(|op| redact(key, secrets, op)).collect())
            }
            ("operations", other) => digest(key, other),
            ("arguments", Value::Object(_)) => redact(key, secrets, v),
            (k, Value::Object(env)) if maps.contains(&k) => Value::Object(
                env.iter()
                    .map(|(n, val)| (cut_str(n), digest(key, val)))
                    .collect(),
            ),
            (k, Value::Array(items)) if digested.contains(&k) => {
                Value::Array(items.iter().map(|i| digest(key, i)).collect())
            }
            (k, other) if digested.contains(&k) => digest(key, other),
            _ => cut(v),
        };
        out.insert(cut_str(k), r);
    }
    Value::Object(out)
}

/// A string cut to [`STRING_MAX`] bytes (on a character boundary), with a
/// marker that gives its whole length.
pub(super) fn cut_str(s: &str) -> String {
    cut_to(s, STRING_MAX)
}

/// A string cut to `max` bytes, with the marker.
pub(super) fn cut_to(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[cut, {} bytes]", &s[..end], s.len())
}

/// Every string and key in `v` cut to [`STRING_MAX`].
pub(super) fn cut(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(cut_str(s)),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (cut_str(k), cut(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(cut).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        let k = [7u8; 16];
        let secrets: Secrets = (vec!["environment", "keys", "text"], vec!["environment"]);
        let r = redact(
            &k,
            &secrets,
            &json!({"environment": {"TOKEN": "abc"}, "keys": ["C-c"], "pattern": "x".repeat(3000), "operations": [{"text": "pw", "pane_id": "%1"}]}),
        );
        assert_eq!(r["environment"]["TOKEN"]["len"], 3);
        assert!(r["keys"][0]["sha256"].is_string());
        let p = r["pattern"].as_str().unwrap();
        assert!(
            p.contains("[cut, 3000 bytes]") && p.len() < STRING_MAX + 40,
            "{p}"
        );
        assert_eq!(r["operations"][0]["pane_id"], "%1");
        assert_eq!(r["operations"][0]["text"]["len"], 2);
        let long_key = "k".repeat(5000);
        let r = redact(&k, &secrets, &json!({ long_key: 1 }));
        assert!(r
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.len() < STRING_MAX + 40));
        assert_eq!(
            cut_str(&"é".repeat(600)).len(),
            1024 + "…[cut, 1200 bytes]".len()
        );
    }
}
