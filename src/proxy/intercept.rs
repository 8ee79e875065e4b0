//! An intercepted tunnel (a host a credential is sent to): the sandbox's TLS
//! ends here with a certificate from the instance's CA, each HTTP/1.1
//! request is read with `hyper`, checked and forwarded over TLS verified as
//! any client would (the host's roots and `upstream_ca`), on one upstream
//! connection per tunnel. A request must stay on the tunnel's host; a
//! placeholder in its URL or body is refused, in its headers it is replaced
//! by the real value (when the host is one of that credential's); the
//! answer is asked for without encoding and has every real value replaced
//! by its placeholder. The first refusal answers the request and closes the
//! tunnel; it is the connection's event.

use super::credentials::{Refused, Vault};
use super::echo::{Cut, Masks};
use super::scan::{BoxError, Filtered, Slot};
use super::serve::{dial, Refusal};
use super::watched::{Traffic, Watched};
use super::{name, Config, Event};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::timeout;

type Out = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// Most headers of one request a credential is put into.
const MAX_PUT: usize = 4;
type Up = SendRequest<Filtered<Incoming>>;

/// One intercepted tunnel.
struct Tunnel {
    host: String,
    port: u16,
    to: SocketAddr,
    idle: Duration,
    vault: Arc<Vault>,
    /// The first refusal (a body's is found while it streams).
    refused: Slot,
    up: tokio::sync::Mutex<Option<Up>>,
    requests: AtomicU64,
}

/// Serves an intercepted tunnel whose ClientHello (`first`) named `host`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn intercept(
    s: &mut TcpStream,
    first: Vec<u8>,
    cfg: &Config,
    vault: &Arc<Vault>,
    host: &str,
    port: u16,
    to: SocketAddr,
    ev: &mut Event,
) -> Result<(), Refusal> {
    let server = vault.tls.server_for(host).map_err(|e| (0, e.to_string()))?;
    let io = Watched::new(first, s);
    let traffic = io.traffic.clone();
    let accept = tokio_rustls::TlsAcceptor::from(server).accept(io);
    let tls = match timeout(cfg.idle, accept).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return Err((0, format!("the sandbox's TLS handshake for {host} (intercepted for a credential) failed: {e}; the client must trust the instance's CA (SSL_CERT_FILE)"))),
        Err(_) => return Err((0, format!("no TLS handshake for {host} within {} s", cfg.idle.as_secs()))),
    };
    let t = Arc::new(Tunnel {
        host: host.to_string(),
        port,
        to,
        idle: cfg.idle,
        vault: vault.clone(),
        refused: Slot::default(),
        up: Default::default(),
        requests: AtomicU64::new(0),
    });
    let svc = {
        let t = t.clone();
        hyper::service::service_fn(move |req| exchange(t.clone(), req))
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.idle)
        .max_buf_size(cfg.header_bytes.max(8192))
        .serve_connection(TokioIo::new(tls), svc);
    tokio::select! {
        _ = conn => {}
        _ = idle(&traffic, cfg.idle) => {}
    }
    ev.bytes_up = traffic.up.load(Ordering::Relaxed);
    ev.bytes_down = traffic.down.load(Ordering::Relaxed);
    ev.requests = Some(t.requests.load(Ordering::Relaxed));
    let refused = t.refused.lock().unwrap_or_else(|p| p.into_inner()).take();
    match refused {
        Some(r) => {
            ev.ours = true;
            ev.exfiltration = r.exfiltration;
            Err((0, r.why))
        }
        None => Ok(()),
    }
}

/// Ends when `idle` passed without a byte either way.
async fn idle(traffic: &Traffic, idle: Duration) {
    let start = std::time::Instant::now();
    loop {
        let last = Duration::from_millis(traffic.last_ms.load(Ordering::Relaxed));
        let quiet = start.elapsed().saturating_sub(last);
        if quiet >= idle {
            return;
        }
        tokio::time::sleep(idle - quiet).await;
    }
}

async fn exchange(t: Arc<Tunnel>, req: Request<Incoming>) -> Result<Response<Out>, BoxError> {
    t.requests.fetch_add(1, Ordering::Relaxed);
    let r = forward(&t, req).await;
    // A refusal found in a body while the answer was on its way wins.
    let late = t.refused.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match (r, late) {
        (_, Some(r)) | (Err(r), None) => {
            let mut g = t.refused.lock().unwrap_or_else(|p| p.into_inner());
            g.get_or_insert(r.clone());
            Ok(refusal(&r))
        }
        (Ok(resp), None) => Ok(resp),
    }
}

fn refusal(r: &Refused) -> Response<Out> {
    let body = Full::new(Bytes::from(format!("{}\n", r.why)))
        .map_err(|never| match never {})
        .boxed();
    let mut resp = Response::new(body);
    *resp.status_mut() =
        hyper::StatusCode::from_u16(r.code).unwrap_or(hyper::StatusCode::FORBIDDEN);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    h.insert("x-sandmux-proxy", HeaderValue::from_static("refused"));
    resp
}

fn refused(code: u16, why: String) -> Refused {
    Refused {
        code,
        why: format!("sandmux proxy: {why}"),
        exfiltration: false,
    }
}

/// Headers never forwarded either way (hop-by-hop, the proxy's, and those
/// the proxy sets itself).
fn hop(n: &HeaderName) -> bool {
    let s = n.as_str();
    matches!(
        s,
        "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "accept-encoding"
            | "range"
            | "if-range"
    ) || s.starts_with("proxy-")
}

/// Header values a credential was put into: (as sent upstream, as the
/// sandbox wrote it).
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

async fn forward(t: &Arc<Tunnel>, req: Request<Incoming>) -> Result<Response<Out>, Refused> {
    t.same_host(&req)?;
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    t.vault.refuse_in(pq.as_bytes(), &t.host, "in the URL")?;
    let head = req.method() == hyper::Method::HEAD;
    let (parts, body) = req.into_parts();
    let mut up = Request::builder().method(parts.method).uri(pq.as_str());
    let h = up
        .headers_mut()
        .ok_or_else(|| refused(400, "the request cannot be forwarded".into()))?;
    t.host_header(h)?;
    let (sent, pairs) = t.put_headers(h, &parts.headers)?;
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let body = Filtered::guard(body, t.vault.clone(), &t.host, t.refused.clone());
    let req = up
        .body(body)
        .map_err(|e| refused(400, format!("the request cannot be forwarded: {e}")))?;
    let mut g = t.up.lock().await;
    let resp = t.send(&mut g, req).await?;
    if resp.status() == hyper::StatusCode::UNAUTHORIZED && !pairs.is_empty() {
        // A short-lived (`from_command`) value the host refused: refreshed.
        t.vault.rejected(&pairs);
    }
    answer(t, resp, head, sent)
}

impl Tunnel {
    /// `Host`: the tunnel's host, with its port unless HTTPS's.
    fn host_header(&self, h: &mut hyper::HeaderMap) -> Result<(), Refused> {
        let host = if self.port == name::CONNECT_PORT {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        };
        h.insert(
            header::HOST,
            HeaderValue::from_str(&host).map_err(|_| refused(400, "the host".into()))?,
        );
        Ok(())
    }

    /// The agent's headers (hop-by-hop ones dropped) into `h`: credential
    /// headers go first, right after Host, with the real value put in, so
    /// the agent's headers cannot move where they stand (see `echo`); then
    /// the rest. Returns the cuts sent and the values put in.
    fn put_headers(
        &self,
        h: &mut hyper::HeaderMap,
        headers: &hyper::HeaderMap,
    ) -> Result<(Vec<Cut>, Pairs), Refused> {
        let (mut sent, mut pairs) = (Vec::new(), Vec::new());
        let mut rest = Vec::new();
        for (k, v) in headers.iter().filter(|(k, _)| !hop(k)) {
            match self.vault.header(k.as_str(), v.as_bytes(), &self.host)? {
                Some(n) => {
                    sent.push(Cut::of(k.as_str(), &n, v.as_bytes()));
                    pairs.push((n.clone(), v.as_bytes().to_vec()));
                    let n = HeaderValue::from_bytes(&n)
                        .map_err(|_| refused(400, "a header cannot carry the credential".into()))?;
                    h.append(k.clone(), n);
                }
                None => rest.push((k.clone(), v.clone())),
            }
        }
        if sent.len() > MAX_PUT {
            return Err(refused(
                400,
                format!("more than {MAX_PUT} headers carry a credential"),
            ));
        }
        for (k, v) in rest {
            h.append(k, v);
        }
        Ok((sent, pairs))
    }

    /// Sends the request on the tunnel's upstream connection `g` (made
    /// again when there is none or it closed; dropped when sending fails),
    /// within the idle time.
    async fn send(
        &self,
        g: &mut Option<Up>,
        req: Request<Filtered<Incoming>>,
    ) -> Result<Response<Incoming>, Refused> {
        if g.as_ref().is_none_or(|s| s.is_closed()) {
            *g = Some(self.connect().await?);
        }
        let Some(sender) = g.as_mut() else {
            return Err(refused(502, "no upstream connection".into()));
        };
        match timeout(self.idle, sender.send_request(req)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                *g = None;
                Err(refused(502, format!("{}: {e}", self.host)))
            }
            Err(_) => Err(refused(
                504,
                format!(
                    "{} did not answer within {} s",
                    self.host,
                    self.idle.as_secs()
                ),
            )),
        }
    }
}

impl Tunnel {
    /// The request names the tunnel's host (its absolute URL and its `Host`
    /// header, when given): a kept-alive connection is not re-targeted.
    fn same_host(&self, req: &Request<Incoming>) -> Result<(), Refused> {
        let mut named: Vec<&str> = Vec::new();
        if let Some(a) = req.uri().authority() {
            named.push(a.as_str());
        }
        let hosts: Vec<&HeaderValue> = req.headers().get_all(header::HOST).iter().collect();
        if hosts.len() > 1 {
            return Err(refused(400, "more than one Host header".into()));
        }
        for v in hosts {
            named.push(
                v.to_str()
                    .map_err(|_| refused(400, "Host is not text".into()))?,
            );
        }
        for a in named {
            let ok = name::split_port(a).ok().and_then(|(h, p)| {
                let h = name::canonical(h).ok()?;
                Some(h == self.host && p.unwrap_or(name::CONNECT_PORT) == self.port)
            });
            if ok != Some(true) {
                return Err(refused(421, format!("this tunnel is to {}:{}; a request on it for another host is refused (open a new connection for it)", self.host, self.port)));
            }
        }
        Ok(())
    }

    /// The upstream connection: the checked address, TLS verified for the
    /// host.
    async fn connect(&self) -> Result<Up, Refused> {
        let cfg_idle = self.idle;
        let tcp = dial_idle(self.to, cfg_idle).await?;
        let sn = rustls::pki_types::ServerName::try_from(self.host.clone())
            .map_err(|e| refused(502, format!("{}: {e}", self.host)))?;
        let c = tokio_rustls::TlsConnector::from(self.vault.tls.upstream.clone());
        let tls = match timeout(cfg_idle, c.connect(sn, tcp)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(refused(502, format!("TLS to {} ({}) failed: {e} (a private CA upstream goes in [network] upstream_ca)", self.host, self.to))),
            Err(_) => return Err(refused(504, format!("TLS to {} timed out", self.host))),
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| refused(502, format!("{}: {e}", self.host)))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

async fn dial_idle(to: SocketAddr, idle: Duration) -> Result<TcpStream, Refused> {
    dial(idle, to).await.map_err(|(code, why)| Refused {
        code,
        why,
        exfiltration: false,
    })
}

/// The upstream's answer on its way down: not encoded (or refused), every
/// real value replaced by its placeholder, its length left to the framing.
fn answer(
    t: &Tunnel,
    resp: Response<Incoming>,
    head: bool,
    sent: Vec<Cut>,
) -> Result<Response<Out>, Refused> {
    let (mut parts, body) = resp.into_parts();
    let encoded = parts
        .headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .chain(parts.headers.get_all(header::TRANSFER_ENCODING).iter())
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|c| c.trim_ascii())
        .any(|c| {
            !c.is_empty()
                && !c.eq_ignore_ascii_case(b"identity")
                && !c.eq_ignore_ascii_case(b"chunked")
        });
    if encoded {
        return Err(refused(502, format!("{} answered with an encoded body (Content-Encoding or Transfer-Encoding) although the proxy asked for none: an encoded answer cannot be checked for a credential's value", t.host)));
    }
    // The upstream's own reason phrase (hyper keeps a non-standard one) is
    // not passed on: the standard one for the code is.
    parts.extensions = Default::default();
    let masks = Masks {
        whole: t.vault.masks(&[]),
        cuts: t.vault.sent.with(sent),
    };
    let mut headers = hyper::HeaderMap::new();
    for (k, v) in parts.headers.iter() {
        if hop(k) || (k == header::CONTENT_LENGTH && !head) {
            continue;
        }
        // A header whose name holds a value (in any case) is dropped.
        if super::echo::in_name(k.as_str().as_bytes(), &masks) {
            continue;
        }
        let mut b = v.as_bytes().to_vec();
        let b = super::scan::masked(&mut b, &masks, true);
        if let Ok(v) = HeaderValue::from_bytes(&b) {
            headers.append(k.clone(), v);
        }
    }
    parts.headers = headers;
    // The version is this hop's own: the upstream's (HTTP/1.0 closes after
    // each answer) does not end the sandbox's kept-alive connection.
    parts.version = hyper::Version::HTTP_11;
    Ok(Response::from_parts(
        parts,
        Filtered::mask(body, masks).boxed(),
    ))
}
