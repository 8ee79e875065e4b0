//! Serving the proxy's listener: one task per connection, at most
//! `max_connections` at once (more are answered 503 and closed), every read
//! and write bounded by the idle timeout, nothing buffered beyond a request
//! head, a ClientHello and one copy buffer per direction.

use super::addr::Cidr;
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
                open.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let ev = connection(s, &cfg).await;
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
                    ours: true,
                    bytes_up: 0,
                    bytes_down: 0,
                    duration: Duration::ZERO,
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
async fn connection(mut s: TcpStream, cfg: &Config) -> Event {
    let t0 = Instant::now();
    let _ = s.set_nodelay(true);
    let mut ev = Event {
        method: "-".into(),
        host: String::new(),
        port: 0,
        address: None,
        denied: None,
        decides: None,
        ours: false,
        bytes_up: 0,
        bytes_down: 0,
        duration: Duration::ZERO,
    };
    if let Err((code, why)) = decide_and_pass(&mut s, cfg, &mut ev).await {
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

async fn decide_and_pass(s: &mut TcpStream, cfg: &Config, ev: &mut Event) -> Result<(), Refusal> {
    // The head and (for a tunnel) the ClientHello, together, must come
    // within one idle time of the accept: a client trickling a byte at a
    // time cannot hold a slot for longer.
    let by = tokio::time::Instant::now() + cfg.idle;
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
    let Some(ranges) = name::allowed(&cfg.allow, &req.host, req.port, default) else {
        ev.decides = Some(DECIDES_NAME);
        ev.ours = true;
        return Err((403, format!("sandmux proxy: {}:{} is not in the profile's [network] allow list; the profile decides (sandmux profile show)", req.host, req.port)));
    };
    let to = resolve(cfg, &req.host, req.port, &ranges)
        .await
        .inspect_err(|(code, _)| {
            ev.ours = true;
            if *code == 403 {
                ev.decides = Some(DECIDES_RANGE);
            }
        })?;
    ev.address = Some(to);
    let rest = buf.split_off(req.len);
    match &req.forward {
        None => tunnel(s, cfg, &req, to, rest, ev, by).await,
        Some((head, body)) => plain(s, cfg, to, head, *body, rest, ev).await,
    }
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
pub(super) async fn dial(cfg: &Config, to: SocketAddr) -> Result<TcpStream, Refusal> {
    match timeout(cfg.idle, TcpStream::connect(to)).await {
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

/// CONNECT: 200, then the ClientHello (its SNI must be the CONNECT host),
/// and only then the upstream.
async fn tunnel(
    s: &mut TcpStream,
    cfg: &Config,
    req: &Request,
    to: SocketAddr,
    mut first: Vec<u8>,
    ev: &mut Event,
    by: Deadline,
) -> Result<(), Refusal> {
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
    ev.ours = true;
    let mut up = dial(cfg, to).await.map_err(|(_, why)| (0, why))?;
    ev.ours = false;
    write(&mut up, cfg, &first).await?;
    ev.bytes_up = first.len() as u64;
    pump(s, &mut up, cfg.idle, None, ev).await;
    Ok(())
}

/// Plain HTTP: the rewritten head, exactly the body's length, then the
/// answer until the upstream closes.
async fn plain(
    s: &mut TcpStream,
    cfg: &Config,
    to: SocketAddr,
    head: &[u8],
    body: u64,
    mut rest: Vec<u8>,
    ev: &mut Event,
) -> Result<(), Refusal> {
    ev.ours = true;
    let mut up = dial(cfg, to).await?;
    ev.ours = false;
    rest.truncate(body.min(rest.len() as u64) as usize);
    write(&mut up, cfg, head).await?;
    write(&mut up, cfg, &rest).await?;
    ev.bytes_up = (head.len() + rest.len()) as u64;
    let left = body - rest.len() as u64;
    pump(s, &mut up, cfg.idle, Some(left), ev).await;
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
