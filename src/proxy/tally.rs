//! Decisions counted per name: the summary `run` and `shell` print when
//! they end, and the aggregated records `serve` writes in a flood. Bounded:
//! at most [`MAX_NAMES`] names; the rest are counted together.

use super::Event;
use std::collections::BTreeMap;

/// Most names counted separately.
pub(crate) const MAX_NAMES: usize = 256;

/// What one name (and verdict) adds up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Count {
    /// Decisions.
    pub n: u64,
    /// Bytes up and down.
    pub up: u64,
    /// Bytes down.
    pub down: u64,
    /// The last reason of a refusal.
    pub reason: Option<String>,
}

/// The key: `host:port` (or what stands for it) and whether it was allowed.
pub(crate) type Key = (String, bool);

/// Counts per name.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// The counts.
    pub map: BTreeMap<Key, Count>,
    /// Connections being served now (counted when they end).
    pub open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// The name an event is counted under.
pub(crate) fn label(ev: &Event) -> String {
    if ev.host.is_empty() {
        "(no name read)".to_string()
    } else {
        format!("{}:{}", ev.host, ev.port)
    }
}

impl Tally {
    /// Counts `ev`.
    pub(crate) fn add(&mut self, ev: &Event) {
        let mut key = (label(ev), ev.denied.is_none());
        if !self.map.contains_key(&key) && self.map.len() >= MAX_NAMES {
            key.0 = "(other names)".to_string();
        }
        let c = self.map.entry(key).or_default();
        c.n += 1;
        c.up += ev.bytes_up;
        c.down += ev.bytes_down;
        if ev.denied.is_some() {
            c.reason = ev.denied.clone();
        }
    }

    /// The counts so far, leaving none.
    pub(crate) fn take(&mut self) -> BTreeMap<Key, Count> {
        std::mem::take(&mut self.map)
    }

    /// One line per name, for a human's terminal (names are the agent's
    /// bytes: shown escaped).
    pub(crate) fn summary(&self) -> Vec<String> {
        self.map
            .iter()
            .map(|((name, ok), c)| {
                let name = crate::term::printable(name);
                if *ok {
                    format!(
                        "  allowed {name}: {} connections, {} bytes up, {} bytes down",
                        c.n, c.up, c.down
                    )
                } else {
                    let why = crate::term::printable(c.reason.as_deref().unwrap_or(""));
                    format!("  DENIED  {name}: {} times ({why})", c.n)
                }
            })
            .collect()
    }
}
