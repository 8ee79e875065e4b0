//! A command typed by `run_command`, followed on its pane's output stream
//! until its end marker. A [`Follow`] reads the pane's ring incrementally and
//! keeps the command's own output (a bounded tail), so neither completion nor
//! the exit status depends on how much it printed or on how long ago it ended.

use super::elide::{elide, Caps};
use super::wait::{Wait, Woke};
use crate::mcp::error::ToolError;
use crate::mcp::targets::PaneRow;
use crate::mcp::text;
use crate::tmux::hub::{Cmd, Hub};
use schemars::JsonSchema;
use serde::Serialize;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Output kept per command (the tail; the same as a pane's ring).
const BODY_CAP: usize = crate::tmux::hub::RING_BYTES;
/// The head kept besides, for a result's first lines.
const HEAD_CAP: usize = 64 * 1024;
/// The OSC number sandmux's markers use (tmux draws nothing for it).
const OSC: &str = "\x1b]6973;";

/// A command's result.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RunResult {
    /// completed | timeout | interrupted | pane_exited (the command ended the
    /// pane's shell: `exit`, `set -e` and a failure).
    pub status: String,
    /// Exit status (when completed; for pane_exited, the status the shell
    /// ended with when it said, or tmux's when it kept the pane).
    pub exit_status: Option<i32>,
    /// What the command printed (plain text): its head and tail within
    /// `max_lines`/`max_bytes`, a marker line between if anything is not shown.
    pub output: String,
    /// Bytes the command printed (a line end counts one byte).
    pub bytes: usize,
    /// Lines it printed.
    pub lines: usize,
    /// Whether output was left out.
    pub truncated: bool,
    /// Lines left out.
    pub truncated_lines: usize,
    /// Output was lost because it scrolled past sandmux's buffer.
    pub missed: bool,
    /// The pane.
    pub pane_id: String,
    /// Seconds.
    pub elapsed: f64,
    /// The timeout that applied, in seconds.
    pub timeout: f64,
    /// What you should know besides: a timeout cut to the profile's
    /// ceiling, a fresh session made because none was left; absent if none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// On timeout, the id `wait_for_command` collects the still-running
    /// command with; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_id: Option<String>,
}

/// How a followed command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Its end marker arrived, with this exit status.
    Completed(i32),
    /// The pane's shell ended: with the status the command ended it with
    /// (its `EXIT` trap's marker), or tmux's when it kept the pane.
    PaneExited(Option<i32>),
    /// The shell prompted again without the end marker (C-c aborted the
    /// command), with the status it had then.
    Interrupted(i32),
}

/// One command's output, read from its pane's ring as it arrives.
pub(crate) struct Follow {
    /// The pane (`%N`).
    pub pane_id: String,
    num: u32,
    begin: Vec<u8>,
    end: Vec<u8>,
    /// The marker the command's `EXIT` trap prints when it ends the shell.
    exit: Vec<u8>,
    /// The status it printed there.
    exit_status: Option<i32>,
    /// `OSC P<pid>;` of the shell that printed the begin marker.
    prompt: Option<Vec<u8>>,
    pos: u64,
    before: Vec<u8>,
    seen_begin: bool,
    body: Vec<u8>,
    /// The first [`HEAD_CAP`] bytes of what left `body`'s front.
    head: Vec<u8>,
    /// Bytes and newlines that left `body`'s front.
    dropped: (usize, usize),
    head_lost: bool,
    missed: bool,
    /// When the command was typed.
    pub t0: Instant,
    /// Set once it ended.
    pub ended: Option<End>,
}

impl Follow {
    /// Follows the command with `nonce` in `pane` from ring offset `pos`.
    pub(crate) fn new(pane: &PaneRow, nonce: &str, pos: u64) -> Follow {
        Follow {
            pane_id: pane.pane_id.clone(),
            num: pane.num,
            begin: format!("{OSC}B{nonce};").into_bytes(),
            end: format!("{OSC}E{nonce};").into_bytes(),
            exit: format!("{OSC}X{nonce};").into_bytes(),
            exit_status: None,
            prompt: None,
            pos,
            before: Vec::new(),
            seen_begin: false,
            body: Vec::new(),
            head: Vec::new(),
            dropped: (0, 0),
            head_lost: false,
            missed: false,
            t0: Instant::now(),
            ended: None,
        }
    }

    /// Whether output before the begin marker says the shell has no
    /// `__sandmux_run` (another shell, or the agent removed it): a line of
    /// the shell's own, `SHELL: [line N: ]__sandmux_run: [command ]not found`
    /// — never the echo of the typed line, which starts otherwise (a command
    /// that mentions the message must not be typed, and run, twice).
    pub(crate) fn no_function(&self) -> bool {
        !self.seen_begin
            && self
                .before
                .split(|b| *b == b'\n')
                .any(shell_says_no_function)
    }

    /// Reads what arrived; true once the end marker has.
    pub(crate) fn poll(&mut self, hub: &Hub) -> bool {
        if self.ended.is_some() {
            return true;
        }
        let chunk = hub.read_since(self.num, self.pos);
        self.take(chunk)
    }

    /// Takes one chunk of the pane's output; true once the end marker came.
    fn take(&mut self, chunk: crate::tmux::hub::Chunk) -> bool {
        self.pos = chunk.end;
        if chunk.missed > 0 {
            self.missed = true;
        }
        let mut data = chunk.data;
        if !self.seen_begin {
            self.before.extend_from_slice(&data);
            match marker(&self.before, &self.begin) {
                Some((i, len, pid)) => {
                    self.prompt = Some(format!("{OSC}P{pid};").into_bytes());
                    data = self.before.split_off(i + len);
                    self.before.clear();
                }
                // Its pid has not arrived yet: only a head at the very end
                // can still become a marker (anything else is not one, and
                // must not stop the bound below).
                None if self.before.len() <= BODY_CAP
                    && find(&self.before, &self.begin)
                        .is_some_and(|i| self.before.len() - i < self.begin.len() + 12) =>
                {
                    return false
                }
                // The marker scrolled out of the ring, or never came in a
                // bound: what is kept is all there is of the command.
                None if self.missed || self.before.len() > BODY_CAP => {
                    data = std::mem::take(&mut self.before);
                    self.head_lost = true;
                }
                None => return false,
            }
            self.seen_begin = true;
        }
        let from = self.body.len().saturating_sub(self.end.len() + 12);
        self.body.extend_from_slice(&data);
        if let Some((at, _, code)) = marker(&self.body[from..], &self.end) {
            self.body.truncate(from + at);
            self.ended = Some(End::Completed(code as i32));
            return true;
        }
        // The command is ending the shell: its status is kept for when
        // the pane is gone (the shell still runs its EXIT trap until then).
        if let Some((at, len, code)) = marker(&self.body[from..], &self.exit) {
            self.body.drain(from + at..from + at + len);
            self.exit_status = Some(code as i32);
        }
        let p = self.prompt.as_deref().unwrap_or(b"\x1b]6973;P-");
        if let Some((at, _, code)) = marker(&self.body[from..], p) {
            self.body.truncate(from + at);
            self.ended = Some(End::Interrupted(code as i32));
            return true;
        }
        if self.body.len() > BODY_CAP {
            let cut = self.body.len() - BODY_CAP;
            let gone: Vec<u8> = self.body.drain(..cut).collect();
            let room = HEAD_CAP.saturating_sub(self.head.len()).min(gone.len());
            self.head.extend_from_slice(&gone[..room]);
            self.dropped.0 += gone.len();
            self.dropped.1 += newlines(&gone);
        }
        false
    }

    /// The result as it stands.
    pub(crate) fn result(&self, status: &str, caps: Caps, timeout: f64) -> RunResult {
        let exit = match self.ended {
            Some(End::Completed(c)) => Some(c),
            Some(End::PaneExited(c)) => c,
            Some(End::Interrupted(c)) => Some(c),
            None => None,
        };
        let body = if self.seen_begin {
            &self.body[..]
        } else {
            &[][..]
        };
        // What left the front: kept whole in `head`, or `head` and a gap.
        let gap = (
            self.dropped.0 - self.head.len(),
            self.dropped.1.saturating_sub(newlines(&self.head)),
        );
        let (head, tail) = (text::clean(&self.head), text::clean(body));
        let head = head.strip_prefix('\n').unwrap_or(&head);
        let tail = tail.strip_suffix('\n').unwrap_or(&tail);
        let tail = match head.is_empty() {
            true => tail.strip_prefix('\n').unwrap_or(tail),
            false => tail,
        };
        self.shaped(status, exit, (head, tail, gap), caps, timeout)
    }

    /// [`Follow::result`] once the text is cut into head and tail.
    fn shaped(
        &self,
        status: &str,
        exit: Option<i32>,
        (head, tail, gap): (&str, &str, (usize, usize)),
        caps: Caps,
        timeout: f64,
    ) -> RunResult {
        let shown = elide(head, tail, gap, caps);
        // The terminal turns each "\n" into "\r\n": one byte of the command's.
        let newline_count = self.dropped.1 + newlines(&self.body);
        let printed = (self.dropped.0 + self.body.len()).saturating_sub(newline_count);
        RunResult {
            status: status.into(),
            exit_status: exit,
            bytes: printed,
            lines: newline_count,
            output: shown.text,
            truncated: shown.bytes > 0 || self.head_lost,
            truncated_lines: shown.lines,
            missed: self.missed,
            pane_id: self.pane_id.clone(),
            elapsed: self.t0.elapsed().as_secs_f64(),
            timeout,
            note: None,
            command_id: None,
        }
    }

    /// The status word for how it ended (`running` while it has not).
    pub(crate) fn status(&self) -> &'static str {
        match self.ended {
            Some(End::Completed(_)) => "completed",
            Some(End::PaneExited(_)) => "pane_exited",
            Some(End::Interrupted(_)) => "interrupted",
            None => "running",
        }
    }
}

fn shell_says_no_function(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(at) = find(line, b"__sandmux_run: ") else {
        return false;
    };
    let (who, rest) = (&line[..at], &line[at..]);
    let Some(shell) = who.strip_suffix(b": ") else {
        return false;
    };
    // "bash" or "bash: line 1" (a shell's name, and a line number).
    let name = shell.split(|b| *b == b':').next().unwrap_or_default();
    !name.is_empty()
        && !name.iter().any(|b| b.is_ascii_whitespace() || *b == b'\'')
        && rest.ends_with(b"not found")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Finds `head` followed by digits and BEL: (offset, length, the number).
fn marker(hay: &[u8], head: &[u8]) -> Option<(usize, usize, u64)> {
    let mut from = 0;
    while let Some(i) = find(&hay[from..], head) {
        let at = from + i;
        let rest = &hay[at + head.len()..];
        let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if (1..=10).contains(&n) && rest.get(n) == Some(&0x07) {
            let v = std::str::from_utf8(&rest[..n]).ok()?.parse().ok()?;
            return Some((at, head.len() + n + 1, v));
        }
        from = at + 1;
    }
    None
}

/// Why [`follow_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// The command ended (see [`Follow::ended`]).
    Ended,
    /// The deadline passed first.
    Deadline,
    /// The shell said it has no `__sandmux_run`: the command never ran.
    NoFunction,
}

/// Follows `f` until it ends (its marker, or its pane exits), the server
/// generation ends, or `wait` does (its deadline, a cancel, the instance's
/// end). The pane is asked whether it still exists every `alive_every`.
pub(crate) async fn follow_until(
    hub: &Hub,
    f: &Mutex<Follow>,
    wait: &mut Wait<'_>,
    alive_every: Duration,
) -> Result<Until, ToolError> {
    let (pane, num) = {
        let g = f.lock().unwrap_or_else(|p| p.into_inner());
        (g.pane_id.clone(), g.num)
    };
    let (_, mut rx) = hub.subscribe(num);
    let mut alive = tokio::time::interval(alive_every);
    alive.tick().await;
    loop {
        {
            let mut g = f.lock().unwrap_or_else(|p| p.into_inner());
            if g.poll(hub) {
                return Ok(Until::Ended);
            }
            if g.no_function() {
                return Ok(Until::NoFunction);
            }
        }
        let event = async {
            tokio::select! {
                r = rx.changed() => r.map(|_| None).map_err(|_| ToolError::stream_closed()),
                _ = alive.tick() => exited(hub, &pane, &mut rx).await,
            }
        };
        match wait.until(event).await? {
            Woke::Deadline => return Ok(Until::Deadline),
            Woke::Event(r) => {
                if let Some(status) = r? {
                    let mut g = f.lock().unwrap_or_else(|p| p.into_inner());
                    if !g.poll(hub) {
                        g.ended = Some(End::PaneExited(g.exit_status.or(status)));
                    }
                    return Ok(Until::Ended);
                }
            }
        }
    }
}

/// `Some(status)` once the pane has exited (see [`pane_exited`]), after
/// its last output has arrived: that travels on its watcher's connection,
/// and may arrive after the command client's answer that the pane is gone,
/// so what still comes is taken (until 100 ms of quiet, at most 1 s).
/// Frozen: `None`, the command is still there (asked again after the thaw).
async fn exited(
    hub: &Hub,
    pane: &str,
    rx: &mut watch::Receiver<u64>,
) -> Result<Option<Option<i32>>, ToolError> {
    let status = match pane_exited(hub, pane).await {
        Err(ToolError::Tmux(e)) if e.frozen() => return Ok(None),
        r => r?,
    };
    if status.is_some() {
        let settle = tokio::time::Instant::now() + Duration::from_secs(1);
        while let Ok(Ok(())) = tokio::time::timeout_at(
            settle.min(tokio::time::Instant::now() + Duration::from_millis(100)),
            rx.changed(),
        )
        .await
        {}
    }
    Ok(status)
}

/// `Some(status)` when the pane has exited: it is gone (its shell ended and
/// tmux closed it) or dead under `remain-on-exit` (with tmux's exit status).
pub(crate) async fn pane_exited(hub: &Hub, pane: &str) -> Result<Option<Option<i32>>, ToolError> {
    let cmd = Cmd::new("display-message")
        .flag("-p")
        .opt("-t", pane)
        .arg("#{pane_id} #{pane_dead} #{pane_dead_status}");
    match hub.run(&cmd).await {
        Ok(lines) => {
            // tmux 3.3 answers a target that no longer exists with empty
            // fields, not an error: the pane id tells.
            let l = lines
                .first()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .unwrap_or_default();
            let mut it = l.split_whitespace();
            if it.next() != Some(pane) {
                return Ok(Some(None));
            }
            Ok((it.next() == Some("1")).then(|| it.next().and_then(|s| s.parse().ok())))
        }
        Err(crate::tmux::client::TmuxError::Command(_)) => Ok(Some(None)),
        Err(e) => Err(ToolError::Tmux(e)),
    }
}

fn newlines(b: &[u8]) -> usize {
    b.iter().filter(|c| **c == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_shell_says_the_function_is_missing() {
        assert!(shell_says_no_function(
            b"bash: __sandmux_run: command not found\r"
        ));
        assert!(shell_says_no_function(b"sh: 1: __sandmux_run: not found"));
        assert!(!shell_says_no_function(
            b"$  __sandmux_run ab 'grep \"bash: __sandmux_run: command not found\" log'"
        ));
        assert!(!shell_says_no_function(
            b"> bash: __sandmux_run: command not found"
        ));
    }

    /// A head of a begin marker that never completes does not hold the
    /// bound: the follow moves on, and keeps at most BODY_CAP.
    #[test]
    fn a_false_begin_marker_cannot_grow_the_buffer() {
        use crate::tmux::hub::Chunk;
        let pane = PaneRow {
            pane_id: "%1".into(),
            num: 1,
            ..Default::default()
        };
        let mut f = Follow::new(&pane, "ab", 0);
        let mut end = 0;
        let mut feed = |f: &mut Follow, data: Vec<u8>| {
            end += data.len() as u64;
            f.take(Chunk {
                data,
                end,
                missed: 0,
            })
        };
        assert!(!feed(&mut f, format!("{OSC}Bab;x").into_bytes()));
        for _ in 0..40 {
            assert!(!feed(&mut f, vec![b'0'; 64 * 1024]));
            assert!(f.before.len() <= BODY_CAP + 64 * 1024 && f.body.len() <= BODY_CAP);
        }
        assert!(f.seen_begin && f.head_lost);
        // A real marker after that still ends it.
        assert!(feed(&mut f, format!("{OSC}Eab;3\x07").into_bytes()));
        assert_eq!(f.ended, Some(End::Completed(3)));
    }

    #[test]
    fn markers_need_digits_and_bel() {
        let end = b"\x1b]6973;Eab;";
        assert_eq!(marker(b"x\x1b]6973;Eab;7\x07y", end), Some((1, 13, 7)));
        assert_eq!(marker(b"\x1b]6973;Eab;\x07", end), None);
        assert_eq!(marker(b"\x1b]6973;Eab;12", end), None);
        assert_eq!(
            marker(b"\x1b]6973;Eab;x\x1b]6973;Eab;0\x07", end),
            Some((12, 13, 0))
        );
    }
}
