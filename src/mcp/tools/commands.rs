//! Commands typed by `run_command`, followed on the output stream until their
//! end marker; a command that outlives its call keeps a `command_id`, and
//! `wait_for_command` collects it later, from any pane, after any calls.
//!
//! A [`Follow`] reads its pane's ring incrementally and keeps the command's
//! own output (a bounded tail), so neither completion nor the exit status
//! depends on how much it printed or on how long ago it ended. Ids are
//! bounded ([`MAX_COMMANDS`] per instance): finished ones are evicted oldest
//! first, running ones never; ids belong to one server generation.

use super::super::ctx::Call;
use super::super::error::ToolError;
use super::execute::{pane_exited, RunResult};
use crate::mcp::targets::PaneRow;
use crate::mcp::text;
use crate::tmux::hub::Hub;
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::wait::{Wait, Woke};

/// Long commands kept per instance.
pub const MAX_COMMANDS: usize = 64;
/// Output kept per command (the tail; the same as a pane's ring).
const BODY_CAP: usize = crate::tmux::hub::RING_BYTES;
/// The OSC number sandmux's markers use (tmux draws nothing for it).
const OSC: &str = "\x1b]6973;";

/// How a followed command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its end marker arrived, with this exit status.
    Completed(i32),
    /// The pane's shell ended (with tmux's status when it kept the pane).
    PaneExited(Option<i32>),
    /// The shell prompted again without the end marker (C-c aborted the
    /// command), with the status it had then.
    Interrupted(i32),
}

/// One command's output, read from its pane's ring as it arrives.
pub struct Follow {
    /// The pane (`%N`).
    pub pane_id: String,
    num: u32,
    begin: Vec<u8>,
    end: Vec<u8>,
    /// `OSC P<pid>;` of the shell that printed the begin marker.
    prompt: Option<Vec<u8>>,
    pos: u64,
    before: Vec<u8>,
    seen_begin: bool,
    body: Vec<u8>,
    head_lost: bool,
    missed: bool,
    /// When the command was typed.
    pub t0: Instant,
    /// Set once it ended.
    pub ended: Option<End>,
}

impl Follow {
    /// Follows the command with `nonce` in `pane` from ring offset `pos`.
    pub fn new(pane: &PaneRow, nonce: &str, pos: u64) -> Follow {
        Follow {
            pane_id: pane.pane_id.clone(),
            num: pane.num,
            begin: format!("{OSC}B{nonce};").into_bytes(),
            end: format!("{OSC}E{nonce};").into_bytes(),
            prompt: None,
            pos,
            before: Vec::new(),
            seen_begin: false,
            body: Vec::new(),
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
    pub fn no_function(&self) -> bool {
        !self.seen_begin
            && self
                .before
                .split(|b| *b == b'\n')
                .any(shell_says_no_function)
    }

    /// Reads what arrived; true once the end marker has.
    pub fn poll(&mut self, hub: &Hub) -> bool {
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
        let p = self.prompt.as_deref().unwrap_or(b"\x1b]6973;P-");
        if let Some((at, _, code)) = marker(&self.body[from..], p) {
            self.body.truncate(from + at);
            self.ended = Some(End::Interrupted(code as i32));
            return true;
        }
        if self.body.len() > BODY_CAP {
            let cut = self.body.len() - BODY_CAP;
            self.body.drain(..cut);
            self.head_lost = true;
        }
        false
    }

    /// The result as it stands.
    pub fn result(&self, status: &str, max_lines: usize, timeout: f64) -> RunResult {
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
        let out = text::clean(body);
        let out = out.strip_prefix('\n').unwrap_or(&out);
        let out = out.strip_suffix('\n').unwrap_or(out);
        let capped = text::cap(out, max_lines, 1_000_000);
        RunResult {
            status: status.into(),
            exit_status: exit,
            bytes: out.len(),
            output: capped.text,
            truncated: capped.truncated || self.head_lost,
            truncated_lines: capped.truncated_lines,
            missed: self.missed,
            pane_id: self.pane_id.clone(),
            elapsed: self.t0.elapsed().as_secs_f64(),
            timeout,
            timeout_note: None,
            command_id: None,
        }
    }

    /// The status word for how it ended (`running` while it has not).
    pub fn status(&self) -> &'static str {
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
pub enum Until {
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
                        g.ended = Some(End::PaneExited(status));
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
        Err(ToolError::Tmux(crate::tmux::client::TmuxError::Frozen)) => return Ok(None),
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

struct Entry {
    id: String,
    generation: String,
    follow: Arc<Mutex<Follow>>,
    done: watch::Receiver<bool>,
    max_lines: usize,
}

/// The instance's long commands.
#[derive(Default)]
pub struct Commands {
    entries: Mutex<Vec<Entry>>,
    next: std::sync::atomic::AtomicU64,
}

impl Commands {
    /// Whether a new long command can be kept (a finished one can be evicted,
    /// or there is room).
    pub fn has_room(&self) -> bool {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.len() < MAX_COMMANDS || e.iter().any(|x| *x.done.borrow())
    }

    /// Keeps a command that outlived its call, following it in the
    /// background; returns its id, or None when every slot holds a running one.
    pub fn keep(
        &self,
        hub: Arc<Hub>,
        generation: &str,
        follow: Follow,
        max_lines: usize,
    ) -> Option<String> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() >= MAX_COMMANDS {
            let oldest_done = e.iter().position(|x| *x.done.borrow())?;
            e.remove(oldest_done);
        }
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let id = format!("cmd-{n}");
        let follow = Arc::new(Mutex::new(follow));
        let (tx, done) = watch::channel(false);
        let f = follow.clone();
        tokio::spawn(async move {
            let forever = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
            // In the background the pane is checked once a second (64 of
            // them must not keep tmux busy).
            let every = Duration::from_secs(1);
            let _ = follow_until(&hub, &f, &mut Wait::background(forever), every).await;
            tx.send_replace(true);
        });
        e.push(Entry {
            id: id.clone(),
            generation: generation.to_string(),
            follow,
            done,
            max_lines,
        });
        Some(id)
    }
}

/// `wait_for_command`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitCommand {
    /// The `command_id` a `run_command` result gave.
    pub command_id: String,
    /// Seconds (default 30).
    pub timeout: Option<f64>,
}

/// Waits for a long command to end; the same result shape as `run_command`.
pub async fn wait_for_command(c: &Call<'_>, a: WaitCommand) -> Result<RunResult, ToolError> {
    let timeout = c.clamp(a.timeout, 30.0)?;
    let generation = c.s.info().generation;
    let (follow, mut done, max_lines) = {
        let e =
            c.s.commands
                .entries
                .lock()
                .unwrap_or_else(|p| p.into_inner());
        let Some(x) = e.iter().find(|x| x.id == a.command_id) else {
            return Err(ToolError::invalid(
                "command_id",
                &format!("{:?} is not a command this instance knows", a.command_id),
                "use the command_id of a run_command result that timed out (ids are kept for the 64 most recent long commands)",
            ));
        };
        if x.generation != generation {
            return Err(ToolError::refused(format!(
                "{} belonged to an earlier tmux server of this instance (it was restarted); its pane is gone",
                x.id
            )));
        }
        (x.follow.clone(), x.done.clone(), x.max_lines)
    };
    let mut wait = Wait::call(c, timeout)
        .progress("command running")
        .cancel_says("cancelled by the client; the command is still followed");
    let finished = loop {
        if *done.borrow() {
            break true;
        }
        match wait.until(done.changed()).await? {
            Woke::Event(r) => {
                if r.is_err() {
                    break *done.borrow();
                }
            }
            Woke::Deadline => break false,
        }
    };
    let g = follow.lock().unwrap_or_else(|p| p.into_inner());
    let status = match (finished, g.ended) {
        (_, Some(_)) => g.status(),
        (true, None) => "expired",
        (false, None) => "timeout",
    };
    let mut r = g.result(status, max_lines, timeout.as_secs_f64());
    r.command_id = Some(a.command_id);
    Ok(r)
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
