//! `serve --http` behind a reverse proxy that owns `Authorization` (the
//! Kubernetes agent-sandbox router strips it, and may consume it as its own
//! credential): the token in a header the operator names
//! (`--token-header`); an instance started without a token (`--unclaimed`,
//! a warm pool's pod) that is given one later over the operator endpoint
//! (`sandmux token set`); and the upstream timeout every wait stays under
//! (`--upstream-timeout`).

use super::token::{Change, Token};
use hyper::header::HeaderName;
use serde_json::{json, Value};
use std::time::Duration;

/// Headers a proxy drops, rewrites or fills itself: a token there would not
/// arrive (or would arrive from the proxy, not the client).
const NOT_FOR_TOKENS: [&str; 13] = [
    "host",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "content-length",
    "content-type",
    "cookie",
    "forwarded",
];

/// `--token-header NAME`: a valid header name that proxies pass through.
pub(crate) fn token_header(name: &str) -> Result<HeaderName, String> {
    let h = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
        format!(
            "--token-header {:?}: not an HTTP header name (e.g. X-Sandmux-Token)",
            crate::term::printable(name)
        )
    })?;
    let s = h.as_str();
    if NOT_FOR_TOKENS.contains(&s) || s.starts_with("x-forwarded-") || s.starts_with("mcp-") {
        return Err(format!("--token-header {s}: a proxy or the MCP transport sets or drops this header; name one of your own, e.g. X-Sandmux-Token"));
    }
    Ok(h)
}

/// `--upstream-timeout SECONDS`: what a request may take end to end before
/// the proxy in front gives up on it. Every wait a tool does is capped
/// [`MARGIN`] below it (at least [`MIN_WAIT`]).
pub(crate) const MARGIN: Duration = Duration::from_secs(10);
/// The shortest cap, whatever the timeout.
pub(crate) const MIN_WAIT: Duration = Duration::from_secs(1);

/// `--upstream-timeout`, once it lowered the ceiling (one instance per process).
static UPSTREAM: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// `--upstream-timeout`'s ceiling on every wait, in seconds, for the
/// profile's resolution (`profile::Context::wait_cap`: `[mcp]
/// wait_max_seconds` and `ask_seconds` resolve no higher), so no call
/// outlives the proxy in front: a wait ends, and says so, before the proxy
/// would cut the answer off. What is left of it per call is [`left`].
pub(crate) fn cap_waits(f: &super::Flags) -> Option<u64> {
    let secs = f.upstream_timeout?;
    let cap = wait_cap(Duration::from_secs(secs)).as_secs();
    tracing::info!("--upstream-timeout {secs}: every wait ends within {cap} s");
    let _ = UPSTREAM.set(secs);
    Some(cap)
}

/// The ceiling on a wait in a call that began at `started`: the profile's
/// (`wait_max`, already under the upstream cap), and under
/// `--upstream-timeout` no more than what is left of the cap since the
/// request arrived (a wait for a human's answer spent part of it), at
/// least [`MIN_WAIT`].
pub(crate) fn left(started: std::time::Instant, wait_max: Duration) -> Duration {
    match UPSTREAM.get() {
        Some(s) => left_of(wait_cap(Duration::from_secs(*s)), started, wait_max),
        None => wait_max,
    }
}

fn left_of(cap: Duration, started: std::time::Instant, wait_max: Duration) -> Duration {
    cap.saturating_sub(started.elapsed())
        .clamp(MIN_WAIT, wait_max.max(MIN_WAIT))
}

/// Why a wait was cut to the ceiling, for a result's note.
pub(crate) fn ceiling_why() -> String {
    match UPSTREAM.get() {
        Some(s) => format!("the ceiling ([mcp] wait_max_seconds, and under --upstream-timeout {s}, as the proxy in front gives up on a request after {s} s, what is left of {} s since the request arrived)", wait_cap(Duration::from_secs(*s)).as_secs()),
        None => "the profile's ceiling ([mcp] wait_max_seconds)".into(),
    }
}

/// The longest a tool may wait under an upstream timeout.
pub(crate) fn wait_cap(upstream: Duration) -> Duration {
    upstream.saturating_sub(MARGIN).max(MIN_WAIT)
}

/// `--upstream-timeout`: whole seconds, 5 or more.
pub(crate) fn upstream_timeout(secs: u64) -> Result<Duration, String> {
    if secs < 5 {
        return Err(format!("--upstream-timeout {secs}: at least 5 seconds (the router's default is 180: pass 170 or its --proxy-timeout minus a margin)"));
    }
    Ok(Duration::from_secs(secs))
}

/// `sandmux token set`: the token read from the operator's stdin put in
/// force (never echoed: the answer and the audit record name its digest).
/// The idle clock starts at the first claim.
pub(crate) fn set_token(s: &crate::mcp::ctx::State, secret: &[u8], uid: u32) -> Value {
    let Some(info) = s.http.get() else {
        return json!({"ok": false, "error": "this instance does not serve --http"});
    };
    let refused = |e: String| {
        s.audit.event(crate::audit::Entry::event(
            "(http)",
            Some("token_set_refused"),
            &json!({"why": e, "by": format!("operator uid {uid}")}),
        ));
        json!({"ok": false, "error": e})
    };
    let t: Token = match super::token::given(secret) {
        Ok(t) => t,
        Err(e) => return refused(e.to_string()),
    };
    let first = info.token.waiting();
    let id = t.id.clone();
    match info.token.set(t) {
        Err(e) => refused(e.to_string()),
        Ok(change) => {
            if first {
                info.activity.touch();
            }
            let kind = match (first, change) {
                (true, _) => "token_claimed",
                (false, Change::None) => "token_unchanged",
                (false, _) => "token_replaced",
            };
            tracing::info!("{kind} by operator uid {uid}: the token in force is now {id}");
            s.audit.event(crate::audit::Entry::event(
                "(http)",
                Some(kind),
                &json!({"token": id, "by": format!("operator uid {uid}")}),
            ));
            json!({"ok": true, "token": id, "event": kind})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_headers_are_ones_a_proxy_passes() {
        assert_eq!(
            token_header("X-Sandmux-Token").unwrap().as_str(),
            "x-sandmux-token"
        );
        assert!(token_header("Authorization").is_ok());
        for bad in [
            "Host",
            "Cookie",
            "X-Forwarded-For",
            "Mcp-Session-Id",
            "Connection",
            "a b",
            "",
        ] {
            assert!(token_header(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn waits_stay_under_the_upstream_timeout() {
        assert_eq!(wait_cap(Duration::from_secs(170)), Duration::from_secs(160));
        assert_eq!(wait_cap(Duration::from_secs(5)), MIN_WAIT);
        assert!(upstream_timeout(4).is_err() && upstream_timeout(5).is_ok());
        // A call that spent 7 s (waiting for a human's answer) gets the rest.
        let s = |ago: u64| std::time::Instant::now() - Duration::from_secs(ago);
        let (cap, max) = (Duration::from_secs(10), Duration::from_secs(300));
        let got = left_of(cap, s(7), max);
        assert!(got <= Duration::from_secs(3) && got > Duration::from_secs(2));
        assert_eq!(left_of(cap, s(20), max), MIN_WAIT);
        assert_eq!(
            left_of(cap, s(0), Duration::from_secs(4)),
            Duration::from_secs(4)
        );
    }
}
