//! What each call did to the workspace, from the layer's history
//! (`supervisor::history`): `sandmux log ID` lists the checkpoints,
//! `sandmux diff ID --call N` shows what call N changed, `--since N` what
//! changed after it. Read-only; on a running instance too. Names and
//! contents are the agent's: a terminal gets them escaped.

use super::error::CallsError;
use crate::supervisor::history::{self, HistoryError, Line, Node};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Longest file shown as text, in bytes.
const TEXT_MAX: u64 = 1 << 20;

fn history_dir(id: &str) -> Result<(PathBuf, PathBuf), CallsError> {
    let (dir, meta) = crate::supervisor::layer::find(id)?;
    let h = history::History::dir_of(&dir);
    if !h.join("log.jsonl").exists() {
        return Err(HistoryError::None(id.to_string()).into());
    }
    Ok((h, meta.workspace))
}

/// `sandmux log ID [--json]`.
pub(crate) fn log(id: &str, json: bool) -> i32 {
    let lines = match history_dir(id).and_then(|(h, _)| Ok(history::store::read_lines(&h)?)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            return 2;
        }
    };
    let mut out = String::new();
    for l in &lines {
        out.push_str(&match json {
            true => crate::term::inert_json(serde_json::to_string(l).unwrap_or_default()),
            false => said(l),
        });
        out.push('\n');
    }
    print!("{out}");
    0
}

/// One checkpoint, for a human.
fn said(l: &Line) -> String {
    let args = match &l.args {
        serde_json::Value::Null => String::new(),
        a => format!(" {}", cut(&a.to_string(), 100)),
    };
    let paths: Vec<String> = l
        .paths
        .iter()
        .filter_map(|p| history::path_of(p).ok())
        .map(|p| crate::term::printable(&p.to_string_lossy()))
        .take(5)
        .collect();
    let more = (l.changed + l.removed).saturating_sub(paths.len());
    let folded = l
        .folded_upto
        .map(|k| {
            format!(
                " (the history reached its bound: checkpoints up to {k} folded into later ones)"
            )
        })
        .unwrap_or_default();
    format!(
        "{:>4}  {}  {}{}  {} changed, {} removed{}{}{}",
        l.n,
        l.ts,
        crate::term::printable(&l.tool),
        crate::term::printable(&args),
        l.changed,
        l.removed,
        match paths.is_empty() {
            true => String::new(),
            false => format!(": {}", paths.join(", ")),
        },
        match more {
            0 => String::new(),
            m if !paths.is_empty() => format!(" and {m} more"),
            _ => String::new(),
        },
        folded
    )
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `sandmux diff ID --call N` (`since`: false) or `--since N` (true).
pub(crate) fn diff(id: &str, n: u64, since: bool) -> i32 {
    match render(id, n, since) {
        Ok((text, changed)) => {
            let text = match std::io::stdout().is_terminal() {
                true => text
                    .lines()
                    .map(|l| crate::term::printable(l) + "\n")
                    .collect(),
                false => text,
            };
            print!("{text}");
            i32::from(changed)
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            2
        }
    }
}

fn render(id: &str, n: u64, since: bool) -> Result<(String, bool), CallsError> {
    let (h, workspace) = history_dir(id)?;
    let last = history::store::read_lines(&h)?
        .last()
        .map(|l| l.n)
        .unwrap_or(0);
    let (from, to) = match since {
        true => (n, last),
        false => (n.checked_sub(1).ok_or(CallsError::CallZero)?, n),
    };
    if to > last {
        return Err(HistoryError::NoCheckpoint(to).into());
    }
    let old = history::store::state_at(&h, from)?;
    let new = history::store::state_at(&h, to)?;
    let mut out = String::new();
    let mut changed = false;
    let paths: std::collections::BTreeSet<&PathBuf> = old.keys().chain(new.keys()).collect();
    for p in paths {
        let (a, b) = (old.get(p), new.get(p));
        if a == b {
            continue;
        }
        changed = true;
        out.push_str(&entry(&h, &workspace, p, a, b));
    }
    Ok((out, changed))
}

/// One path's change: a line, and for text a unified diff. A path the
/// layer did not hold before is the workspace's own (the lower layer), or
/// nothing. The name is the agent's: escaped here, wherever the text goes
/// (a newline in it would forge lines).
fn entry(h: &Path, workspace: &Path, p: &Path, a: Option<&Node>, b: Option<&Node>) -> String {
    let name = crate::term::printable(&p.to_string_lossy());
    let mark = match (a, b) {
        (_, None) | (_, Some(Node::Whiteout)) => "D",
        (None, Some(_)) | (Some(Node::Whiteout), Some(_)) => "A",
        _ => "M",
    };
    let mut s = format!("{mark} {name}\n");
    let text = |n: Option<&Node>, lower: bool| -> Option<String> {
        match n {
            Some(Node::File { object, size, .. }) if *size <= TEXT_MAX => {
                String::from_utf8(std::fs::read(h.join("objects").join(object)).ok()?).ok()
            }
            None if lower => workspace_text(workspace, p),
            None | Some(Node::Whiteout) | Some(Node::Dir { .. }) => Some(String::new()),
            _ => None,
        }
    };
    if matches!(a, Some(Node::Unkept { .. })) || matches!(b, Some(Node::Unkept { .. })) {
        s.push_str("  (its content was not kept: the history had no room under [workspace] history_bytes)\n");
    } else if let (Some(old), Some(new)) = (text(a, true), text(b, false)) {
        let d = similar::TextDiff::from_lines(&old, &new);
        let u = d
            .unified_diff()
            .header(&format!("a/{name}"), &format!("b/{name}"))
            .to_string();
        s.push_str(&u);
    } else {
        s.push_str("  (not text, or larger than 1 MiB: compared by content)\n");
    }
    s
}

/// The text of the workspace's own file at `p` (empty when it has none),
/// opened beneath the workspace without following a link; None: not text.
fn workspace_text(workspace: &Path, p: &Path) -> Option<String> {
    use nix::fcntl::OFlag;
    use std::io::Read;
    let root = crate::sandbox::beneath::open_root(workspace).ok()?;
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let fd = match crate::sandbox::beneath::beneath(&root, p, flags) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Some(String::new()),
        Err(_) => return None,
    };
    let st = nix::sys::stat::fstat(&fd).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > TEXT_MAX {
        return None;
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(TEXT_MAX)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}
