//! Serving the proxy's listener: one task per connection, at most
//! `max_connections` at once (more are answered 503 and closed), every read
//! and write bounded by the idle timeout, nothing buffered beyond a request
//! head, a ClientHello and one copy buffer per direction.

use super::addr::Cidr;
use super::ask::{Hooks, Verdict};
use super::credentials::Vault;
use super::head::{self, Parsed, Request};
use super::hello::{self, Hello};
use super::{addr, name, Config, Event, Sink};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

/// Copy buffer per direction.
const BUF: usize = 16 * 1024;

/// Serves `listener` until the task is dropped; `open` counts the
/// connections being served (whose event comes when they end).
pub(crate) async fn serve(
    listener: TcpListener,
    cfg: Arc<Config>,
    sink: Sink,
    open: Arc<AtomicUsize>,
    hooks: Hooks,
) {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    loop {
        let s = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors, most likely: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let (cfg, sink, open) = (cfg.clone(), sink.clone(), open.clone());
                let hooks = hooks.clone();
                open.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let ev = connection(s, &cfg, &hooks).await;
                    drop(permit);
                    sink(ev);
                    open.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Err(_) => {
                let msg = format!(
                    "sandmux proxy: more than {} connections at once; try again later",
                    cfg.max_connections
                );
                // Never waits: a refused connection costs nothing.
                let _ = s.try_write(&response(503, &msg));
                sink(Event {
                    method: "-".into(),
                    host: String::new(),
                    port: 0,
                    address: None,
                    denied: Some(format!(
                        "over the cap of {} connections",
                        cfg.max_connections
                    )),
                    decides: Some(DECIDES_CAP),
                    decides_said: false,
                    ours: true,
                    bytes_up: 0,
                    bytes_down: 0,
                    duration: Duration::ZERO,
                    requests: None,
                    exfiltration: false,
                    approved: false,
                });
            }
        }
    }
}

/// An HTTP answer from the proxy itself.
fn response(code: u16, msg: &str) -> Vec<u8> {
    let reason = match code {
        403 => "Forbidden",
        411 => "Length Required",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Bad Request",
    };
    let body = format!("{msg}\n");
    format!("HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nX-Sandmux-Proxy: refused\r\n\r\n{body}", body.len()).into_bytes()
}

/// One connection, start to end: its decision as an event.
async fn connection(mut s: TcpStream, cfg: &Config, hooks: &Hooks) -> Event {
    let t0 = Instant::now();
    let _ = s.set_nodelay(true);
    let mut ev = Event {
        method: "-".into(),
        host: String::new(),
        port: 0,
        address: None,
        denied: None,
        decides: None,
        decides_said: false,
        ours: false,
        bytes_up: 0,
        bytes_down: 0,
        duration: Duration::ZERO,
        requests: None,
        exfiltration: false,
        approved: false,
    };
    if let Err((code, why)) = decide_and_pass(&mut s, cfg, hooks, &mut ev).await {
        if code != 0 {
            let _ = timeout(cfg.idle, s.write_all(&response(code, &why))).await;
        }
        ev.denied = Some(why);
    }
    ev.duration = t0.elapsed();
    ev
}

/// The profile key that decides a name refused as not on the list.
pub(crate) const DECIDES_NAME: &str = "network.allow";
/// The profile key that decides an address refused by its range.
pub(crate) const DECIDES_RANGE: &str = "network.allow (an entry's ranges) or network.allow_private";
/// The profile key that decides a connection over the cap.
pub(crate) const DECIDES_CAP: &str = "network.proxy_connections";

/// A refusal: the status to answer (0 once the tunnel is open) and why.
pub(super) type Refusal = (u16, String);

async fn decide_and_pass(
    s: &mut TcpStream,
    cfg: &Config,
    hooks: &Hooks,
    ev: &mut Event,
) -> Result<(), Refusal> {
    // The head and (for a tunnel) the ClientHello, together, must come
    // within one idle time of the accept: a client trickling a byte at a
    // time cannot hold a slot for longer.
    let mut by = tokio::time::Instant::now() + cfg.idle;
    let mut buf = Vec::with_capacity(1024);
    let req = read_head(s, cfg, &mut buf, by).await?;
    ev.method = req.method.clone();
    ev.host = req.host.clone();
    ev.port = req.port;
    let default = if req.forward.is_some() {
        name::HTTP_PORT
    } else {
        name::CONNECT_PORT
    };
    let ranges = match name::allowed(&cfg.allow, &req.host, req.port, default) {
        Some(r) => r,
        None => {
            ask(hooks, &cfg.ask_ports, &req, s, ev).await?;
            // The wait for an answer does not count against the client.
            by = tokio::time::Instant::now() + cfg.idle;
            vec![]
        }
    };
    let to = resolve(cfg, &req.host, req.port, &ranges)
        .await
        .inspect_err(|(code, _)| {
            ev.ours = true;
            if *code == 403 {
                // `addr::check`'s reason names the allow entry's range.
                ev.decides = Some(DECIDES_RANGE);
                ev.decides_said = true;
            }
        })?;
    ev.address = Some(to);
    let rest = buf.split_off(req.len);
    let how = Pass {
        cfg,
        to,
        vault: hooks.vault.as_ref(),
    };
    match &req.forward {
        None => tunnel(s, &how, &req, rest, ev, by).await,
        Some((head, body)) => plain(s, &how, &req.host, head, *body, rest, ev).await,
    }
}

/// A name off the list: refused, or (`[network] ask`) held while a human
/// is asked.
async fn ask(
    hooks: &Hooks,
    ports: &[u16],
    req: &Request,
    s: &TcpStream,
    ev: &mut Event,
) -> Result<(), Refusal> {
    ev.decides = Some(DECIDES_NAME);
    ev.ours = true;
    let off = format!(
        "sandmux proxy: {}:{} is not in the profile's [network] allow list",
        req.host, req.port
    );
    let Some(asker) = &hooks.ask else {
        ev.decides_said = true;
        return Err((
            403,
            format!("{off}; the profile decides (sandmux profile show)"),
        ));
    };
    // The supervisor may dial only these (its own confinement): a question
    // about another port could never be answered with a connection.
    if !ports.contains(&req.port) {
        return Err((
            403,
            format!("{off}, and port {} is not one a question may be about ({ports:?}: [network] ask_ports)", req.port),
        ));
    }
    let scheme = if req.forward.is_some() {
        "http"
    } else {
        "https"
    };
    let answer = tokio::select! {
        v = asker(scheme, req.host.clone(), req.port) => v,
        () = closed(s) => return Err((0, "the client went away while a human was asked".into())),
    };
    match answer {
        Verdict::Allow => {
            ev.decides = None;
            ev.ours = false;
            ev.approved = true;
            Ok(())
        }
        Verdict::Deny(why) => Err((403, format!("{off}, and {why}"))),
    }
}

/// Resolves when the client closes (bytes it sends meanwhile are left to
/// be read: then this never resolves).
async fn closed(s: &TcpStream) {
    let mut b = [0u8; 1];
    if s.readable().await.is_ok() && matches!(s.peek(&mut b).await, Ok(0) | Err(_)) {
        return;
    }
    std::future::pending::<()>().await
}

/// Reads until a whole head is in `buf`, at most `header_bytes`, by `by`.
async fn read_head(
    s: &mut TcpStream,
    cfg: &Config,
    buf: &mut Vec<u8>,
    by: Deadline,
) -> Result<Request, Refusal> {
    // A head ends at a newline: bytes without one are not parsed again (a
    // client sending one byte at a time costs no quadratic parsing).
    let mut fresh = 0;
    loop {
        if buf[buf.len() - fresh..].contains(&b'\n') {
            match head::parse(buf) {
                Parsed::Done(r) => return Ok(r),
                Parsed::Bad(code, why) => return Err((code, format!("sandmux proxy: {why}"))),
                Parsed::More => {}
            }
        }
        if buf.len() >= cfg.header_bytes {
            return Err((
                431,
                format!(
                    "sandmux proxy: request head over {} bytes ([network] proxy_header_bytes)",
                    cfg.header_bytes
                ),
            ));
        }
        let room = cfg.header_bytes - buf.len();
        fresh = read_some(s, cfg, buf, room.min(4096), by).await?;
        if fresh == 0 {
            return Err((0, "the client closed before a whole request head".into()));
        }
    }
}

/// When the head and ClientHello must be in.
type Deadline = tokio::time::Instant;

/// One read of at most `max` bytes appended to `buf`, by `by` (which is
/// never later than one idle time from now).
async fn read_some(
    s: &mut TcpStream,
    cfg: &Config,
    buf: &mut Vec<u8>,
    max: usize,
    by: Deadline,
) -> Result<usize, Refusal> {
    let at = buf.len();
    buf.resize(at + max, 0);
    let r = tokio::time::timeout_at(by, s.read(&mut buf[at..])).await;
    let n = match r {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            buf.truncate(at);
            return Err((0, format!("reading from the client: {e}")));
        }
        Err(_) => {
            buf.truncate(at);
            return Err((
                0,
                format!(
                    "no whole request head and ClientHello within {} s of the connection ([network] proxy_idle_seconds)",
                    cfg.idle.as_secs()
                ),
            ));
        }
    };
    buf.truncate(at + n);
    Ok(n)
}

/// The one address to dial: the pinned one, or the first the host's
/// resolver gives that the classifier passes. The name is asked for fully
/// qualified (a trailing dot): the resolver's `search` domains are never
/// appended (`x.allowed.test` must not become `x.allowed.test.corp.example`).
pub(super) async fn resolve(
    cfg: &Config,
    host: &str,
    port: u16,
    ranges: &[&Cidr],
) -> Result<SocketAddr, Refusal> {
    let fqdn = format!("{host}.");
    let ips: Vec<IpAddr> = match cfg.hosts.get(host) {
        Some(ip) => vec![*ip],
        None => match timeout(cfg.idle, tokio::net::lookup_host((fqdn.as_str(), port))).await {
            Ok(Ok(it)) => it.map(|a| a.ip()).collect(),
            Ok(Err(e)) => {
                return Err((
                    502,
                    format!("sandmux proxy: {} does not resolve on the host: {e}", host),
                ))
            }
            Err(_) => return Err((504, format!("sandmux proxy: resolving {} timed out", host))),
        },
    };
    let mut why = format!("sandmux proxy: {} has no address", host);
    let mut open = cfg.allow_private.clone();
    open.extend(ranges.iter().copied().copied());
    for ip in ips {
        match addr::check(ip, &open) {
            Ok(()) => return Ok(SocketAddr::new(ip, port)),
            Err(e) => why = format!("sandmux proxy: {} refused: {e}", host),
        }
    }
    Err((403, why))
}

/// Dials the checked address, within the idle time.
pub(super) async fn dial(idle: Duration, to: SocketAddr) -> Result<TcpStream, Refusal> {
    match timeout(idle, TcpStream::connect(to)).await {
        Ok(Ok(u)) => {
            // Relayed segments go out as they come (Nagle would hold the
            // small ones of a handshake for a delayed ACK).
            let _ = u.set_nodelay(true);
            Ok(u)
        }
        Ok(Err(e)) => Err((502, format!("sandmux proxy: connecting to {to}: {e}"))),
        Err(_) => Err((504, format!("sandmux proxy: connecting to {to} timed out"))),
    }
}

/// What a connection allowed through goes by.
struct Pass<'a> {
    cfg: &'a Config,
    /// The checked address.
    to: SocketAddr,
    /// The instance's credentials, if any.
    vault: Option<&'a Arc<Vault>>,
}

/// CONNECT: 200, then the ClientHello (its SNI must be the CONNECT host),
/// and only then the upstream; a host a credential is sent to is
/// intercepted ([`super::intercept`]).
async fn tunnel(
    s: &mut TcpStream,
    how: &Pass<'_>,
    req: &Request,
    mut first: Vec<u8>,
    ev: &mut Event,
    by: Deadline,
) -> Result<(), Refusal> {
    let (cfg, to) = (how.cfg, how.to);
    timeout(
        cfg.idle,
        s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n"),
    )
    .await
    .map_err(|_| (0, "idle while answering".to_string()))?
    .map_err(|e| (0, format!("answering the client: {e}")))?;
    loop {
        match hello::parse(&first) {
            Hello::Sni(sni) if sni == req.host => break,
            Hello::Sni(sni) => {
                return Err((
                    0,
                    format!(
                        "the ClientHello names {sni}, not the CONNECT host {}",
                        req.host
                    ),
                ))
            }
            Hello::Refused(why) => return Err((0, why)),
            Hello::More => {}
        }
        let room = hello::MAX_BYTES.saturating_sub(first.len()).max(1);
        if read_some(s, cfg, &mut first, room.min(4096), by).await? == 0 {
            return Err((0, "the client closed before a whole ClientHello".into()));
        }
    }
    // A credential goes only where the allow list leads, never to a name
    // a human allowed for this connection.
    if let Some(v) = how
        .vault
        .filter(|v| v.intercepts(&req.host) && !ev.approved)
    {
        let (host, port) = (req.host.as_str(), req.port);
        return super::intercept::intercept(s, first, cfg, v, host, port, to, ev).await;
    }
    ev.ours = true;
    let mut up = dial(cfg.idle, to).await.map_err(|(_, why)| (0, why))?;
    ev.ours = false;
    write(&mut up, cfg, &first).await?;
    ev.bytes_up = first.len() as u64;
    pump(s, &mut up, cfg.idle, None, ev).await;
    Ok(())
}

/// Plain HTTP: the rewritten head, exactly the body's length, then the
/// answer until the upstream closes. With credentials, a placeholder in the
/// head or the body is refused (a credential never goes over plain HTTP):
/// the body is then passed on holding back what could begin one.
async fn plain(
    s: &mut TcpStream,
    how: &Pass<'_>,
    host: &str,
    head: &[u8],
    body: u64,
    mut rest: Vec<u8>,
    ev: &mut Event,
) -> Result<(), Refusal> {
    let cfg = how.cfg;
    let refuse = |ev: &mut Event, r: super::credentials::Refused| {
        ev.ours = true;
        ev.exfiltration = r.exfiltration;
        (r.code, r.why)
    };
    const WHERE: &str = "over plain HTTP";
    if let Some(v) = how.vault {
        v.refuse_in(head, host, WHERE).map_err(|r| refuse(ev, r))?;
    }
    ev.ours = true;
    let mut up = dial(cfg.idle, how.to).await?;
    ev.ours = false;
    rest.truncate(body.min(rest.len() as u64) as usize);
    write(&mut up, cfg, head).await?;
    ev.bytes_up = head.len() as u64;
    let mut left = body - rest.len() as u64;
    let Some(v) = how.vault else {
        write(&mut up, cfg, &rest).await?;
        ev.bytes_up += rest.len() as u64;
        pump(s, &mut up, cfg.idle, Some(left), ev).await;
        return Ok(());
    };
    let mut held = rest;
    loop {
        v.refuse_in(&held, host, WHERE).map_err(|r| refuse(ev, r))?;
        let keep = if left == 0 {
            0
        } else {
            (super::credentials::PLACEHOLDER_LEN - 1).min(held.len())
        };
        let out: Vec<u8> = held.drain(..held.len() - keep).collect();
        write(&mut up, cfg, &out).await?;
        ev.bytes_up += out.len() as u64;
        if left == 0 {
            break;
        }
        let by = tokio::time::Instant::now() + cfg.idle;
        let n = read_some(s, cfg, &mut held, left.min(BUF as u64) as usize, by).await?;
        if n == 0 {
            return Err((0, "the client closed before the whole body".into()));
        }
        left -= n as u64;
    }
    pump(s, &mut up, cfg.idle, Some(0), ev).await;
    Ok(())
}

async fn write(up: &mut TcpStream, cfg: &Config, b: &[u8]) -> Result<(), Refusal> {
    match timeout(cfg.idle, up.write_all(b)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err((0, "writing to the upstream failed or timed out".into())),
    }
}

/// Copies both ways until the upstream closes or `idle` passes without
/// traffic; `up_left` caps what goes up (plain HTTP: the body's length).
async fn pump(
    c: &mut TcpStream,
    u: &mut TcpStream,
    idle: Duration,
    mut up_left: Option<u64>,
    ev: &mut Event,
) {
    let (mut cr, mut cw) = c.split();
    let (mut ur, mut uw) = u.split();
    let mut b1 = vec![0u8; BUF];
    let mut b2 = vec![0u8; BUF];
    let mut client_open = up_left != Some(0);
    loop {
        let cap = up_left.map_or(BUF, |l| l.min(BUF as u64) as usize);
        tokio::select! {
            r = cr.read(&mut b1[..cap]), if client_open => match r {
                Ok(n) if n > 0 => {
                    if !matches!(timeout(idle, uw.write_all(&b1[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                    ev.bytes_up += n as u64;
                    if let Some(l) = up_left.as_mut() {
                        *l -= n as u64;
                        client_open = *l > 0;
                    }
                }
                _ => {
                    client_open = false;
                    if up_left.is_none() {
                        let _ = uw.shutdown().await;
                    }
                }
            },
            r = ur.read(&mut b2) => match r {
                Ok(n) if n > 0 => {
                    if !matches!(timeout(idle, cw.write_all(&b2[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                    ev.bytes_down += n as u64;
                }
                _ => {
                    let _ = cw.shutdown().await;
                    return;
                }
            },
            _ = tokio::time::sleep(idle) => return,
        }
    }
}
