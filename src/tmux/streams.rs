//! Pane output as the hub keeps it: one bounded ring per pane, fed by every
//! control client (the [`Sink`] they share), with a watch per pane that waits
//! wake on, and the hub's events from the command client's notifications.

use super::client::Sink;
use super::hub::HubEvent;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use tokio::sync::{broadcast, watch};

/// Bytes of recent output kept per pane.
pub(crate) const RING_BYTES: usize = 256 * 1024;

struct PaneStream {
    ring: VecDeque<u8>,
    end: u64,
    tx: watch::Sender<u64>,
}

/// A function that sees one pane's output as it arrives (the recorder).
pub(crate) type Tap = Box<dyn Fn(&[u8]) + Send + Sync>;

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

/// The pane output store (the [`Sink`] of every client).
pub(crate) struct Streams {
    panes: Mutex<HashMap<u32, PaneStream>>,
    tap: std::sync::RwLock<Option<(u32, Tap)>>,
    events: broadcast::Sender<HubEvent>,
    paused_tx: tokio::sync::mpsc::UnboundedSender<(String, u32)>,
    command_client: String,
}

impl Streams {
    /// The store; `command_client` names the client whose notifications
    /// and end are the hub's events.
    pub(crate) fn new(
        events: broadcast::Sender<HubEvent>,
        paused_tx: tokio::sync::mpsc::UnboundedSender<(String, u32)>,
        command_client: &str,
    ) -> Streams {
        Streams {
            panes: Mutex::new(HashMap::new()),
            tap: std::sync::RwLock::new(None),
            events,
            paused_tx,
            command_client: command_client.into(),
        }
    }

    fn stream(map: &mut HashMap<u32, PaneStream>, pane: u32) -> &mut PaneStream {
        map.entry(pane).or_insert_with(|| PaneStream {
            ring: VecDeque::new(),
            end: 0,
            tx: watch::channel(0).0,
        })
    }

    fn panes(&self) -> std::sync::MutexGuard<'_, HashMap<u32, PaneStream>> {
        self.panes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current end offset of a pane's output, and a receiver that
    /// changes whenever the pane writes.
    pub(crate) fn subscribe(&self, pane: u32) -> (u64, watch::Receiver<u64>) {
        let mut map = self.panes();
        let s = Self::stream(&mut map, pane);
        (s.end, s.tx.subscribe())
    }

    /// Output of `pane` from `offset` on (as much as the ring still holds).
    pub(crate) fn read_since(&self, pane: u32, offset: u64) -> Chunk {
        let mut map = self.panes();
        let s = Self::stream(&mut map, pane);
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
        if let Ok(mut t) = self.tap.write() {
            *t = Some((pane, f));
        }
    }

    /// See [`super::hub::Hub::forget_panes`].
    pub(crate) fn forget_panes(&self, alive: &[u32], absent: &mut Vec<u32>) {
        let mut map = self.panes();
        let now: Vec<u32> = map.keys().filter(|p| !alive.contains(p)).copied().collect();
        map.retain(|p, _| !(now.contains(p) && absent.contains(p)));
        *absent = now;
    }

    /// Bytes held in all rings.
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.panes().values().map(|s| s.ring.len()).sum()
    }

    /// Forgets every pane's output (the hub's end).
    pub(crate) fn clear(&self) {
        self.panes().clear();
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
        let mut map = self.panes();
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

    fn closed(&self, client: &str, reason: &super::closing::Closing) {
        if client == self.command_client && !reason.by_sandmux() {
            let _ = self.events.send(HubEvent::ServerGone(reason.to_string()));
        }
    }
}
