//! `[network] mode = "proxy"`: the allowlist proxy the supervisor serves.
//!
//! The listening socket is made inside the sandbox's network namespace at
//! start-up (by `sandmux __init`, `sandbox::init`) and handed over; the
//! process that started the sandbox serves it ([`serve`]), so nothing inside
//! runs the proxy. Each connection is one decision: the request head
//! ([`head`]), the name against the list ([`name`]), the address it resolves
//! to on the host against the refused ranges ([`addr`]), and for a tunnel
//! the ClientHello's server name ([`hello`]). TLS is terminated only for a
//! host a credential is sent to ([`credentials`], `intercept`): the
//! sandbox's TLS ends at the proxy, with a certificate from the instance's
//! own CA ([`ca`]), and the placeholder is replaced in the headers.

pub(crate) mod ask;
pub(crate) mod ca;
pub(crate) mod credentials;
pub(crate) mod echo;
pub mod head;
pub mod hello;
mod intercept;
pub(crate) mod reach;
pub(crate) mod refusals;
pub(crate) mod scan;
mod serve;
mod shape;
pub(crate) mod tally;
mod watched;

/// The allowlist's vocabulary, with the configuration that lives in `profile`.
pub use crate::profile::allow::{addr, name};
pub(crate) use serve::serve;

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use crate::profile::allow::{url, Config};

/// One decision, reported when the connection ends (or is refused).
#[derive(Debug, Clone)]
pub(crate) struct Event {
    /// `CONNECT` or the plain request's method (`-` when none was read).
    pub method: String,
    /// The canonical name asked for (or what was refused as one).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address dialled, when allowed.
    pub address: Option<std::net::SocketAddr>,
    /// Why it was refused; None when allowed.
    pub denied: Option<String>,
    /// The profile key that decides a refusal the profile could lift.
    pub decides: Option<&'static str>,
    /// The reason already names the key that decides (its words say so):
    /// it is not named twice.
    pub decides_said: bool,
    /// The reason is sandmux's words, the canonical name and addresses
    /// only: nothing the client sent (a malformed head is quoted in the
    /// audit log, never in what the agent is told).
    pub ours: bool,
    /// Bytes from the sandbox to the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream to the sandbox.
    pub bytes_down: u64,
    /// How long the connection lasted.
    pub duration: Duration,
    /// Intercepted for a credential: the requests read on it.
    pub requests: Option<u64>,
    /// Refused because a credential's placeholder was where it does not
    /// belong.
    pub exfiltration: bool,
    /// Off the allow list, allowed by a human (`[network] ask`).
    pub approved: bool,
}

/// Where decisions go.
pub(crate) type Sink = Arc<dyn Fn(Event) + Send + Sync>;

/// Why the proxy could not start serving (`run`, `shell`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// Its tokio runtime could not be built.
    #[error("the proxy's runtime: {0}")]
    Runtime(std::io::Error),
    /// Its thread could not be started.
    #[error("the proxy's thread: {0}")]
    Thread(std::io::Error),
    /// Its thread's Landlock ruleset could not be prepared.
    #[error("confining the proxy's thread: Landlock: {0}")]
    Prepare(String),
    /// Its thread could not confine itself, so it serves nothing.
    #[error("confining the proxy's thread: {0}")]
    Confine(String),
    /// Its thread ended before it said whether it is confined.
    #[error("the proxy's thread ended before confining itself")]
    Gone,
}

/// Serves `listener` on a thread of its own until the process ends (`run`,
/// `shell`: their supervisor is not confined, so the thread confines
/// itself first — `confine::confine_this_thread` — and serves
/// nothing if it cannot); decisions are counted in the tally returned, for
/// [`summary`].
pub(crate) fn spawn_counted(
    listener: std::net::TcpListener,
    cfg: Config,
    policy: &crate::profile::Policy,
    hooks: ask::Hooks,
) -> Result<Arc<Mutex<tally::Tally>>, ProxyError> {
    use crate::confine;
    let t = Arc::new(Mutex::new(tally::Tally::default()));
    let open = t.lock().unwrap_or_else(|p| p.into_inner()).open.clone();
    let t2 = t.clone();
    let sink: Sink = Arc::new(move |ev| t2.lock().unwrap_or_else(|p| p.into_inner()).add(&ev));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProxyError::Runtime)?;
    let needs = confine::proxy_thread_needs(policy, dials(policy));
    let inet = needs.inet();
    let prepared =
        confine::prepare(policy, &needs).map_err(|e| ProxyError::Prepare(e.to_string()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("sandmux-proxy".into())
        .spawn(move || {
            let confined = confine::confine_this_thread(prepared, inet);
            let ok = confined.is_ok();
            let _ = tx.send(confined);
            if !ok {
                return;
            }
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(l, Arc::new(cfg), sink, open, hooks).await,
                    Err(e) => tracing::error!("the proxy's listener: {e}"),
                }
            })
        })
        .map_err(ProxyError::Thread)?;
    match rx.recv() {
        Ok(Ok(_)) => Ok(t),
        Ok(Err(e)) => Err(ProxyError::Confine(e.to_string())),
        Err(_) => Err(ProxyError::Gone),
    }
}

/// The summary `run` and `shell` print on stderr when they end.
pub(crate) fn summary(t: &Mutex<tally::Tally>) -> String {
    let t = t.lock().unwrap_or_else(|p| p.into_inner());
    let open = t.open.load(std::sync::atomic::Ordering::Relaxed);
    if t.map.is_empty() && open == 0 {
        return "sandmux: proxy: no connections".into();
    }
    let mut out = vec!["sandmux: proxy decisions:".to_string()];
    out.extend(t.summary());
    if open > 0 {
        out.push(format!(
            "  {open} connections still open at the end (not counted above)"
        ));
    }
    out.join("\n")
}

/// What the proxy dials for `policy`, for the supervisor's confinement
/// (nothing outside proxy mode).
pub(crate) fn dials(policy: &crate::profile::Policy) -> crate::confine::Dials {
    crate::confine::Dials {
        connect_tcp: ports(policy),
        udp: resolves(policy),
    }
}

/// Whether the proxy may have to ask the host's resolver (which asks its
/// name servers over UDP): an allow entry that is a `*.` suffix or a name
/// not pinned in `[network] hosts`, or `ask` (an approved name is resolved).
fn resolves(policy: &crate::profile::Policy) -> bool {
    if policy.network.mode != crate::profile::NetMode::Proxy {
        return false;
    }
    // An approved name is off the list: the host's resolver finds it.
    if policy.network.ask {
        return true;
    }
    Config::of(&policy.network)
        .map(|c| {
            c.allow
                .iter()
                .any(|r| r.suffix || !c.hosts.contains_key(&r.name))
        })
        .unwrap_or(true)
}

/// The ports the proxy may dial for `policy` (empty outside proxy mode):
/// the allow list's and, with `ask`, those a question may be about.
fn ports(policy: &crate::profile::Policy) -> Vec<u16> {
    if policy.network.mode != crate::profile::NetMode::Proxy {
        return vec![];
    }
    let cfg = Config::of(&policy.network);
    let mut v: Vec<u16> = cfg
        .map(|c| {
            c.allow
                .iter()
                .flat_map(|r| match r.port {
                    Some(p) => vec![p],
                    None => vec![name::CONNECT_PORT, name::HTTP_PORT],
                })
                // What a question may grant (`[network] ask`).
                .chain(c.ask_ports.iter().copied())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v.dedup();
    v
}
