//! The layer in front of rmcp's streamable HTTP service. In order: the
//! readiness probe (`GET /healthz`, no token, says only ready or not), the
//! Host and Origin checks (DNS rebinding), the path (`/mcp`, or `GET
//! /metrics`: the Prometheus text, `mcp::metrics`), the Bearer token, the
//! body cap, the concurrent request cap and (for `initialize`) the session
//! cap. Every refusal is counted ([`super::rejects`]) and none reaches MCP.

use super::rejects::{Rejects, Why};
use super::token::{Change, Current};
use super::Limits;
use crate::mcp::backlog::Debt;
use crate::mcp::ctx::State;
use crate::mcp::server::Server;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What rmcp answers with.
pub(crate) type Answer = Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

/// Who sent a request, as audit records name it (put into the request's
/// extensions, where the handler finds it through rmcp's `Parts`).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The client's address.
    pub(crate) addr: SocketAddr,
    /// The digest naming the token it presented.
    pub(crate) token: String,
}

/// The front layer and the rmcp service behind it.
pub(crate) struct Front {
    pub(crate) state: Arc<State>,
    pub(crate) mcp: StreamableHttpService<Server, LocalSessionManager>,
    pub(crate) sessions: Arc<LocalSessionManager>,
    pub(crate) token: Arc<Current>,
    /// The header the token comes in (`--token-header`; `Authorization`).
    pub(crate) token_header: hyper::header::HeaderName,
    pub(crate) hosts: Vec<String>,
    pub(crate) limits: Limits,
    pub(crate) requests: Arc<Semaphore>,
    /// Held while an `initialize` is counted against the session cap and served.
    pub(crate) initializing: tokio::sync::Mutex<()>,
    pub(crate) rejects: Arc<Rejects>,
    pub(crate) activity: Arc<super::Activity>,
}

fn plain(status: StatusCode, text: &'static str) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *r.status_mut() = status;
    r
}

/// The host part of a `Host` value or of an origin's authority, lowercased:
/// `[::1]:8765` → `::1`, `Example:80` → `example`; `[::1]x` → empty (no host).
pub(crate) fn host_of(authority: &str) -> String {
    let a = authority.trim();
    let h = if let Some(rest) = a.strip_prefix('[') {
        // After `]` only nothing or `:PORT`: `[::1]evil.example` is no host.
        match rest.split_once(']') {
            Some((h, "")) => h,
            Some((h, p))
                if p.len() > 1
                    && p[1..].bytes().all(|b| b.is_ascii_digit())
                    && p.starts_with(':') =>
            {
                h
            }
            _ => "",
        }
    } else if a.matches(':').count() > 1 {
        a // a bare IPv6 address has no port
    } else {
        a.rsplit_once(':')
            .filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
            .map_or(a, |(h, _)| h)
    };
    h.to_ascii_lowercase()
}

impl Front {
    /// The token in force; a replaced or unusable token file is said once,
    /// in the log and the audit log (never the token, only its digest).
    fn token_now(&self) -> Option<Arc<super::token::Token>> {
        let (token, change) = self.token.get();
        let (kind, detail) = match change {
            Change::None => return token,
            Change::Replaced(id) => {
                tracing::info!("--token-file changed: the token in force is now {id}");
                ("token_replaced", serde_json::json!({"token": id}))
            }
            Change::Unusable(why) => {
                tracing::error!("{why}: every request is refused until the file can be used");
                ("token_unusable", serde_json::json!({"why": why}))
            }
        };
        self.state
            .audit
            .event(crate::audit::Entry::event("(http)", Some(kind), &detail));
        token
    }

    fn allowed(&self, host: &str) -> bool {
        let h = host_of(host);
        !h.is_empty() && self.hosts.contains(&h)
    }

    /// Host must be allowed; an Origin, when present, must be http(s) on an
    /// allowed host (`null` and other schemes are refused).
    fn rebinding(&self, req: &Request<Incoming>) -> Option<Why> {
        // Two Host or two Origin headers: which one counts is ambiguous.
        if req.headers().get_all(hyper::header::HOST).iter().count() > 1 {
            return Some(Why::Host);
        }
        if req.headers().get_all(hyper::header::ORIGIN).iter().count() > 1 {
            return Some(Why::Origin);
        }
        let host = req
            .headers()
            .get(hyper::header::HOST)
            .and_then(|v| v.to_str().ok());
        if !host.is_some_and(|h| self.allowed(h)) {
            return Some(Why::Host);
        }
        let origin = req.headers().get(hyper::header::ORIGIN)?;
        let ok = origin
            .to_str()
            .ok()
            .and_then(|o| {
                o.strip_prefix("http://")
                    .or_else(|| o.strip_prefix("https://"))
            })
            .is_some_and(|auth| !auth.contains('/') && self.allowed(auth));
        (!ok).then_some(Why::Origin)
    }

    fn refuse(&self, why: Why, peer: SocketAddr) -> Answer {
        self.rejects.count(why, peer.ip());
        match why {
            Why::NoToken | Why::BadToken => {
                let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized\n");
                r.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    hyper::header::HeaderValue::from_static("Bearer"),
                );
                r
            }
            Why::Host | Why::Origin => plain(
                StatusCode::FORBIDDEN,
                "Forbidden: Host or Origin not allowed\n",
            ),
            Why::TooLarge => plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large\n"),
            Why::Sessions => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: the session cap is reached\n",
            ),
            Why::Busy => plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "Service Unavailable: too many requests at once\n",
            ),
            Why::NotFound => plain(StatusCode::NOT_FOUND, "Not Found\n"),
            Why::BadSession => plain(
                StatusCode::BAD_REQUEST,
                "Bad Request: Mcp-Session-Id must be visible ASCII\n",
            ),
            Why::HeaderMismatch => plain(StatusCode::BAD_REQUEST, "Bad Request\n"),
        }
    }

    fn ready(&self) -> Answer {
        self.rejects.probe();
        let ok = !self.state.shutdown.is_cancelled() && self.state.audit.status()["state"] == "ok";
        if ok {
            plain(StatusCode::OK, "ready\n")
        } else {
            plain(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
        }
    }

    /// The token in force, if the request shows it (`Authorization:
    /// Bearer`); else why it is refused (a 401).
    fn authorized(&self, req: &Request<Incoming>) -> Result<Option<Arc<super::token::Token>>, Why> {
        let auth = req.headers().get(&self.token_header).map(|v| v.as_bytes());
        let token = self.token_now();
        if token.as_ref().is_some_and(|t| t.admits(auth)) {
            return Ok(token);
        }
        let why = if auth.is_none() {
            Why::NoToken
        } else {
            Why::BadToken
        };
        Err(why)
    }

    /// `GET /metrics` (behind the token, not audited: a scraper every few
    /// seconds would spend the audit budget; it reads counters only).
    fn metrics(&self) -> Answer {
        let text = crate::mcp::metrics::render(&self.state);
        let mut r = Response::new(Full::new(Bytes::from(text)).boxed());
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(crate::mcp::metrics::CONTENT_TYPE),
        );
        r
    }

    /// Serves one request.
    pub(crate) async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        authed: &std::sync::atomic::AtomicBool,
    ) -> Answer {
        if req.uri().path() == "/healthz" && req.method() == hyper::Method::GET {
            return self.ready();
        }
        if let Some(why) = self.rebinding(&req) {
            return self.refuse(why, peer);
        }
        let metrics = req.uri().path() == "/metrics" && req.method() == hyper::Method::GET;
        if req.uri().path() != "/mcp" && !metrics {
            return self.refuse(Why::NotFound, peer);
        }
        let token = match self.authorized(&req) {
            Ok(t) => t,
            Err(why) => return self.refuse(why, peer),
        };
        if metrics {
            return self.metrics();
        }
        // A connection that showed the token is never closed for room.
        authed.store(true, std::sync::atomic::Ordering::SeqCst);
        let sid = req.headers().get_all("mcp-session-id");
        if sid.iter().count() > 1 || sid.iter().any(|v| v.to_str().is_err()) {
            return self.refuse(Why::BadSession, peer);
        }
        let Ok(permit) = self.requests.clone().try_acquire_owned() else {
            return self.refuse(Why::Busy, peer);
        };
        let (mut parts, body) = req.into_parts();
        let Some(body) = self.body_of(&parts, body).await else {
            return self.refuse(Why::TooLarge, peer);
        };
        // SEP-2243 (2026-07-28): headers a proxy may route on match the body.
        if let Err(m) = super::headers::check(&parts.headers, &body) {
            self.rejects.count(Why::HeaderMismatch, peer.ip());
            return super::headers::answer(&m, &body);
        }
        parts.extensions.insert(Caller {
            addr: peer,
            token: token.map(|t| t.id.clone()).unwrap_or_default(),
        });
        self.forward(parts, body, permit, peer).await
    }

    /// The body, at most `max_body` bytes (a larger declared length is
    /// refused before any byte is read); `None`: too large.
    async fn body_of(&self, parts: &hyper::http::request::Parts, body: Incoming) -> Option<Bytes> {
        let max = self.limits.max_body;
        let declared = parts
            .headers
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return None;
        }
        Limited::new(body, max)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .ok()
    }

    /// Hands the request to rmcp (one `initialize` at a time, within the
    /// session limit); the answer holds the request's permit, its activity
    /// and its debt to the backlog until it is written.
    async fn forward(
        &self,
        mut parts: hyper::http::request::Parts,
        body: Bytes,
        permit: tokio::sync::OwnedSemaphorePermit,
        peer: SocketAddr,
    ) -> Answer {
        let debt = Arc::new(Debt::new(self.state.backlog.clone()));
        parts.extensions.insert(debt.clone());
        let is_get = parts.method == hyper::Method::GET;
        let init = is_initialize(&parts, &body);
        let req = Request::from_parts(parts, Full::new(body));
        let busy = (!is_get).then(|| self.activity.begin());
        let answer = if init {
            let _one = self.initializing.lock().await;
            if self.sessions.sessions.read().await.len() >= self.limits.max_sessions {
                return self.refuse(Why::Sessions, peer);
            }
            self.mcp.handle(req).await
        } else {
            self.mcp.handle(req).await
        };
        let (parts, body) = answer.into_parts();
        let held = Held {
            inner: body,
            _permit: permit,
            _busy: busy,
            debt,
        };
        Response::from_parts(parts, held.boxed())
    }
}

/// An `initialize` request that starts a session (no session id yet).
fn is_initialize(parts: &hyper::http::request::Parts, body: &Bytes) -> bool {
    if parts.method != hyper::Method::POST || parts.headers.contains_key("mcp-session-id") {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Method>(body).is_ok_and(|m| m.method.as_deref() == Some("initialize"))
}

/// A response body that holds the request's place under the cap until its
/// last byte is written, and pays its answer's debt off the backlog (answers
/// owed to clients, `mcp::backlog`) as it writes, and in full when dropped.
struct Held {
    inner: http_body_util::combinators::BoxBody<Bytes, Infallible>,
    _permit: OwnedSemaphorePermit,
    _busy: Option<super::Busy>,
    debt: Arc<Debt>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.debt.close();
    }
}

impl Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                self.debt.pay(d.len());
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts_without_ports() {
        assert_eq!(host_of("127.0.0.1:8765"), "127.0.0.1");
        assert_eq!(host_of("[::1]:80"), "::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
        assert_eq!(host_of("LocalHost"), "localhost");
        assert_eq!(host_of("sandmux-abc.agents.svc"), "sandmux-abc.agents.svc");
        assert_eq!(host_of("evil.example:x"), "evil.example:x");
        assert_eq!(host_of("[::1]evil.example"), "");
        assert_eq!(host_of("[::1]:"), "");
        assert_eq!(host_of("[::1]:x"), "");
        assert_eq!(host_of("[::1]"), "::1");
    }
}
