//! The standard request headers of protocol 2026-07-28 (SEP-2243,
//! `basic/transports/streamable-http`, "Standard Request Headers" and
//! "Server Validation"): a request of that version or later carries
//! `MCP-Protocol-Version` (equal to its `_meta` version), `Mcp-Method`
//! (equal to the body's `method`) and, for `tools/call`, `prompts/get` and
//! `resources/read`, `Mcp-Name` (equal to `params.name` or `params.uri`,
//! plain or as `=?base64?…?=`). A missing, repeated, undecodable or
//! mismatched header is answered `400` with JSON-RPC error `-32020`
//! (`HeaderMismatch`) before MCP sees the body, whichever way rmcp would
//! route the request (stateless, or under an `Mcp-Session-Id`).
//!
//! A request of an older version (no `_meta` version and no
//! `MCP-Protocol-Version` of 2026-07-28 or later) needs none of them;
//! `initialize` exists only before 2026-07-28, so it needs none either, but an
//! `Mcp-Method` it does carry must say `initialize` (a proxy may route on it).

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

/// The first protocol version whose requests carry the headers.
const FIRST: &str = "2026-07-28";
/// JSON-RPC error code of the spec's `HeaderMismatchError`.
pub(crate) const HEADER_MISMATCH: i64 = -32020;
const VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// Why a request's headers do not match its body.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Mismatch {
    #[error("Header mismatch: {header} is missing; protocol {FIRST} requires it on every request (send `{header}: {want}`)")]
    Missing { header: &'static str, want: String },
    #[error("Header mismatch: {header} is sent more than once; send it once")]
    Repeated { header: &'static str },
    #[error("Header mismatch: {header} is not visible ASCII (encode the value as =?base64?…?=)")]
    Unreadable { header: &'static str },
    #[error("Header mismatch: {header} does not match the body; it must say `{want}`")]
    Differs { header: &'static str, want: String },
}

/// The one value of `name`: `Ok(None)` when absent.
fn one<'a>(h: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, Mismatch> {
    let mut all = h.get_all(name).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(Mismatch::Repeated { header: name });
    }
    v.to_str()
        .map(Some)
        .map_err(|_| Mismatch::Unreadable { header: name })
}

/// `=?base64?…?=` decoded (UTF-8); any other value as it is.
fn decoded(v: &str) -> Option<String> {
    match v
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
        None => Some(v.to_string()),
    }
}

/// `header` must be present once and say `want` (after decoding).
fn expect(h: &HeaderMap, header: &'static str, want: &str, encoded: bool) -> Result<(), Mismatch> {
    let shown = crate::mcp::text::shown(want);
    let Some(got) = one(h, header)? else {
        return Err(Mismatch::Missing {
            header,
            want: shown,
        });
    };
    let got = if encoded {
        decoded(got)
    } else {
        Some(got.to_string())
    };
    if got.as_deref() == Some(want) {
        Ok(())
    } else {
        Err(Mismatch::Differs {
            header,
            want: shown,
        })
    }
}

/// Checks a POST body's JSON-RPC message against the request's headers.
/// A body that is not one JSON object is left to rmcp (which refuses it).
pub(crate) fn check(h: &HeaderMap, body: &[u8]) -> Result<(), Mismatch> {
    let Ok(Value::Object(msg)) = serde_json::from_slice::<Value>(body) else {
        return Ok(());
    };
    let Some(method) = msg.get("method").and_then(Value::as_str) else {
        return Ok(()); // a response: no method to mirror
    };
    let params = msg.get("params");
    let meta_version = params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(VERSION_META))
        .and_then(Value::as_str);
    let header_version = one(h, "mcp-protocol-version")?;
    // Versions are dates: a later one sorts after FIRST.
    let modern = [meta_version, header_version]
        .iter()
        .any(|v| v.is_some_and(|v| v >= FIRST));
    if method == "initialize" || !modern {
        return match one(h, "mcp-method")? {
            Some(_) if method == "initialize" => expect(h, "Mcp-Method", method, false),
            _ => Ok(()),
        };
    }
    if let Some(v) = meta_version {
        expect(h, "MCP-Protocol-Version", v, false)?;
    }
    expect(h, "Mcp-Method", method, false)?;
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return Ok(()),
    };
    match params.and_then(|p| p.get(key)).and_then(Value::as_str) {
        Some(name) => expect(h, "Mcp-Name", name, true),
        None => Ok(()), // no name in the body: rmcp refuses the params
    }
}

/// The `400` answer: a JSON-RPC error under the request's id.
pub(crate) fn answer(m: &Mismatch, body: &[u8]) -> super::front::Answer {
    let id = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("id").cloned())
        .unwrap_or(Value::Null);
    let text = json!({"jsonrpc": "2.0", "id": id,
        "error": {"code": HEADER_MISMATCH, "message": m.to_string()}});
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())).boxed());
    *r.status_mut() = StatusCode::BAD_REQUEST;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, v.parse().unwrap());
        }
        m
    }

    fn call(name: &str, version: Option<&str>) -> Vec<u8> {
        let meta = version.map_or(json!({}), |v| json!({VERSION_META: v}));
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": name, "arguments": {}, "_meta": meta}})
        .to_string()
        .into_bytes()
    }

    const V: (&str, &str) = ("mcp-protocol-version", FIRST);

    #[test]
    fn modern_requests_need_matching_headers() {
        let b = call("list_panes", Some(FIRST));
        let ok = h(&[V, ("mcp-method", "tools/call"), ("mcp-name", "list_panes")]);
        assert_eq!(check(&ok, &b), Ok(()));
        let b64 = h(&[
            V,
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?bGlzdF9wYW5lcw==?="),
        ]);
        assert_eq!(check(&b64, &b), Ok(()));
        for bad in [
            h(&[V, ("mcp-name", "list_panes")]),
            h(&[V, ("mcp-method", "tools/list"), ("mcp-name", "list_panes")]),
            h(&[V, ("mcp-method", "tools/call")]),
            h(&[V, ("mcp-method", "tools/call"), ("mcp-name", "kill_server")]),
            h(&[
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "list_panes"),
                ("mcp-name", "list_panes"),
            ]),
            h(&[
                V,
                ("mcp-method", "tools/call"),
                ("mcp-name", "=?base64?!!?="),
            ]),
            h(&[("mcp-method", "tools/call"), ("mcp-name", "list_panes")]),
            h(&[
                ("mcp-protocol-version", "2025-11-25"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "list_panes"),
            ]),
        ] {
            assert!(check(&bad, &b).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn older_versions_need_none_and_initialize_is_checked_only_when_sent() {
        let b = call("list_panes", None);
        assert_eq!(check(&h(&[]), &b), Ok(()));
        assert_eq!(
            check(&h(&[("mcp-protocol-version", "2025-11-25")]), &b),
            Ok(())
        );
        // The version header alone makes a request modern.
        assert!(check(&h(&[V]), &b).is_err());
        let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
        assert_eq!(check(&h(&[]), init), Ok(()));
        assert!(check(&h(&[("mcp-method", "tools/list")]), init).is_err());
    }
}
