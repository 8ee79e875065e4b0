//! `sandmux serve --http ADDR`: the same tools, resources and prompts over
//! MCP's streamable HTTP transport at `/mcp` (rmcp's service, protocol
//! 2025-11-25 with sessions and the stateless 2026-07-28), behind our
//! [`front`] layer. One sandbox per process: rmcp's service factory runs per
//! session (and per request when stateless) and only hands out a handle to
//! the one instance's state; it never starts anything.
//!
//! The listener is bound before the supervisor confines itself, so its
//! confinement gains nothing: Landlock still denies every TCP bind and
//! connect, seccomp still refuses every socket family but `AF_UNIX`, and
//! `accept(2)` on the socket bound earlier is all the network it has.

pub(crate) mod front;
mod headers;
mod rejects;
pub(crate) mod router;
mod token;

use crate::mcp::ctx::State;
use crate::mcp::server::Server;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The longest token `sandmux token set` reads.
pub(crate) const TOKEN_MAX: usize = token::MAX_LEN;
/// Where `sandmux ps` says the token is, for an instance started `--unclaimed`.
const UNCLAIMED: &str = "none yet: --unclaimed, set with `sandmux token set ID`";
/// The names a Host or Origin may always carry.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// At the stop, answers in flight get up to this many steps to be written.
const DRAIN_STEPS: u32 = 200;
const DRAIN_STEP: Duration = Duration::from_millis(10);
/// Open connections allowed per allowed concurrent request.
const CONNECTIONS_PER_REQUEST: usize = 4;

/// The flags of `serve --http`.
#[derive(Debug, Clone)]
pub(crate) struct Flags {
    /// `IP:PORT` to listen on.
    pub addr: String,
    /// The Bearer token's file (required unless the address is loopback).
    pub token_file: Option<PathBuf>,
    /// More names a Host or Origin may carry (a Service name, a pod address).
    pub allowed_hosts: Vec<String>,
    /// The header the token comes in (default `Authorization`).
    pub token_header: Option<String>,
    /// Start without a token (`sandmux token set` gives it one).
    pub unclaimed: bool,
    /// What a request may take before the proxy in front gives up (seconds).
    pub upstream_timeout: Option<u64>,
}

/// The caps, from the profile's `[mcp]` `http_*` keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_body: usize,
    pub(crate) max_sessions: usize,
    pub(crate) max_requests: usize,
    pub(crate) idle: Option<Duration>,
}

impl Limits {
    fn of(p: &crate::profile::McpSettings) -> Limits {
        Limits {
            max_body: p.http_max_body_bytes as usize,
            max_sessions: p.http_max_sessions as usize,
            max_requests: p.http_max_requests as usize,
            idle: (p.http_idle_seconds > 0).then(|| Duration::from_secs(p.http_idle_seconds)),
        }
    }
}

/// `serve --http` checked before any sandbox exists.
pub(crate) struct Plan {
    addr: SocketAddr,
    token: Option<token::Token>,
    token_file: Option<PathBuf>,
    hosts: Vec<String>,
    behind: Behind,
}

/// What `serve --http` behind a router changes ([`router`]).
#[derive(Debug, Clone)]
pub(crate) struct Behind {
    /// Where the token is looked for.
    pub(crate) token_header: hyper::header::HeaderName,
    /// Started without a token.
    pub(crate) unclaimed: bool,
    /// Every wait stays under it.
    pub(crate) upstream: Option<Duration>,
}

/// Checks the flags: an `IP:PORT` address, a token file for any bind but
/// loopback (read and checked now), and plain host names.
pub(crate) fn plan(f: &Flags) -> Result<Plan, String> {
    let addr: SocketAddr = f.addr.parse().map_err(|_| {
        format!(
            "--http {:?}: expected IP:PORT, e.g. 127.0.0.1:8765 or [::]:8765",
            f.addr
        )
    })?;
    if !addr.ip().is_loopback() && f.token_file.is_none() && !f.unclaimed {
        return Err(format!("--http {addr} is not a loopback address: pass --token-file PATH, or --unclaimed to be given the token later with `sandmux token set` (a generated token is only for loopback binds)"));
    }
    if f.unclaimed && f.token_file.is_some() {
        return Err("--unclaimed and --token-file: pass one (--unclaimed: the token is set later with `sandmux token set`)".into());
    }
    let behind = Behind {
        token_header: match &f.token_header {
            Some(n) => router::token_header(n)?,
            None => hyper::header::AUTHORIZATION,
        },
        unclaimed: f.unclaimed,
        upstream: f
            .upstream_timeout
            .map(router::upstream_timeout)
            .transpose()?,
    };
    let token_file = f.token_file.as_deref().map(own_directory).transpose()?;
    let token = token_file
        .as_deref()
        .map(token::read)
        .transpose()
        .map_err(|e| e.to_string())?;
    let mut hosts: Vec<String> = LOOPBACK_NAMES.iter().map(|s| s.to_string()).collect();
    for h in &f.allowed_hosts {
        let n = h.trim().to_ascii_lowercase();
        let plain = !n.is_empty()
            && n.len() <= 253
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c));
        if !plain || front::host_of(&n) != n {
            return Err(format!("--allowed-host {h:?}: expected a host name or address without port, scheme or path"));
        }
        hosts.push(n);
    }
    Ok(Plan {
        addr,
        token,
        token_file,
        hosts,
        behind,
    })
}

/// A bound listener and its token, ready to serve once the runtime runs.
pub(crate) struct Listening {
    listener: std::net::TcpListener,
    token: Arc<token::Current>,
    /// Where the token is (the given file, or the generated one).
    pub(crate) token_file: PathBuf,
    /// What the supervisor reads after it confines itself: a given token
    /// file's directory, and its target's when it is a link (a rotated
    /// Secret replaces a link in that directory). None for a generated
    /// token, which is in the runtime directory.
    pub(crate) reads: Vec<PathBuf>,
    /// The URL clients use.
    pub(crate) url: String,
    hosts: Vec<String>,
    behind: Behind,
}

/// Binds the listener (before confinement) and, without `--token-file`,
/// writes a fresh token into the runtime directory.
pub(crate) fn open(plan: Plan, rundir: &Path, writable: &[PathBuf]) -> Result<Listening, String> {
    if let Some(f) = &plan.token_file {
        outside_the_sandbox(f, writable)?;
    }
    let listener =
        std::net::TcpListener::bind(plan.addr).map_err(|e| format!("--http {}: {e}", plan.addr))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("--http {}: {e}", plan.addr))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let (token, token_file, reads) = match (plan.token, plan.token_file) {
        (Some(t), Some(p)) => (token::Current::from_file(&p, t), p.clone(), dirs_of(&p)),
        _ if plan.behind.unclaimed => (
            token::Current::unclaimed(),
            PathBuf::from(UNCLAIMED),
            vec![],
        ),
        _ => {
            let p = rundir.join("http-token");
            let t = token::generate(&p).map_err(|e| e.to_string())?;
            (token::Current::fixed(t), p, vec![])
        }
    };
    Ok(Listening {
        listener,
        token: Arc::new(token),
        token_file,
        reads,
        url: format!("http://{local}/mcp"),
        hosts: plan.hosts,
        behind: plan.behind,
    })
}

/// `--token-file` as an absolute path in a directory other than `/`: that
/// directory stays readable to the confined supervisor (a rotated token is
/// read again), and `/` would open the whole file system.
fn own_directory(file: &Path) -> Result<PathBuf, String> {
    let abs =
        std::path::absolute(file).map_err(|e| format!("--token-file {}: {e}", file.display()))?;
    match abs.parent() {
        Some(d) if d != Path::new("/") => Ok(abs),
        _ => Err(format!("--token-file {}: keep the token in a directory of its own (not /): the confined supervisor keeps read access to that directory to read a rotated token again", file.display())),
    }
}

/// A token file the sandbox could write would let the agent choose the
/// token once it is read again: its directories must lie outside the
/// workspace and every read-write bind.
fn outside_the_sandbox(file: &Path, writable: &[PathBuf]) -> Result<(), String> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    for d in dirs_of(file) {
        let d = canon(&d);
        if let Some(w) = writable.iter().find(|w| d.starts_with(canon(w))) {
            return Err(format!(
                "--token-file {}: it is under {}, which the sandbox can write; keep the token outside the workspace and every read-write path",
                file.display(),
                w.display()
            ));
        }
    }
    Ok(())
}

/// A token file's directory, and its target's when it is a link (never `/`:
/// a link into `/` is not read again, and the file then admits nothing).
fn dirs_of(file: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = file.parent().map(Path::to_path_buf).into_iter().collect();
    let target = std::fs::canonicalize(file).ok();
    if let Some(d) = target.as_deref().and_then(Path::parent) {
        if d != Path::new("/") && !dirs.iter().any(|x| x == d) {
            dirs.push(d.to_path_buf());
        }
    }
    tracing::debug!(
        ?dirs,
        "the token file's directories stay readable to the supervisor"
    );
    dirs
}

/// What the operator endpoint reports (`sandmux ps`).
pub(crate) struct Info {
    url: String,
    token_file: PathBuf,
    /// The token in force (`sandmux token set` puts one in force).
    pub(crate) token: Arc<token::Current>,
    /// Requests in flight (a claim starts the idle clock).
    pub(crate) activity: Arc<Activity>,
    /// Every wait stays under it (`--upstream-timeout`).
    pub(crate) upstream: Option<Duration>,
    rejects: Arc<rejects::Rejects>,
    sessions: Arc<LocalSessionManager>,
}

impl Info {
    /// The URL, the token's file, the open sessions and the refusal counts.
    pub(crate) fn status(&self) -> Value {
        let sessions = self.sessions.sessions.try_read().map(|s| s.len()).ok();
        let mut v = json!({"url": self.url, "token_file": self.token_file, "sessions": sessions, "unclaimed": self.token.waiting(), "upstream_timeout": self.upstream.map(|d| d.as_secs())});
        if let (Value::Object(m), Value::Object(t)) = (&mut v, self.rejects.totals()) {
            m.extend(t);
        }
        v
    }

    /// Writes the last aggregated record of refusals.
    pub(crate) fn flush(&self, audit: &crate::audit::Audit) {
        self.rejects.flush(audit);
    }
}

/// Requests in flight and when the last one ended (the idle timeout).
pub(crate) struct Activity {
    inflight: AtomicUsize,
    last: Mutex<Instant>,
}

/// One request in flight, until its answer is written.
pub(crate) struct Busy(Arc<Activity>);

impl Activity {
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        Busy(self.clone())
    }

    /// The idle clock starts again now (an instance claimed).
    pub(crate) fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// How long nothing has been in flight (`None` while something is).
    fn idle_for(&self) -> Option<Duration> {
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        (self.inflight.load(Ordering::SeqCst) == 0).then(|| last.elapsed())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves until `shutdown`: the accept loop, the refusals' flush and the
/// idle timeout. Clients coming and going never end the instance.
pub(crate) async fn serve(
    state: Arc<State>,
    l: Listening,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let limits = Limits::of(&state.policy.mcp);
    // Cancelled once the answers in flight at the stop are written (a
    // `kill_server` call gets its answer).
    let sessions_end = CancellationToken::new();
    let (front, rejects, activity) = front_of(&state, &l, limits, sessions_end.clone());
    // tests/conformance/run.sh reads this line: it ends with the token's path.
    tracing::info!(
        "serving MCP at {} (Bearer token in {})",
        l.url,
        l.token_file.display()
    );
    let (st, sd) = (state.clone(), shutdown.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(rejects::FLUSH) => rejects.flush(&st.audit),
                _ = sd.cancelled() => return,
            }
        }
    });
    if let Some(idle) = limits.idle {
        tokio::spawn(idle_watch(
            state.clone(),
            (activity.clone(), l.token.clone()),
            idle,
            shutdown.clone(),
        ));
    }
    let r = accept(front, l.listener, limits, shutdown).await;
    for _ in 0..DRAIN_STEPS {
        if activity.idle_for().is_some() {
            break;
        }
        tokio::time::sleep(DRAIN_STEP).await;
    }
    sessions_end.cancel();
    r
}

/// The front every request passes (token, headers, limits) with rmcp's
/// service behind it, whose factory hands out the one instance's state (it
/// starts nothing); the instance learns where it is served (`state.http`).
fn front_of(
    state: &Arc<State>,
    l: &Listening,
    limits: Limits,
    sessions_end: CancellationToken,
) -> (Arc<front::Front>, Arc<rejects::Rejects>, Arc<Activity>) {
    let sessions = Arc::new(LocalSessionManager::default());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(l.hosts.clone())
        .with_max_request_body_bytes(limits.max_body)
        .with_cancellation_token(sessions_end);
    let st = state.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(Server { s: st.clone() }),
        sessions.clone(),
        config,
    );
    let rejects = Arc::new(rejects::Rejects::default());
    let activity = Arc::new(Activity {
        inflight: AtomicUsize::new(0),
        last: Mutex::new(Instant::now()),
    });
    let _ = state.http.set(Info {
        url: l.url.clone(),
        token_file: l.token_file.clone(),
        token: l.token.clone(),
        activity: activity.clone(),
        upstream: l.behind.upstream,
        rejects: rejects.clone(),
        sessions: sessions.clone(),
    });
    let front = Arc::new(front::Front {
        state: state.clone(),
        mcp,
        sessions,
        token: l.token.clone(),
        token_header: l.behind.token_header.clone(),
        hosts: l.hosts.clone(),
        limits,
        requests: Arc::new(tokio::sync::Semaphore::new(limits.max_requests)),
        initializing: Default::default(),
        rejects: rejects.clone(),
        activity: activity.clone(),
    });
    (front, rejects, activity)
}

/// Ends the instance once no request was in flight for `idle`.
/// An instance waiting `--unclaimed` is not idle: its clock starts at the claim.
async fn idle_watch(
    state: Arc<State>,
    (a, token): (Arc<Activity>, Arc<token::Current>),
    idle: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => return,
        }
        if !token.waiting() && a.idle_for().is_some_and(|d| d >= idle) {
            tracing::info!(
                "no MCP request for {} s ([mcp] http_idle_seconds): ending the instance",
                idle.as_secs()
            );
            state.audit.event(crate::audit::Entry::event(
                "(http-idle)",
                Some("idle_timeout"),
                &json!({"idle_seconds": idle.as_secs()}),
            ));
            shutdown.cancel();
            return;
        }
    }
}

/// One open connection: whether it has shown the token, and how to end it.
struct Conn {
    id: u64,
    authed: Arc<std::sync::atomic::AtomicBool>,
    kick: CancellationToken,
}

/// The open connections, oldest first.
type Open = Arc<Mutex<std::collections::VecDeque<Conn>>>;

/// Makes room for one more connection: when `cap` are open, the oldest that
/// has not shown the token is closed (so idle connections without a token
/// cannot lock everyone out, `/healthz` included); `false` if every one has.
fn room_for_one(open: &Open, cap: usize) -> bool {
    let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
    if o.len() < cap {
        return true;
    }
    let Some(i) = o.iter().position(|c| !c.authed.load(Ordering::SeqCst)) else {
        return false;
    };
    if let Some(c) = o.remove(i) {
        c.kick.cancel();
    }
    true
}

/// The accept loop: one task per connection (HTTP/1.1), at most
/// [`CONNECTIONS_PER_REQUEST`] × the request cap open at once.
async fn accept(
    front: Arc<front::Front>,
    listener: std::net::TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let cap = limits.max_requests * CONNECTIONS_PER_REQUEST;
    let open: Open = Default::default();
    let mut next = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of descriptors and the like: wait, never spin.
                Err(_) => { tokio::time::sleep(Duration::from_millis(100)).await; continue; }
            },
            _ = shutdown.cancelled() => return Ok(()),
        };
        if !room_for_one(&open, cap) {
            front.rejects.count(rejects::Why::Busy, peer.ip());
            continue;
        }
        next += 1;
        let (id, authed, kick) = (next, Arc::new(Default::default()), CancellationToken::new());
        open.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Conn {
                id,
                authed: Arc::clone(&authed),
                kick: kick.clone(),
            });
        // Answers go out in several writes (headers, SSE events): without
        // this, Nagle's algorithm holds each for the client's delayed ACK.
        let _ = stream.set_nodelay(true);
        let (f, open) = (front.clone(), open.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (f, authed) = (f.clone(), authed.clone());
                async move { Ok::<_, std::convert::Infallible>(f.handle(req, peer, &authed).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 << 10)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = kick.cancelled() => {}
            }
            open.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|c| c.id != id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_needs_a_directory_of_its_own() {
        assert!(own_directory(Path::new("/token"))
            .unwrap_err()
            .contains("not /"));
        let rel = own_directory(Path::new("secret/token")).unwrap();
        assert!(rel.is_absolute() && rel.ends_with("secret/token"));
        let d = tempfile::tempdir().unwrap();
        let (file, target) = (d.path().join("token"), d.path().join("t").join("token"));
        std::fs::create_dir(target.parent().unwrap()).unwrap();
        std::fs::write(&target, "x").unwrap();
        std::os::unix::fs::symlink(&target, &file).unwrap();
        assert_eq!(
            dirs_of(&file),
            vec![
                d.path().to_path_buf(),
                target.parent().unwrap().to_path_buf()
            ]
        );
    }
}
