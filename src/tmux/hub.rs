//! The hub: every tmux command of `sandmux serve` goes through one long-lived
//! control-mode client; pane output is observed through one watcher client per
//! session (tmux sends `%output` only for panes of the session a control client
//! is attached to), and kept per pane in a bounded ring that waits read from.
//!
//! The command client is attached to a hidden session, `_sandmux`, whose only
//! pane is kept dead (no process); tools never list or target it, so the agent cannot close the
//! connection the supervisor lives on. Watchers use tmux flow control
//! (`pause-after`), and each ring holds at most [`RING_BYTES`], so a pane that
//! floods output costs bounded memory.
//!
//! **Control clients connect in quiet.** tmux 3.3 marks a connecting client as
//! a control client before it has the state control clients write through,
//! and several notifications (`%sessions-changed`, `%client-detached`,
//! `%session-window-changed`, ...) are written to every control client
//! unchecked: one that fires while a control client is still identifying kills
//! the server (a NULL read in `control_write`). So a client is attached only
//! under the write side of [`Hub::quiet`], which every command holds the read
//! side of: no command of sandmux runs, and none is half-done, while a client
//! identifies; a watcher that is let go is waited for (its connection closed
//! and the server past it) before the next one attaches; and one task at a
//! time attaches watchers, so a session never gets two. What sandmux cannot
//! hold still is the panes' own life (a pane that exits at that very moment)
//! and a human's terminal detaching: see `docs/architecture.md`.

use super::client::{Client, Closing, TmuxError};
pub(crate) use super::cmd::Cmd;
use super::genesis::{self, Genesis};
use super::streams::Streams;
pub(crate) use super::streams::{Chunk, Tap, RING_BYTES};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// The hidden session the command client is attached to.
pub(crate) const CONTROL_SESSION: &str = "_sandmux";
/// Why an ended hub does not reconnect.
const ENDED: &str = "this server generation has ended";
/// A watcher's client flags.
pub(crate) const WATCH_FLAGS: &str = "ignore-size,pause-after=2";
/// Default bound for one tmux command.
pub(crate) const DEADLINE: Duration = Duration::from_secs(5);
/// How often the output of closed panes is looked for (and dropped one
/// interval later).
const PRUNE_EVERY: Duration = Duration::from_secs(5);
/// How long a client that was let go is waited for before the next attach.
const ENDED_WAIT: Duration = Duration::from_secs(2);

/// Why the hub could not start, make its sessions or watch them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HubError {
    /// The hub was shut down ([`ENDED`]).
    #[error("{ENDED}")]
    Ended,
    /// The command client could not be started.
    #[error("starting the control client: {0}")]
    Start(std::io::Error),
    /// The fresh quiet lock was taken.
    #[error("the hub: {0}")]
    Quiet(tokio::sync::TryLockError),
    /// Making the sessions failed.
    #[error(transparent)]
    Make(#[from] genesis::Failed),
    /// The server did not prove itself.
    #[error(transparent)]
    Genesis(#[from] genesis::GenesisError),
    /// A session's watcher could not be started.
    #[error("watching session {id}: {source}")]
    Watch { id: String, source: std::io::Error },
    /// A command failed.
    #[error(transparent)]
    Tmux(#[from] TmuxError),
}

/// Something every tool may want to know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HubEvent {
    /// Sessions were created or destroyed.
    SessionsChanged,
    /// The command connection to the server closed.
    ServerGone(String),
}

/// The connection to the sandboxed server.
pub(crate) struct Hub {
    tmux: PathBuf,
    socket: PathBuf,
    cmd: Mutex<Arc<Client>>,
    /// One reconnect at a time (concurrent callers wait and share it).
    reconnect: tokio::sync::Mutex<()>,
    watchers: Mutex<HashMap<String, Arc<Client>>>,
    /// Held for reading by every command, for writing while a control client
    /// attaches (see the module's documentation) and while the sessions are
    /// made.
    quiet: Arc<tokio::sync::RwLock<()>>,
    /// One watcher sync at a time.
    syncing: tokio::sync::Mutex<()>,
    /// Most watchers at once (the profile's `max_sessions`): the host never
    /// runs more than `1 + max_watchers` tmux clients for this instance.
    max_watchers: usize,
    streams: Arc<Streams>,
    /// Hub-wide events.
    pub events: broadcast::Sender<HubEvent>,
    /// The control session's and pane's ids, once made.
    control: std::sync::OnceLock<(String, String)>,
    /// How making the sessions went, once it is over.
    created: watch::Sender<Option<Result<(), String>>>,
    /// Set by [`Hub::shutdown`]: no client of this hub connects again (the
    /// socket may have a new generation's server by then).
    ended: std::sync::atomic::AtomicBool,
    /// Watchers between their start and their attach (ended by shutdown).
    attaching: Mutex<Vec<Arc<Client>>>,
    /// The sandbox is frozen (`sandmux freeze`): every command fails at once
    /// with [`TmuxError::Frozen`] instead of waiting on a stopped server,
    /// and the background work (pruning, resuming paused panes) waits.
    frozen: watch::Sender<bool>,
}

impl Hub {
    /// Starts the command client on the fresh server at `socket` and returns
    /// the hub at once. What the client makes there ([`Genesis`]) and the
    /// watchers follow in the background, in quiet, so every command waits
    /// for them; [`Hub::created`] tells how it went. At most `max_watchers`
    /// sessions get a watcher.
    pub(crate) async fn spawn(
        tmux: &Path,
        socket: &Path,
        genesis: Genesis,
        max_watchers: usize,
    ) -> Result<Arc<Hub>, HubError> {
        let (events, _) = broadcast::channel(64);
        let (ptx, prx) = tokio::sync::mpsc::unbounded_channel();
        let streams = Arc::new(Streams::new(events.clone(), ptx, "command"));
        let cmd = Client::start("command", tmux, socket, &genesis.argv(), streams.clone())
            .await
            .map_err(HubError::Start)?;
        let hub = Arc::new(Hub {
            tmux: tmux.to_path_buf(),
            socket: socket.to_path_buf(),
            cmd: Mutex::new(Arc::new(cmd)),
            reconnect: tokio::sync::Mutex::new(()),
            watchers: Mutex::new(HashMap::new()),
            quiet: Arc::new(tokio::sync::RwLock::new(())),
            syncing: tokio::sync::Mutex::new(()),
            max_watchers,
            streams,
            events,
            control: std::sync::OnceLock::new(),
            created: watch::channel(None).0,
            ended: std::sync::atomic::AtomicBool::new(false),
            attaching: Mutex::new(Vec::new()),
            frozen: watch::channel(false).0,
        });
        // A fresh lock: taken at once, before any command can ask for it.
        let quiet = hub
            .quiet
            .clone()
            .try_write_owned()
            .map_err(HubError::Quiet)?;
        tokio::spawn(Hub::create(hub.clone(), quiet, genesis, prx));
        Ok(hub)
    }

    /// The background half of [`Hub::spawn`].
    async fn create(
        hub: Arc<Hub>,
        quiet: tokio::sync::OwnedRwLockWriteGuard<()>,
        genesis: Genesis,
        paused: tokio::sync::mpsc::UnboundedReceiver<(String, u32)>,
    ) {
        // Whatever happens to this task, `created` is answered.
        struct Answer(Arc<Hub>);
        impl Drop for Answer {
            fn drop(&mut self) {
                self.0.created.send_if_modified(|r| match r {
                    None => {
                        *r = Some(Err("making the sessions ended early".into()));
                        true
                    }
                    Some(_) => false,
                });
            }
        }
        let _answer = Answer(hub.clone());
        let made = hub.make(&genesis).await;
        drop(quiet);
        let r = match made {
            Ok(made) => {
                let _ = hub.control.set(made.control);
                if let Some((id, w)) = made.first {
                    let mut watchers = hub.watchers.lock().unwrap_or_else(|p| p.into_inner());
                    watchers.insert(id, Arc::new(w));
                }
                tokio::spawn(Hub::resume_paused(Arc::downgrade(&hub), paused));
                tokio::spawn(Hub::follow_sessions(
                    Arc::downgrade(&hub),
                    hub.events.subscribe(),
                ));
                tokio::spawn(Hub::prune(Arc::downgrade(&hub), PRUNE_EVERY));
                hub.sync_watchers().await
            }
            Err(e) => Err(e),
        };
        if r.is_err() {
            hub.shutdown();
        }
        hub.created.send_replace(Some(r.map_err(|e| e.to_string())));
    }

    /// The sessions, through the command client; once more through a fresh
    /// one when the first ended unattached and the server proves ours.
    async fn make(&self, genesis: &Genesis) -> Result<genesis::Made, HubError> {
        let cmd = self.cmd.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (tmux, socket) = (&self.tmux, &self.socket);
        match genesis::make(&cmd, genesis, tmux, socket, self.streams.clone()).await {
            Err(genesis::Failed::Unattached(_)) => {}
            r => return Ok(r?),
        }
        genesis::prove(tmux, socket, genesis).await?;
        if self.is_ended() {
            return Err(HubError::Ended);
        }
        let argv = genesis.argv();
        let fresh = Client::start("command", tmux, socket, &argv, self.streams.clone())
            .await
            .map_err(HubError::Start)?;
        let fresh = Arc::new(fresh);
        *self.cmd.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(genesis::make(&fresh, genesis, tmux, socket, self.streams.clone()).await?)
    }

    /// Waits until the sessions are made and watched ([`Hub::spawn`]).
    pub(crate) async fn created(&self) -> Result<(), String> {
        let mut rx = self.created.subscribe();
        let r = match rx.wait_for(|r| r.is_some()).await {
            Ok(r) => r.clone().unwrap_or(Ok(())),
            Err(_) => Err("the hub ended while starting".into()),
        };
        r
    }

    /// The control session's id (`$N`), hidden from tools; empty until
    /// [`Hub::created`].
    pub(crate) fn control_session_id(&self) -> &str {
        self.control.get().map_or("", |(s, _)| s.as_str())
    }

    /// Its one pane's id (`%N`), never a tool's target; empty until
    /// [`Hub::created`].
    pub(crate) fn control_pane_id(&self) -> &str {
        self.control.get().map_or("", |(_, p)| p.as_str())
    }

    /// Paused panes are resumed at once: the reader is already past them.
    async fn resume_paused(
        weak: std::sync::Weak<Hub>,
        mut paused: tokio::sync::mpsc::UnboundedReceiver<(String, u32)>,
    ) {
        while let Some((client, pane)) = paused.recv().await {
            let Some(hub) = weak.upgrade() else { break };
            let w = hub
                .watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .find(|c| c.name() == client)
                .cloned();
            let Some(w) = w else { continue };
            // Not while frozen: a refusal would leave the pane paused.
            hub.thawed().await;
            // A deadline that passes here ends the watcher: not while a
            // client identifies.
            let _q = hub.quiet.read().await;
            let resume = Cmd::new("refresh-client").opt("-A", format!("%{pane}:continue"));
            let _ = w.run(&resume.line(), DEADLINE).await;
        }
    }

    /// New sessions (also ones a human makes) get a watcher.
    async fn follow_sessions(weak: std::sync::Weak<Hub>, mut rx: broadcast::Receiver<HubEvent>) {
        while let Ok(HubEvent::SessionsChanged) | Err(broadcast::error::RecvError::Lagged(_)) =
            rx.recv().await
        {
            let Some(hub) = weak.upgrade() else { break };
            let _ = hub.sync_watchers().await;
        }
    }

    /// Runs one command with the default deadline.
    pub(crate) async fn run(&self, cmd: &Cmd) -> Result<Vec<Vec<u8>>, TmuxError> {
        self.run_for(cmd, DEADLINE).await
    }

    /// Freezes or thaws the hub (see `frozen`).
    pub(crate) fn set_frozen(&self, on: bool) {
        self.frozen.send_replace(on);
    }

    /// Whether the hub is frozen.
    pub(crate) fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Waits until the hub is not frozen.
    pub(crate) async fn thawed(&self) {
        let mut rx = self.frozen.subscribe();
        let _ = rx.wait_for(|f| !*f).await;
    }

    /// Runs `f` unless a freeze lands first: a command in flight then fails
    /// at once with [`TmuxError::FrozenInFlight`] (it may have reached tmux:
    /// no refusal; its waiter stays queued, so the late reply still meets
    /// it and nothing is matched to the wrong call).
    async fn unless_frozen<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, TmuxError>>,
    ) -> Result<T, TmuxError> {
        let mut rx = self.frozen.subscribe();
        tokio::select! {
            r = f => r,
            _ = rx.wait_for(|f| *f) => Err(TmuxError::FrozenInFlight),
        }
    }

    /// Runs one command with a given deadline.
    pub(crate) async fn run_for(
        &self,
        cmd: &Cmd,
        deadline: Duration,
    ) -> Result<Vec<Vec<u8>>, TmuxError> {
        let c = self.client().await?;
        let _q = self.quiet.read().await;
        self.unless_frozen(c.run(&cmd.line(), deadline)).await
    }

    /// Runs several commands in one round trip.
    pub(crate) async fn run_many(&self, cmds: &[Cmd]) -> Result<Vec<Vec<Vec<u8>>>, TmuxError> {
        self.run_each(cmds).await?.into_iter().collect()
    }

    /// Like [`run_many`](Self::run_many), with each command's own result.
    pub(crate) async fn run_each(
        &self,
        cmds: &[Cmd],
    ) -> Result<Vec<Result<Vec<Vec<u8>>, TmuxError>>, TmuxError> {
        let lines: Vec<String> = cmds.iter().map(Cmd::line).collect();
        let c = self.client().await?;
        let _q = self.quiet.read().await;
        self.unless_frozen(async { Ok(c.run_many(&lines, DEADLINE).await) })
            .await
    }

    /// Runs a command whose reply carries pane-controlled text (see
    /// [`Client::run_checked`]).
    pub(crate) async fn run_checked(&self, cmd: &Cmd) -> Result<Vec<Vec<u8>>, TmuxError> {
        let c = self.client().await?;
        let _q = self.quiet.read().await;
        self.unless_frozen(c.run_checked(&cmd.line(), DEADLINE))
            .await
    }

    /// The command client; if it was closed (not because the server is gone)
    /// it is replaced once.
    async fn client(&self) -> Result<Arc<Client>, TmuxError> {
        if self.is_frozen() {
            return Err(TmuxError::Frozen);
        }
        let c = self.cmd.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !c.is_closed() {
            return Ok(c);
        }
        let _one = self.reconnect.lock().await;
        let c = self.cmd.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !c.is_closed() {
            return Ok(c); // another caller reconnected meanwhile
        }
        let _quiet = self.quiet.write().await;
        c.ended(ENDED_WAIT).await;
        // Checked with no await before the attach (`shutdown` is sync).
        if self.is_ended() {
            return Err(TmuxError::Closed(Closing::GenerationEnded));
        }
        let fresh = Client::attach(
            "command",
            &self.tmux,
            &self.socket,
            self.control_session_id(),
            "no-output,ignore-size",
            self.streams.clone(),
        )
        .await
        .map_err(|e| TmuxError::Closed(Closing::Reconnecting(e.to_string())))?;
        let fresh = Arc::new(fresh);
        // Kept at once, so a shutdown meanwhile ends it too.
        *self.cmd.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        // A server that is gone refuses the attach; the first command tells.
        // (A timeout only means it is stopped or busy: the next call retries.)
        if let Err(e) = fresh
            .run(
                &Cmd::new("display-message").flag("-p").arg("ok").line(),
                DEADLINE,
            )
            .await
        {
            if matches!(e, TmuxError::Closed(_)) {
                let _ = self
                    .events
                    .send(HubEvent::ServerGone(format!("reconnecting: {e}")));
            }
            return Err(e);
        }
        Ok(fresh)
    }

    /// Attaches a watcher to every session that has none; drops those of
    /// sessions that are gone. One sync at a time; every attach in quiet.
    /// Sessions beyond `max_watchers` (only a human's host-side client can
    /// make them: tools refuse at the limit) get none, so the host's tmux
    /// clients stay at most `1 + max_watchers`; their output is not followed.
    pub(crate) async fn sync_watchers(&self) -> Result<(), HubError> {
        let _one = self.syncing.lock().await;
        if self.is_ended() {
            return Err(HubError::Ended);
        }
        let rows = self
            .run(&Cmd::new("list-sessions").opt("-F", "#{session_id}"))
            .await?;
        let ids: Vec<String> = rows
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .filter(|id| *id != self.control_session_id())
            .collect();
        let (gone, missing): (Vec<Arc<Client>>, Vec<String>) = {
            let mut w = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
            let gone = w
                .iter()
                .filter(|(id, c)| !ids.contains(id) || c.is_closed())
                .map(|(_, c)| c.clone())
                .collect();
            w.retain(|id, c| ids.contains(id) && !c.is_closed());
            let room = self.max_watchers.saturating_sub(w.len());
            let missing = ids.iter().filter(|id| !w.contains_key(*id)).take(room);
            (gone, missing.cloned().collect())
        };
        if !gone.is_empty() {
            // Letting a watcher go detaches a client: in quiet, too.
            let _quiet = self.quiet.write().await;
            for c in gone {
                c.kill();
                c.ended(ENDED_WAIT).await;
            }
        }
        for id in missing {
            let c = self.attach_watcher(&id).await?;
            self.watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, c);
        }
        Ok(())
    }

    /// Attaches one watcher to session `id`, in quiet: no command runs until
    /// it is attached (its identification is over, and no output of the
    /// session after that is missed).
    async fn attach_watcher(&self, id: &str) -> Result<Arc<Client>, HubError> {
        let _quiet = self.quiet.write().await;
        // One round trip first: the server has handled every connection that
        // closed before it (a watcher let go, a command client replaced).
        let cmd = self.cmd.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ok = Cmd::new("display-message").flag("-p").arg("ok").line();
        let _ = cmd.run(&ok, DEADLINE).await;
        if self.is_ended() {
            return Err(HubError::Ended);
        }
        let c = Client::attach(
            &format!("watch{id}"),
            &self.tmux,
            &self.socket,
            id,
            WATCH_FLAGS,
            self.streams.clone(),
        )
        .await
        .map_err(|source| HubError::Watch {
            id: id.to_string(),
            source,
        })?;
        let c = Arc::new(c);
        // Held where a shutdown meanwhile ends it too.
        self.attaching(|a| a.push(c.clone()));
        let _ = c.attached(DEADLINE).await;
        self.attaching(|a| a.retain(|x| !Arc::ptr_eq(x, &c)));
        if self.is_ended() {
            c.kill();
            return Err(HubError::Ended);
        }
        Ok(c)
    }

    /// The current end offset of a pane's output, and a receiver that changes
    /// whenever the pane writes.
    pub(crate) fn subscribe(&self, pane: u32) -> (u64, watch::Receiver<u64>) {
        self.streams.subscribe(pane)
    }

    /// Output of `pane` from `offset` on (as much as the ring still holds).
    pub(crate) fn read_since(&self, pane: u32, offset: u64) -> Chunk {
        self.streams.read_since(pane, offset)
    }

    /// Sends one pane's output to `f` as it arrives (replacing any earlier tap).
    pub(crate) fn set_tap(&self, pane: u32, f: Tap) {
        self.streams.set_tap(pane, f)
    }

    /// Forgets the output of panes missing from this listing and the one
    /// before (`absent` carries the first from call to call): a pane is
    /// forgotten only after a whole interval gone, so a wait that saw it exit
    /// still reads its last output, and a pane made after a listing is not
    /// forgotten for it.
    pub(crate) fn forget_panes(&self, alive: &[u32], absent: &mut Vec<u32>) {
        self.streams.forget_panes(alive, absent)
    }

    /// Every `every`, forgets the output of panes that are gone (rings of
    /// closed panes held memory for the instance's life otherwise).
    async fn prune(weak: std::sync::Weak<Hub>, every: Duration) {
        let mut absent = Vec::new();
        loop {
            tokio::time::sleep(every).await;
            let Some(hub) = weak.upgrade() else { break };
            if hub.is_frozen() {
                continue;
            }
            let cmd = Cmd::new("list-panes").flag("-a").opt("-F", "#{pane_id}");
            let Ok(rows) = hub.run(&cmd).await else {
                continue;
            };
            let alive: Vec<u32> = rows
                .iter()
                .filter_map(|r| std::str::from_utf8(r).ok()?.strip_prefix('%')?.parse().ok())
                .collect();
            hub.forget_panes(&alive, &mut absent);
        }
    }

    /// Total bytes held in rings (for the status report and tests).
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.streams.buffered_bytes()
    }

    /// tmux clients this hub runs on the host: the command client and the
    /// watchers (at most `1 + max_watchers`).
    pub(crate) fn host_clients(&self) -> usize {
        1 + self.watcher_count()
    }

    /// Number of watcher clients.
    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    fn attaching(&self, f: impl FnOnce(&mut Vec<Arc<Client>>)) {
        f(&mut self.attaching.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Whether [`Hub::shutdown`] ran.
    fn is_ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Ends every client, for good. Pending waits see their pane's stream
    /// close.
    pub(crate) fn shutdown(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        self.streams.clear();
        self.cmd.lock().unwrap_or_else(|p| p.into_inner()).kill();
        self.attaching(|a| a.iter().for_each(|c| c.kill()));
        for c in self
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            c.kill();
        }
    }
}
