//! `run_command` and `wait_for_command`: a command typed into a pane's shell
//! and followed to its end marker (see `follow`); one that outlives its call
//! keeps a `command_id`, and `wait_for_command` collects it later, from any
//! pane, after any calls. Ids are bounded ([`MAX_COMMANDS`] per instance):
//! finished ones are evicted oldest first, running ones never; ids belong to
//! one server generation.

use super::elide::{Caps, DEFAULT_BYTES, MAX_BYTES};
use super::follow::{follow_until, Follow, RunResult, Until};
use super::leave_modes;
use super::read::MAX_LINES;
use super::wait::{Wait, Woke};
use crate::mcp::ctx::Call;
use crate::mcp::error::ToolError;
use crate::mcp::targets::{self, PaneSel};
use crate::mcp::text;
use crate::tmux::hub::{Cmd, Hub};
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Long commands kept per instance.
pub(crate) const MAX_COMMANDS: usize = 64;

/// `run_command`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct RunCommand {
    /// A shell command line.
    pub command: String,
    #[serde(flatten)]
    pub p: PaneSel,
    /// Seconds (default 30).
    pub timeout: Option<f64>,
    /// Lines returned (default 500).
    pub max_lines: Option<usize>,
    /// Bytes returned (default 32768).
    pub max_bytes: Option<usize>,
    /// Keep it out of shell history (default true).
    pub suppress_history: Option<bool>,
    /// On timeout, press C-c.
    #[serde(default)]
    pub interrupt_on_timeout: bool,
    /// Pane not at its prompt: refuse (default), or type anyway.
    pub when_busy: Option<WhenBusy>,
}

/// What `run_command` does with a pane that is not at its prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum WhenBusy {
    /// Refuse, naming the foreground program.
    #[default]
    Refuse,
    /// Type the command into whatever is in the foreground.
    Type,
}

/// The line typed for a command: the pane's `__sandmux_run` (exported to
/// bash by the pane gate, see [`crate::sandbox::pane::RUN_FUNCTION`]) with
/// the command single-quoted, so the screen shows the command as written
/// (`'` as `'\''`; control characters other than newline, which would act as
/// keys in the line editor, as `$(printf '\ooo')`). The markers are printed by
/// the function as OSC sequences nothing draws.
pub(crate) fn wrap(command: &str, nonce: &str, quiet: bool) -> String {
    let mut q = String::with_capacity(command.len() + 16);
    for ch in command.chars() {
        match ch {
            '\'' => q.push_str("'\\''"),
            '\n' => q.push('\n'),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                q.push_str(&format!("'\"$(printf '\\{:03o}')\"'", c as u32))
            }
            c => q.push(c),
        }
    }
    format!(
        "{}__sandmux_run {nonce} '{q}'",
        if quiet { " " } else { "" }
    )
}

/// The same for a shell without `__sandmux_run` (not bash, or the function
/// was removed): one POSIX line, the command as octal escapes for `eval`, so
/// no quote in it can swallow the end marker; longer on screen.
pub(crate) fn wrap_posix(command: &str, nonce: &str, quiet: bool) -> String {
    let mut oct = String::new();
    for &b in command.as_bytes() {
        if b.is_ascii_alphanumeric() {
            oct.push(b as char);
        } else {
            oct.push_str(&format!("\\{b:03o}"));
        }
    }
    format!(
        "{}printf '\\033]6973;B%s;%s\\007' {nonce} \"$$\"; eval \"$(printf '{oct}')\"; printf '\\033]6973;E%s;%s\\007' {nonce} \"$?\"",
        if quiet { " " } else { "" }
    )
}

/// Types `line` and Enter into a pane.
async fn type_line(c: &Call<'_>, pane: &str, line: &str) -> Result<(), ToolError> {
    c.s.hub()
        .run(
            &Cmd::new("send-keys")
                .flag("-l")
                .opt("-t", pane)
                .rest([line.as_bytes()]),
        )
        .await?;
    c.s.hub()
        .run(&Cmd::new("send-keys").opt("-t", pane).arg("Enter"))
        .await?;
    Ok(())
}

/// Runs a command and follows its output until its end marker.
pub(crate) async fn run_command(c: &Call<'_>, a: RunCommand) -> Result<RunResult, ToolError> {
    let (timeout, note) = admitted(c, &a)?;
    let (p, fresh) = pane_or_fresh(c, &a.p).await?;
    if p.dead {
        return Err(ToolError::refused(format!(
            "pane {} is dead; respawn_pane it first",
            p.pane_id
        )));
    }
    let mark = c.s.refusals.mark();
    let fg = foreground(c, &p.pane_id).await?;
    let at_prompt = refuse_if_busy(c, &p.pane_id, &fg).is_ok();
    if a.when_busy.unwrap_or_default() == WhenBusy::Refuse {
        refuse_if_busy(c, &p.pane_id, &fg)?;
    }
    leave_modes(c, &p).await?;
    let nonce = crate::nonce::hex()[..12].to_string();
    // One hub for the whole command: a server restarted meanwhile ends the
    // follow on the old stream, never reads or types into the new one.
    let hub = c.s.hub();
    // Follow from before the keys are sent.
    let (start, _) = hub.subscribe(p.num);
    let quiet = a.suppress_history.unwrap_or(true);
    let bash = fg == "bash" || fg.is_empty();
    let line = if bash {
        wrap(&a.command, &nonce, quiet)
    } else {
        wrap_posix(&a.command, &nonce, quiet)
    };
    type_line(c, &p.pane_id, &line).await?;
    let follow = Mutex::new(Follow::new(&p, &nonce, start));
    let typed = Typed {
        pane: &p,
        nonce: &nonce,
        posix: wrap_posix(&a.command, &nonce, quiet),
    };
    let ended = follow_to_end(c, &hub, &follow, &typed, (timeout, !bash)).await?;
    let caps = Caps {
        lines: a.max_lines.unwrap_or(MAX_LINES).clamp(2, 100_000),
        bytes: a.max_bytes.unwrap_or(DEFAULT_BYTES).clamp(256, MAX_BYTES),
    };
    let f = follow.into_inner().unwrap_or_else(|p| p.into_inner());
    let total = timeout.as_secs_f64();
    let mut r = if ended {
        f.result(f.status(), caps, total)
    } else {
        not_ended(c, &hub, &a, &p.pane_id, f, (caps, total), at_prompt).await?
    };
    r.note = notes([fresh, note, refused_since(c, mark)]);
    Ok(r)
}

/// The command's checks before any pane is touched: its text, the wait
/// (clamped, and the note saying so), room for one more kept command.
fn admitted(c: &Call<'_>, a: &RunCommand) -> Result<(Duration, Option<String>), ToolError> {
    text::input("command", &a.command, c.s.max_input)?;
    if a.command.trim().is_empty() {
        return Err(ToolError::invalid("command", "is empty", "give a command"));
    }
    let timeout = c.clamp(a.timeout, 30.0)?;
    let note = capped(a.timeout, timeout);
    if !c.s.commands.has_room() {
        return Err(ToolError::refused(format!("{} long commands are still running in this instance (each run_command that timed out keeps one until it ends); collect them with wait_for_command or stop them (send_keys C-c) first", MAX_COMMANDS)));
    }
    Ok((timeout, note))
}

/// What was typed where: the pane, the command's nonce, and its POSIX
/// form (typed again when the shell turns out to have no `__sandmux_run`).
struct Typed<'a> {
    pane: &'a targets::PaneRow,
    nonce: &'a str,
    posix: String,
}

/// Follows the pane until the command's end marker (true) or the wait's
/// end (false). A shell without `__sandmux_run` did not run the command:
/// it is typed again in its POSIX form, once.
async fn follow_to_end(
    c: &Call<'_>,
    hub: &Arc<Hub>,
    follow: &Mutex<Follow>,
    t: &Typed<'_>,
    (timeout, mut retyped): (Duration, bool),
) -> Result<bool, ToolError> {
    let mut wait = Wait::call(c, timeout)
        .progress("command running")
        .cancel_says("cancelled by the client; the command may still be running");
    loop {
        let every = Duration::from_millis(250);
        match follow_until(hub, follow, &mut wait, every).await? {
            Until::NoFunction if !retyped => {
                retyped = true;
                let (pos, _) = hub.subscribe(t.pane.num);
                *follow.lock().unwrap_or_else(|p| p.into_inner()) =
                    Follow::new(t.pane, t.nonce, pos);
                type_line(c, &t.pane.pane_id, &t.posix).await?;
            }
            Until::Ended => return Ok(true),
            _ => return Ok(false),
        }
    }
}

/// A command still running at the wait's end: interrupted when asked,
/// else kept to be collected by `wait_for_command` — only when it was
/// typed at a shell prompt (typed into another program, with
/// `when_busy = "type"`, no marker may ever come).
async fn not_ended(
    c: &Call<'_>,
    hub: &Arc<Hub>,
    a: &RunCommand,
    pane_id: &str,
    f: Follow,
    (caps, total): (Caps, f64),
    at_prompt: bool,
) -> Result<RunResult, ToolError> {
    if a.interrupt_on_timeout {
        hub.run(&Cmd::new("send-keys").opt("-t", pane_id).arg("C-c"))
            .await?;
    }
    let status = if a.interrupt_on_timeout {
        "interrupted"
    } else {
        "timeout"
    };
    let mut r = f.result(status, caps, total);
    if !a.interrupt_on_timeout && at_prompt {
        r.command_id =
            c.s.commands
                .keep(hub.clone(), &c.s.info().generation, f, caps);
    }
    Ok(r)
}

/// Says a wait was cut to the ceiling, and which ceiling.
fn capped(asked: Option<f64>, got: std::time::Duration) -> Option<String> {
    asked.filter(|t| *t > got.as_secs_f64()).map(|t| {
        format!(
            "asked for {t} s; {} is {} s",
            crate::mcp::http::router::ceiling_why(),
            got.as_secs_f64()
        )
    })
}

/// The notes of a result, in one line; None when there are none.
fn notes<const N: usize>(parts: [Option<String>; N]) -> Option<String> {
    let v: Vec<String> = parts.into_iter().flatten().collect();
    (!v.is_empty()).then(|| v.join("; "))
}

/// What the allowlist proxy refused since `mark` (clients seldom show its
/// reasons), or None.
fn refused_since(c: &Call<'_>, mark: u64) -> Option<String> {
    let (kept, gone) = c.s.refusals.since(mark);
    if kept.is_empty() {
        return None;
    }
    let more = if gone > 0 {
        format!(" (and {gone} earlier, not kept)")
    } else {
        String::new()
    };
    Some(format!(
        "the network proxy refused while this ran: {}{more}",
        kept.join(" | ")
    ))
}

/// The pane `sel` names; with none named on a server with no session left
/// (the last shell exited), a fresh session `main`, so the agent is never
/// stranded (`create_session` may not be among its tools): the note says so.
async fn pane_or_fresh(
    c: &Call<'_>,
    sel: &targets::PaneSel,
) -> Result<(targets::PaneRow, Option<String>), ToolError> {
    let unnamed = sel.pane_id.is_none()
        && sel.window_id.is_none()
        && sel.s.session_name.is_none()
        && sel.s.session_id.is_none();
    if !unnamed || !c.s.remake_session || !targets::panes(c).await?.is_empty() {
        return Ok((targets::pane(c, sel).await?, None));
    }
    let cmd = super::spawn::making("new-session")
        .flag("-d")
        .opt("-s", crate::tmux::genesis::FIRST_SESSION);
    let cmd = super::spawn::process(c, cmd, &None, &None, None)?
        .opt("-x", "200")
        .opt("-y", "50");
    // A concurrent call may have made it first ("duplicate session"): then
    // its pane is the one.
    let made = super::spawn::spawn(c, cmd, crate::mcp::bounds::Adds::Session).await;
    c.s.drift.after_call();
    let note = made.ok().map(|m| {
        format!(
            "no session was left (the last shell exited), so a fresh session {:?} with pane {} was made for this command: cd, exports and shell variables from before are gone",
            crate::tmux::genesis::FIRST_SESSION,
            m.pane_id
        )
    });
    Ok((targets::pane(c, sel).await?, note))
}

/// The pane's foreground program (`#{pane_current_command}`), waiting (at
/// most 3 s) while the pane is still starting (tmux's fork, then the gate).
async fn foreground(c: &Call<'_>, pane: &str) -> Result<String, ToolError> {
    let cmd = Cmd::new("display-message")
        .flag("-p")
        .opt("-t", pane)
        .arg("#{pane_id} #{pane_current_command}");
    let t0 = Instant::now();
    loop {
        let lines = c.s.hub().run(&cmd).await?;
        let l = lines
            .first()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .unwrap_or_default();
        let (id, fg) = l.split_once(' ').unwrap_or((l.as_str(), ""));
        if id != pane {
            return Ok(String::new());
        }
        let starting = fg == "tmux" || fg.starts_with(crate::sandbox::pane::GATE_NAME);
        if !starting || t0.elapsed() > Duration::from_secs(3) {
            return Ok(fg.to_string());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Refuses when the pane's foreground program is not its shell: the
/// command's keys would go to that program (a REPL, a pager, an editor) or
/// queue behind a running job. A nested shell of the same name counts as the
/// prompt.
fn refuse_if_busy(c: &Call<'_>, pane: &str, fg: &str) -> Result<(), ToolError> {
    let shell = std::path::Path::new(&c.s.policy.sandbox.shell)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if fg.is_empty() || fg == shell {
        return Ok(());
    }
    let fg = text::clean(fg.as_bytes());
    // A long command of ours still runs there: name it, so the agent
    // collects it instead of guessing.
    let ours = match c.s.commands.running_in(pane) {
        Some(id) => format!(" It is still running command {id} of an earlier run_command: collect it with wait_for_command {{\"command_id\": \"{id}\"}}."),
        None => String::new(),
    };
    Err(ToolError::refused(format!(
        "pane {pane} is not at its shell prompt: its foreground program is {fg:?}, not {shell}, so the command's keys would go to {fg:?} (or wait behind it).{ours} Use another pane (split_window), talk to {fg:?} with send_keys, wait for it to end (wait_for_stable), or pass when_busy = \"type\" to type the command anyway"
    )))
}

struct Entry {
    id: String,
    generation: String,
    follow: Arc<Mutex<Follow>>,
    done: watch::Receiver<bool>,
    caps: Caps,
}

/// The instance's long commands.
#[derive(Default)]
pub(crate) struct Commands {
    entries: Mutex<Vec<Entry>>,
    next: std::sync::atomic::AtomicU64,
}

impl Commands {
    /// The id of the newest kept command still running in `pane`.
    pub(crate) fn running_in(&self, pane: &str) -> Option<String> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.iter()
            .rev()
            .filter(|x| !*x.done.borrow())
            .find(|x| x.follow.lock().unwrap_or_else(|p| p.into_inner()).pane_id == pane)
            .map(|x| x.id.clone())
    }

    /// Whether a new long command can be kept (a finished one can be evicted,
    /// or there is room).
    pub(crate) fn has_room(&self) -> bool {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.len() < MAX_COMMANDS || e.iter().any(|x| *x.done.borrow())
    }

    /// Keeps a command that outlived its call, following it in the
    /// background; returns its id, or None when every slot holds a running one.
    pub(crate) fn keep(
        &self,
        hub: Arc<Hub>,
        generation: &str,
        follow: Follow,
        caps: Caps,
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
            caps,
        });
        Some(id)
    }
}

/// `wait_for_command`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct WaitCommand {
    /// From a `run_command` result.
    pub command_id: String,
    /// Seconds (default 30).
    pub timeout: Option<f64>,
}

/// Waits for a long command to end; the same result shape as `run_command`.
pub(crate) async fn wait_for_command(c: &Call<'_>, a: WaitCommand) -> Result<RunResult, ToolError> {
    let timeout = c.clamp(a.timeout, 30.0)?;
    let mark = c.s.refusals.mark();
    let generation = c.s.info().generation;
    let (follow, mut done, caps) = {
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
        (x.follow.clone(), x.done.clone(), x.caps)
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
    let mut r = g.result(status, caps, timeout.as_secs_f64());
    r.command_id = Some(a.command_id);
    r.note = notes([capped(a.timeout, timeout), refused_since(c, mark)]);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NASTY: &[&str] = &[
        "echo 'unbalanced",
        "a'b\"c$d`e\\f",
        "tab\there\x01\x7f",
        "line one\nline two!\n",
        "héllo ✓ '' '\\''",
    ];

    /// Bash reads the typed line back to exactly the command (a stub
    /// `__sandmux_run` prints its second argument).
    #[test]
    fn typed_line_carries_the_command_exactly() {
        for cmd in NASTY {
            let line = wrap(cmd, "abc123", true);
            assert!(line.starts_with(' ') && !line.contains('\x1b'), "{line:?}");
            let script = format!("__sandmux_run() {{ printf %s \"$2\"; }}\n{line}\n");
            let out = std::process::Command::new("bash")
                .args(["-c", &script])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), *cmd, "{line:?}");
        }
    }

    /// The POSIX line runs the command as data between its markers, whatever
    /// quotes it holds, and its echo holds no marker.
    #[test]
    fn posix_line_never_loses_its_end_marker() {
        let line = wrap_posix("echo 'unbalanced", "abc123", false);
        assert!(!line.contains('\x1b'));
        let out = std::process::Command::new("bash")
            .args(["-c", &line])
            .output()
            .unwrap();
        let o = String::from_utf8_lossy(&out.stdout);
        assert!(o.starts_with("\x1b]6973;Babc123;"), "{o:?}");
        assert!(o.ends_with("\x1b]6973;Eabc123;2\x07"), "{o:?}");
    }
}
