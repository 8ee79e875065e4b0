//! What git ignores, as review shows it: one line per top directory (or
//! top-level file) with how many paths and how many bytes (apparent
//! sizes), never a line per path.

use super::diff::{Change, Trees};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Ignored changes, counted by their first path component.
#[derive(Default)]
pub(super) struct Summary {
    tops: BTreeMap<PathBuf, (usize, u64)>,
}

impl Summary {
    pub(super) fn add(&mut self, t: &Trees, c: &Change) {
        let top: PathBuf = c.rel().iter().take(1).collect();
        let bytes = match c {
            Change::Added { what: "file", .. } | Change::Modified { .. } => {
                t.upper_stat(c.rel()).map_or(0, |s| s.st_size as u64)
            }
            _ => 0,
        };
        let e = self.tops.entry(top).or_default();
        e.0 += 1;
        e.1 += bytes;
    }

    /// `I TOP (N paths git ignores, B bytes; …)` lines.
    pub(super) fn lines(&self) -> String {
        let mut out = String::new();
        for (top, (n, bytes)) in &self.tops {
            let name = super::hold::shown_name(top);
            out.push_str(&format!(
                "I {name} ({n} paths git ignores, {bytes} bytes; `--include-ignored` shows and brings them)\n"
            ));
        }
        out
    }
}
