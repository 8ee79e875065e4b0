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

use super::client::{Client, Sink, TmuxError};
pub(crate) use super::cmd::Cmd;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// Bytes of recent output kept per pane.
pub(crate) const RING_BYTES: usize = 256 * 1024;
/// The hidden session the command client is attached to.
pub(crate) const CONTROL_SESSION: &str = "_sandmux";
/// Default bound for one tmux command.
pub(crate) const DEADLINE: Duration = Duration::from_secs(5);
/// How often the output of closed panes is looked for (and dropped one
/// interval later).
const PRUNE_EVERY: Duration = Duration::from_secs(5);
/// How long a client that was let go is waited for before the next attach.
const ENDED_WAIT: Duration = Duration::from_secs(2);

/// Something every tool may want to know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HubEvent {
    /// Sessions were created or destroyed.
    SessionsChanged,
    /// The command connection to the server closed.
    ServerGone(String),
}

struct PaneStream {
    ring: VecDeque<u8>,
    end: u64,
    tx: watch::Sender<u64>,
}

/// A function that sees one pane's output as it arrives (the recorder).
pub(crate) type Tap = Box<dyn Fn(&[u8]) + Send + Sync>;

/// The pane output store (the [`Sink`] of every client).
pub(crate) struct Streams {
    panes: Mutex<HashMap<u32, PaneStream>>,
    tap: std::sync::RwLock<Option<(u32, Tap)>>,
    events: broadcast::Sender<HubEvent>,
    paused_tx: tokio::sync::mpsc::UnboundedSender<(String, u32)>,
    command_client: String,
}

impl Streams {
    fn stream(map: &mut HashMap<u32, PaneStream>, pane: u32) -> &mut PaneStream {
        map.entry(pane).or_insert_with(|| PaneStream {
            ring: VecDeque::new(),
            end: 0,
            tx: watch::channel(0).0,
        })
    }
}

impl Sink for Streams {
    fn output(&self, pane: u32, data: &[u8]) {
        if let Ok(t) = self.tap.read() {
            if let Some((p, f)) = t.as_ref() {
                if *p == pane {
                    f(data);
                }
            }
        }
        let mut map = self.panes.lock().unwrap_or_else(|p| p.into_inner());
        let s = Self::stream(&mut map, pane);
        s.ring.extend(data);
        let over = s.ring.len().saturating_sub(RING_BYTES);
        s.ring.drain(..over);
        s.end += data.len() as u64;
        s.tx.send_replace(s.end);
    }

    fn notification(&self, client: &str, line: &[u8]) {
        if client == self.command_client
            && (line.starts_with(b"%sessions-changed") || line.starts_with(b"%session-renamed"))
        {
            let _ = self.events.send(HubEvent::SessionsChanged);
        }
    }

    fn paused(&self, client: &str, pane: u32) {
        let _ = self.paused_tx.send((client.to_string(), pane));
    }

    fn closed(&self, client: &str, reason: &str) {
        if client == self.command_client
            && reason != super::client::FORGED
            && reason != super::client::WEDGED
            && reason != super::client::DROPPED
        {
            let _ = self.events.send(HubEvent::ServerGone(reason.to_string()));
        }
    }
}

/// Output read from a pane's ring.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chunk {
    /// The bytes from the requested offset (or the oldest kept) to the end.
    pub data: Vec<u8>,
    /// Offset just past `data`.
    pub end: u64,
    /// Bytes between the requested offset and the oldest kept were lost.
    pub missed: u64,
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
    /// attaches (see the module's documentation).
    quiet: tokio::sync::RwLock<()>,
    /// One watcher sync at a time.
    syncing: tokio::sync::Mutex<()>,
    /// Most watchers at once (the profile's `max_sessions`): the host never
    /// runs more than `1 + max_watchers` tmux clients for this instance.
    max_watchers: usize,
    streams: Arc<Streams>,
    /// Hub-wide events.
    pub events: broadcast::Sender<HubEvent>,
    /// The control session's id (`$N`), hidden from tools.
    pub control_session_id: String,
    /// Its one pane's id (`%N`), never a tool's target.
    pub control_pane_id: String,
    /// The sandbox is frozen (`sandmux freeze`): every command fails at once
    /// with [`TmuxError::Frozen`] instead of waiting on a stopped server,
    /// and the background work (pruning, resuming paused panes) waits.
    frozen: watch::Sender<bool>,
}

impl Hub {
    /// Connects to the server at `socket`, whose control session already
    /// exists; at most `max_watchers` sessions get a watcher.
    pub(crate) async fn connect(
        tmux: &Path,
        socket: &Path,
        control_session_id: &str,
        max_watchers: usize,
    ) -> Result<Arc<Hub>, String> {
        let (events, _) = broadcast::channel(64);
        let (ptx, prx) = tokio::sync::mpsc::unbounded_channel();
        let streams = Arc::new(Streams {
            panes: Mutex::new(HashMap::new()),
            tap: std::sync::RwLock::new(None),
            events: events.clone(),
            paused_tx: ptx,
            command_client: "command".into(),
        });
        let cmd = Client::attach(
            "command",
            tmux,
            socket,
            control_session_id,
            "no-output,ignore-size",
            streams.clone(),
        )
        .await
        .map_err(|e| format!("starting the control client: {e}"))?;
        let pane = cmd
            .run(
                &Cmd::new("display-message")
                    .flag("-p")
                    .opt("-t", control_session_id)
                    .arg("#{pane_id}")
                    .line(),
                DEADLINE,
            )
            .await
            .map_err(|e| format!("control client: {e}"))?;
        let control_pane_id = match pane.as_slice() {
            [id] if id.starts_with(b"%") => String::from_utf8_lossy(id).into_owned(),
            _ => return Err(format!("control client: no control pane ({pane:?})")),
        };
        let control_session_id = control_session_id.to_string();
        let hub = Arc::new(Hub {
            tmux: tmux.to_path_buf(),
            socket: socket.to_path_buf(),
            cmd: Mutex::new(Arc::new(cmd)),
            reconnect: tokio::sync::Mutex::new(()),
            watchers: Mutex::new(HashMap::new()),
            quiet: tokio::sync::RwLock::new(()),
            syncing: tokio::sync::Mutex::new(()),
            max_watchers,
            streams,
            events,
            control_session_id,
            control_pane_id,
            frozen: watch::channel(false).0,
        });
        tokio::spawn(Hub::resume_paused(Arc::downgrade(&hub), prx));
        tokio::spawn(Hub::follow_sessions(
            Arc::downgrade(&hub),
            hub.events.subscribe(),
        ));
        tokio::spawn(Hub::prune(Arc::downgrade(&hub), PRUNE_EVERY));
        hub.sync_watchers().await?;
        Ok(hub)
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
    /// at once with [`TmuxError::Frozen`] (its waiter stays queued, so the
    /// late reply still meets it and nothing is matched to the wrong call).
    async fn unless_frozen<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, TmuxError>>,
    ) -> Result<T, TmuxError> {
        let mut rx = self.frozen.subscribe();
        tokio::select! {
            r = f => r,
            _ = rx.wait_for(|f| *f) => Err(TmuxError::Frozen),
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
        let fresh = Client::attach(
            "command",
            &self.tmux,
            &self.socket,
            &self.control_session_id,
            "no-output,ignore-size",
            self.streams.clone(),
        )
        .await
        .map_err(|e| TmuxError::Closed(format!("reconnecting: {e}")))?;
        let fresh = Arc::new(fresh);
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
        *self.cmd.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// Attaches a watcher to every session that has none; drops those of
    /// sessions that are gone. One sync at a time; every attach in quiet.
    /// Sessions beyond `max_watchers` (only a human's host-side client can
    /// make them: tools refuse at the limit) get none, so the host's tmux
    /// clients stay at most `1 + max_watchers`; their output is not followed.
    pub(crate) async fn sync_watchers(&self) -> Result<(), String> {
        let _one = self.syncing.lock().await;
        let rows = self
            .run(&Cmd::new("list-sessions").opt("-F", "#{session_id}"))
            .await
            .map_err(|e| e.to_string())?;
        let ids: Vec<String> = rows
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .filter(|id| *id != self.control_session_id)
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
                .insert(id, Arc::new(c));
        }
        Ok(())
    }

    /// Attaches one watcher to session `id`, in quiet: no command runs until
    /// its first reply (its identification is over, and no output of the
    /// session after that is missed).
    async fn attach_watcher(&self, id: &str) -> Result<Client, String> {
        let _quiet = self.quiet.write().await;
        // One round trip first: the server has handled every connection that
        // closed before it (a watcher let go, a command client replaced).
        let cmd = self.cmd.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ok = Cmd::new("display-message").flag("-p").arg("ok").line();
        let _ = cmd.run(&ok, DEADLINE).await;
        let c = Client::attach(
            &format!("watch{id}"),
            &self.tmux,
            &self.socket,
            id,
            "ignore-size,pause-after=2",
            self.streams.clone(),
        )
        .await
        .map_err(|e| format!("watching session {id}: {e}"))?;
        let _ = c.run(&ok, DEADLINE).await;
        Ok(c)
    }

    /// The current end offset of a pane's output, and a receiver that changes
    /// whenever the pane writes.
    pub(crate) fn subscribe(&self, pane: u32) -> (u64, watch::Receiver<u64>) {
        let mut map = self.streams.panes.lock().unwrap_or_else(|p| p.into_inner());
        let s = Streams::stream(&mut map, pane);
        (s.end, s.tx.subscribe())
    }

    /// Output of `pane` from `offset` on (as much as the ring still holds).
    pub(crate) fn read_since(&self, pane: u32, offset: u64) -> Chunk {
        let mut map = self.streams.panes.lock().unwrap_or_else(|p| p.into_inner());
        let s = Streams::stream(&mut map, pane);
        let start = s.end - s.ring.len() as u64;
        let from = offset.clamp(start, s.end);
        let skip = (from - start) as usize;
        Chunk {
            data: s.ring.iter().skip(skip).copied().collect(),
            end: s.end,
            missed: from.saturating_sub(offset),
        }
    }

    /// Sends one pane's output to `f` as it arrives (replacing any earlier tap).
    pub(crate) fn set_tap(&self, pane: u32, f: Tap) {
        if let Ok(mut t) = self.streams.tap.write() {
            *t = Some((pane, f));
        }
    }

    /// Forgets the output of panes missing from this listing and the one
    /// before (`absent` carries the first from call to call): a pane is
    /// forgotten only after a whole interval gone, so a wait that saw it exit
    /// still reads its last output, and a pane made after a listing is not
    /// forgotten for it.
    pub(crate) fn forget_panes(&self, alive: &[u32], absent: &mut Vec<u32>) {
        let mut map = self.streams.panes.lock().unwrap_or_else(|p| p.into_inner());
        let now: Vec<u32> = map.keys().filter(|p| !alive.contains(p)).copied().collect();
        map.retain(|p, _| !(now.contains(p) && absent.contains(p)));
        *absent = now;
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
        self.streams
            .panes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|s| s.ring.len())
            .sum()
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

    /// Ends every client. Pending waits see their pane's stream close.
    pub(crate) fn shutdown(&self) {
        self.streams
            .panes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.cmd.lock().unwrap_or_else(|p| p.into_inner()).kill();
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
