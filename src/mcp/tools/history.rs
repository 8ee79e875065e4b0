//! `workspace_history`: the agent's own history of the workspace
//! (`supervisor::history`), read-only — the checkpoints taken after its
//! changing calls, or one checkpoint's changed paths. Names are the
//! agent's own, returned as data (never to a human's terminal here), and
//! bounded like every result: entries, names and bytes are capped (as
//! serialised: JSON's escapes count), and the result says when it cut. An
//! I/O error says what failed, never where (the layer's host path).

use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::supervisor::history::{self, store, Line};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Checkpoints listed at most (the newest).
const LISTED: usize = 50;
/// Paths named at most: per listed checkpoint, and for one checkpoint.
const PATHS_LISTED: usize = 5;
const PATHS_ONE: usize = 200;
/// Longest name returned, in bytes as serialised (JSON escapes a control
/// byte as six: the cut counts them so), cut on a character boundary.
const NAME_MAX: usize = 256;
/// Bytes of names returned at most in one result, as serialised.
const NAMES_MAX: usize = 32 * 1024;

/// `workspace_history` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct HistoryArgs {
    /// Only this checkpoint, with every path it changed (capped).
    pub n: Option<u64>,
}

/// One checkpoint.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Checkpoint {
    /// Its number (0: the workspace at the start).
    pub n: u64,
    /// The tool call it follows.
    pub tool: String,
    /// Entries added or changed by that call.
    pub changed: usize,
    /// Entries removed by that call.
    pub removed: usize,
    /// Paths it changed or removed (the first few; all with `n`).
    pub paths: Vec<String>,
}

/// `workspace_history` result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct History {
    /// Checkpoints, oldest first (the newest 50; one with `n`).
    pub checkpoints: Vec<Checkpoint>,
    /// The oldest checkpoint still kept (older ones were folded).
    pub oldest: u64,
    /// Something was left out (older checkpoints, paths, long names).
    pub truncated: bool,
}

/// `workspace_history`.
pub(crate) async fn workspace_history(c: &Call<'_>, a: HistoryArgs) -> Result<History, ToolError> {
    let h = c.s.history.clone().ok_or_else(|| {
        ToolError::refused("this instance's workspace is live (or a copy): it keeps no history")
    })?;
    tokio::task::spawn_blocking(move || {
        // Held while read: no checkpoint is half written meanwhile.
        let h = h.lock().unwrap_or_else(|p| p.into_inner());
        read(h.dir(), a.n)
    })
    .await
    .map_err(|e| ToolError::Internal(e.to_string()))?
}

/// The agent's message for a history that could not be read: no host
/// path (the layer's directory is the human's).
fn said(e: history::HistoryError) -> ToolError {
    match e {
        history::HistoryError::Io { what, source, .. } => {
            ToolError::Internal(format!("the history could not be read ({what}: {source})"))
        }
        e => ToolError::Internal(e.to_string()),
    }
}

fn read(dir: &std::path::Path, n: Option<u64>) -> Result<History, ToolError> {
    let e = said;
    let mut budget = NAMES_MAX;
    let lines = store::read_lines(dir).map_err(e)?;
    let oldest = store::base_of(dir).map_err(e)?.0;
    let mut truncated = false;
    let checkpoints = match n {
        None => {
            truncated = lines.len() > LISTED;
            let from = lines.len().saturating_sub(LISTED);
            lines[from..]
                .iter()
                .map(|l| listed(l, &mut truncated, &mut budget))
                .collect()
        }
        Some(n) => {
            let l = lines.iter().find(|l| l.n == n).ok_or_else(|| {
                ToolError::not_found(
                    format!("checkpoint {n}"),
                    "call workspace_history without `n` for the list",
                )
            })?;
            let mut one = listed(l, &mut truncated, &mut budget);
            budget = NAMES_MAX;
            if n > oldest {
                let d = store::delta_of(dir, n).map_err(e)?;
                let all = d.changed.keys().chain(d.removed.iter());
                one.paths = names(all, PATHS_ONE, &mut truncated, &mut budget);
            }
            vec![one]
        }
    };
    Ok(History {
        checkpoints,
        oldest,
        truncated,
    })
}

fn listed(l: &Line, truncated: &mut bool, budget: &mut usize) -> Checkpoint {
    if l.changed + l.removed > PATHS_LISTED {
        *truncated = true;
    }
    Checkpoint {
        n: l.n,
        tool: l.tool.clone(),
        changed: l.changed,
        removed: l.removed,
        paths: names(l.paths.iter(), PATHS_LISTED, truncated, budget),
    }
}

/// Up to `max` hex paths as text (lossy), each at most [`NAME_MAX`]
/// bytes as serialised, while `budget` (serialised bytes) lasts.
fn names<'a>(
    hex: impl Iterator<Item = &'a String>,
    max: usize,
    truncated: &mut bool,
    budget: &mut usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for h in hex {
        if out.len() == max {
            *truncated = true;
            break;
        }
        let Ok(p) = history::path_of(h) else { continue };
        let mut s = p.to_string_lossy().into_owned();
        if json_len(&s) > NAME_MAX {
            let mut cut = 0;
            for (i, c) in s.char_indices() {
                if json_len(&s[..i + c.len_utf8()]) > NAME_MAX {
                    break;
                }
                cut = i + c.len_utf8();
            }
            s.truncate(cut);
            s.push('…');
            *truncated = true;
        }
        let Some(left) = budget.checked_sub(json_len(&s)) else {
            *truncated = true;
            break;
        };
        *budget = left;
        out.push(s);
    }
    out
}

/// `s`'s length as a JSON string's content (serde_json's escapes).
fn json_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\t' | '\r' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_as_serialised() {
        let mut hexes = Vec::new();
        use std::os::unix::ffi::OsStrExt;
        for i in 0..200u8 {
            // Control bytes: six bytes each once escaped.
            let name = vec![i % 31 + 1; 300];
            let p = std::path::Path::new(std::ffi::OsStr::from_bytes(&name));
            hexes.push(history::hex_of(p));
        }
        let (mut t, mut budget) = (false, NAMES_MAX);
        let got = names(hexes.iter(), PATHS_ONE, &mut t, &mut budget);
        let bytes = serde_json::to_string(&got).unwrap().len();
        assert!(t);
        assert!(bytes <= NAMES_MAX + 4 * got.len() + 2, "{bytes}");
        for n in &got {
            assert!(serde_json::to_string(n).unwrap().len() <= NAME_MAX + 2 + 3);
        }
        // Control: cut at 256 bytes as text, a name would serialise to
        // six times that.
        let cut_as_text = "\u{1}".repeat(NAME_MAX);
        assert!(serde_json::to_string(&cut_as_text).unwrap().len() > 5 * NAME_MAX);
        let plain = [history::hex_of(std::path::Path::new("a/b.txt"))];
        let (mut t, mut budget) = (false, NAMES_MAX);
        assert_eq!(names(plain.iter(), 5, &mut t, &mut budget), ["a/b.txt"]);
        assert!(!t);
    }

    #[test]
    fn an_io_error_names_no_host_path() {
        let e = history::HistoryError::io(
            "reading",
            std::path::Path::new("/home/human/.local/state/sandmux/layers/x/history/log.jsonl"),
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        assert!(e.to_string().contains("/home/human"));
        let said = format!("{:?}", said(e));
        assert!(!said.contains("/home/human"), "{said}");
        assert!(said.contains("reading"), "{said}");
    }
}
