//! `sandmux expose ID PORT`: a port the sandbox listens on, reachable from
//! the host's loopback, so a human can look at what the agent serves.
//!
//! Inbound only, and nothing new for the agent: the confined supervisor
//! gets no right to bind or connect (its Landlock and seccomp are as
//! before). The broker, unconfined, binds the host listener at the address
//! the operator chose (`127.0.0.1` unless `--address` says otherwise) and,
//! for each connection accepted there, makes one connection to
//! `127.0.0.1:PORT` inside the sandbox's network namespace
//! (`supervisor::nsconnect`); both descriptors come back over the broker's
//! descriptor channel and the supervisor relays bytes between them. The
//! agent chooses neither end: the host address and the inside port are
//! the operator's, fixed for the exposure's life. Each exposure is audited
//! (`exposed`, `unexposed` with its connection and byte counts), listed by
//! `ps`, ended by `sandmux revoke ID --expose PORT` and with the instance.

use super::shared::Shared;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// At most this many ports exposed at once.
pub(crate) const MAX_EXPOSURES: usize = 8;
/// At most this many relayed connections per exposure at once; more are
/// closed as they are accepted (8 × 16 × 2 descriptors stays far below a
/// usual limit of 1,024).
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// How long a connection inside may take to be accepted.
const CONNECT_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);
/// The lowest port an exposure uses, inside and on the host: an agent
/// without privileges listens on no lower port, and a host port below it
/// is a system service's.
pub(crate) const LOWEST_PORT: u16 = 1024;

/// One exposed port.
struct Exposure {
    host: SocketAddr,
    by: String,
    stop: CancellationToken,
    tally: Arc<Tally>,
}

/// What went through an exposure.
#[derive(Default)]
struct Tally {
    connections: AtomicU64,
    open: AtomicUsize,
    failed: AtomicU64,
    to_host: AtomicU64,
    to_sandbox: AtomicU64,
}

impl Tally {
    fn json(&self) -> Value {
        json!({
            "connections": self.connections.load(Ordering::Relaxed),
            "open": self.open.load(Ordering::Relaxed),
            "failed": self.failed.load(Ordering::Relaxed),
            "bytes_to_host": self.to_host.load(Ordering::Relaxed),
            "bytes_to_sandbox": self.to_sandbox.load(Ordering::Relaxed),
        })
    }
}

/// The instance's exposures, by the port inside.
#[derive(Default)]
pub(crate) struct Exposures(std::sync::Mutex<BTreeMap<u16, Exposure>>);

impl Exposures {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Exposure>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// As `ps` lists them.
    pub(crate) fn list(&self) -> Vec<Value> {
        self.lock()
            .iter()
            .map(|(port, e)| {
                json!({
                    "port": port,
                    "host": e.host.to_string(),
                    "loopback": e.host.ip().is_loopback(),
                    "by": e.by,
                    "tally": e.tally.json(),
                })
            })
            .collect()
    }
}

/// Why a port was not exposed, unexposed, or a connection not relayed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExposeError {
    /// `serve` runs no broker (`expose`).
    #[error(
        "this instance has no broker, which makes the connections: expose needs `sandmux serve`"
    )]
    NoBroker,
    /// The inside port is the allowlist proxy's.
    #[error("port {0} inside is sandmux's own allowlist proxy (network mode proxy): it is never exposed")]
    Proxy(u16),
    /// The port is exposed already, at `host`.
    #[error(
        "port {port} is already exposed at {host} (sandmux revoke ID --expose {port} ends it)"
    )]
    Already { port: u16, host: SocketAddr },
    /// [`MAX_EXPOSURES`] ports are exposed.
    #[error("{MAX_EXPOSURES} ports are exposed already; revoke one first")]
    Full,
    /// The port was exposed, or the bound reached, while the listener was made.
    #[error("port {0} was exposed meanwhile, or the bound was reached")]
    Raced(u16),
    /// `revoke --expose` of a port that is not exposed.
    #[error("port {0} is not exposed (sandmux ps lists what is)")]
    NotExposed(u16),
    /// The broker refused or failed.
    #[error(transparent)]
    Broker(#[from] crate::supervisor::broker::BrokerError),
    /// The blocking task that asked the broker did not finish.
    #[error("{0}")]
    Join(#[from] tokio::task::JoinError),
    /// A socket operation failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A connection came after the broker went (`relay`).
    #[error("no broker")]
    RelayNoBroker,
    /// The inside port did not accept within [`CONNECT_WITHIN`].
    #[error("port {0} inside did not accept within 5 s")]
    NoAccept(u16),
    /// The connection inside failed.
    #[error("port {port} inside: {source}")]
    Inside { port: u16, source: std::io::Error },
}

/// What an `expose` request asks, checked: the inside port, and the host
/// address to listen on.
pub(crate) fn checked(
    port: u16,
    host_port: Option<u16>,
    address: Option<&str>,
) -> Result<SocketAddr, String> {
    if port < LOWEST_PORT {
        return Err(format!(
            "port {port} inside: expose a port from {LOWEST_PORT} up (the agent has no privilege to listen lower)"
        ));
    }
    let hp = host_port.unwrap_or(0);
    if hp != 0 && hp < LOWEST_PORT {
        return Err(format!(
            "--host-port {hp}: choose one from {LOWEST_PORT} up, or leave it out for a free one"
        ));
    }
    let ip = match address {
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Some(a) => a.parse().map_err(|_| {
            format!(
                "--address {:?} is not an IP address (e.g. 127.0.0.1, or 0.0.0.0 for every interface)",
                crate::term::printable(a)
            )
        })?,
    };
    Ok(SocketAddr::new(ip, hp))
}

/// Exposes `port` at `host` (from [`checked`]); `by`: who asked.
pub(crate) async fn expose(
    s: &Arc<Shared>,
    port: u16,
    host: SocketAddr,
    by: &str,
) -> Result<Value, ExposeError> {
    let broker = s.broker.clone().ok_or(ExposeError::NoBroker)?;
    // The allowlist proxy listens inside on this port: exposed, anyone who
    // reaches the host port would send requests through it, with the
    // instance's credentials put in, on the agent's record.
    let proxy = crate::profile::allow::LISTEN.port();
    if port == proxy && s.policy.network.mode == crate::profile::NetMode::Proxy {
        return Err(ExposeError::Proxy(port));
    }
    {
        let all = s.exposures.lock();
        if let Some(e) = all.get(&port) {
            return Err(ExposeError::Already { port, host: e.host });
        }
        if all.len() >= MAX_EXPOSURES {
            return Err(ExposeError::Full);
        }
    }
    let fd = tokio::task::spawn_blocking(move || broker.listen(host)).await??;
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(std)?;
    let host = listener.local_addr()?;
    let stop = s.shutdown.child_token();
    let tally = Arc::new(Tally::default());
    {
        let mut all = s.exposures.lock();
        if all.contains_key(&port) || all.len() >= MAX_EXPOSURES {
            return Err(ExposeError::Raced(port));
        }
        let by = by.to_string();
        let (stop, tally) = (stop.clone(), tally.clone());
        all.insert(
            port,
            Exposure {
                host,
                by,
                stop,
                tally,
            },
        );
    }
    let args = json!({"port": port, "host": host.to_string(), "loopback": host.ip().is_loopback(), "by": by});
    s.audit.event(crate::audit::Entry::event(
        "(expose)",
        Some("exposed"),
        &args,
    ));
    tokio::spawn(accept_loop(s.clone(), port, listener, stop, tally));
    Ok(
        json!({"ok": true, "port": port, "host": host.to_string(), "url": format!("http://{host}/")}),
    )
}

/// Ends the exposure of `port`: its listener closes, its connections drop.
pub(crate) fn unexpose(s: &Shared, port: u16, why: &str) -> Result<Value, ExposeError> {
    let e = s
        .exposures
        .lock()
        .remove(&port)
        .ok_or(ExposeError::NotExposed(port))?;
    e.stop.cancel();
    let args =
        json!({"port": port, "host": e.host.to_string(), "why": why, "tally": e.tally.json()});
    s.audit.event(crate::audit::Entry::event(
        "(expose)",
        Some("unexposed"),
        &args,
    ));
    Ok(json!({"ok": true, "port": port, "host": e.host.to_string()}))
}

/// Accepts on the host side until the exposure ends; each connection is
/// relayed to the port inside.
async fn accept_loop(
    s: Arc<Shared>,
    port: u16,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
    tally: Arc<Tally>,
) {
    loop {
        let host = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok((h, _)) => h,
                Err(e) => {
                    tracing::warn!("expose {port}: accepting: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if tally.open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        tally.open.fetch_add(1, Ordering::Relaxed);
        tally.connections.fetch_add(1, Ordering::Relaxed);
        let (s, stop, tally) = (s.clone(), stop.clone(), tally.clone());
        tokio::spawn(async move {
            if let Err(e) = relay(&s, port, host, &stop, &tally).await {
                tally.failed.fetch_add(1, Ordering::Relaxed);
                tracing::info!("expose {port}: {e}");
            }
            tally.open.fetch_sub(1, Ordering::Relaxed);
        });
    }
    drop(listener);
    // Ended with the instance rather than by `revoke`: say so (and only
    // for this exposure: a revoke and a new expose of the same port since
    // is another one).
    let this = s
        .exposures
        .lock()
        .get(&port)
        .is_some_and(|e| Arc::ptr_eq(&e.tally, &tally));
    if !this {
        return;
    }
    let _ = unexpose(&s, port, "the instance ended");
}

/// One connection: the host's, and a new one to the port inside.
async fn relay(
    s: &Shared,
    port: u16,
    mut host: tokio::net::TcpStream,
    stop: &CancellationToken,
    tally: &Tally,
) -> Result<(), ExposeError> {
    let broker = s.broker.clone().ok_or(ExposeError::RelayNoBroker)?;
    let init = s.info().init_pid;
    let fd = tokio::task::spawn_blocking(move || broker.connect_inside(init, port)).await??;
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    let mut inside = tokio::net::TcpStream::from_std(std)?;
    // The connect was only started inside: it completes here, or not.
    match tokio::time::timeout(CONNECT_WITHIN, inside.writable()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(ExposeError::NoAccept(port)),
    }
    if let Some(source) = inside.take_error()? {
        return Err(ExposeError::Inside { port, source });
    }
    tokio::select! {
        _ = stop.cancelled() => Ok(()),
        r = tokio::io::copy_bidirectional(&mut host, &mut inside) => {
            let (up, down) = r?;
            tally.to_sandbox.fetch_add(up, Ordering::Relaxed);
            tally.to_host.fetch_add(down, Ordering::Relaxed);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::checked;

    #[test]
    fn only_what_the_operator_names_is_listened_on() {
        let a = checked(8000, None, None).unwrap();
        assert_eq!(a.to_string(), "127.0.0.1:0");
        assert_eq!(
            checked(8000, Some(9000), None).unwrap().to_string(),
            "127.0.0.1:9000"
        );
        assert!(checked(80, None, None).unwrap_err().contains("from 1024"));
        assert!(checked(0, None, None).is_err());
        assert!(checked(8000, Some(22), None)
            .unwrap_err()
            .contains("--host-port 22"));
        assert_eq!(
            checked(8000, None, Some("0.0.0.0"))
                .unwrap()
                .ip()
                .to_string(),
            "0.0.0.0"
        );
        assert!(!checked(8000, None, Some("evil\x1b[2J"))
            .unwrap_err()
            .contains('\x1b'));
        assert!(checked(8000, None, Some("localhost")).is_err());
    }
}
