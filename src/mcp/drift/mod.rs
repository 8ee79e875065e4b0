//! Drift detection (P3): sandmux records the server's hooks, aliases, shells
//! and status line at start and keeps comparing. No tool can change them, so
//! any difference means something else reconfigured the server (an operator's
//! read-write client, or a bug); sandmux then refuses every further call and
//! says why, rather than let a hint (an inspect tool is read-only) silently
//! become false.
//!
//! Three checks, so that the common call pays for little:
//! - before every call, one `show-messages` (a *mark*): tmux logs every
//!   command any client fires (see [`log`]). When the log shows only this
//!   connection's own commands since the previous mark, and that mark was
//!   taken on the recorded configuration, nothing else can have changed it
//!   and the call goes on;
//! - otherwise the *global* check (hooks and watched options at server,
//!   session and window scope: five commands in one round trip) runs first,
//!   or the full scan when the log shows another client's command, a key
//!   binding's or a hook's; a second mark then tells whether the next call
//!   can take the fast path again;
//! - the *full* scan adds every session, window and pane's own hooks and
//!   watched options (a `set-hook -p` or `set -t main default-shell …` is
//!   local and invisible globally). It also runs in the background after
//!   every call that creates, changes or destroys tmux objects or options
//!   (not after reads or typing), and the next call waits for it; and every
//!   two seconds, so a local change the log could not show (a host process
//!   that forged its client name, or one out of the log's reach) is caught
//!   within about that time.

mod log;

use super::error::ToolError;
use crate::tmux::client::TmuxError;
use crate::tmux::hub::{Cmd, Hub};
use log::Since;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// Options with one value, all read by one `display-message` (a format looks
/// options up by name). `#{q:…}` escapes spaces, so the reply splits back into
/// `name=value` words and a change can be named.
const SCALARS: &[&str] = &[
    "default-shell",
    "default-command",
    "status",
    "lock-command",
    "lock-after-time",
    "allow-passthrough",
    "set-clipboard",
    // The fast path reads this many log lines before every call (`log`).
    "message-limit",
    // Formats and commands tmux runs through /bin/sh outside the gate: a
    // `#()` in a rename, title or border format, and copy-pipe's command.
    "automatic-rename-format",
    "set-titles",
    "set-titles-string",
    "pane-border-status",
    "pane-border-format",
    "copy-command",
    // Run by choose-buffer's `e` key through /bin/sh.
    "editor",
];

/// Array options watched besides hooks (formats do not show arrays).
const ARRAYS: &[&str] = &["command-alias", "update-environment"];

/// The global probes, whose output must not change: session and window hooks
/// (pane hooks live with window options globally), the array options, and the
/// scalar options at once.
fn probes() -> &'static [Cmd] {
    static PROBES: std::sync::LazyLock<Vec<Cmd>> = std::sync::LazyLock::new(build_probes);
    &PROBES
}

fn build_probes() -> Vec<Cmd> {
    let scalars: Vec<String> = SCALARS.iter().map(|n| format!("{n}=#{{q:{n}}}")).collect();
    vec![
        Cmd::new("show-hooks").flag("-g"),
        Cmd::new("show-hooks").flag("-gw"),
        Cmd::new("show-options").flag("-s").arg("command-alias"),
        Cmd::new("show-options")
            .flag("-g")
            .arg("update-environment"),
        Cmd::new("display-message")
            .flag("-p")
            .arg(scalars.join(" ")),
    ]
}

/// The key tables sandmux's typing drives (keys sent to a pane in copy mode
/// run their bindings): compared whole in the full scan.
fn key_tables() -> [Cmd; 2] {
    ["copy-mode", "copy-mode-vi"].map(|t| Cmd::new("list-keys").opt("-T", t))
}

/// Lists every session, window and pane (for the full scan).
fn targets_cmd() -> Cmd {
    Cmd::new("list-panes")
        .flag("-a")
        .opt("-F", "#{session_id} #{window_id} #{pane_id}")
}

/// Says what changed between two replies to probe `i`.
fn describe(i: usize, before: &str, after: &str) -> String {
    let words = |s: &str| -> Vec<String> { s.split(' ').map(str::to_string).collect() };
    if i == probes().len() - 1 {
        for (a, b) in words(before).iter().zip(words(after)) {
            if *a != b {
                let name = a.split('=').next().unwrap_or_default();
                let value = |w: &str| {
                    w.split_once('=')
                        .map(|x| x.1.to_string())
                        .unwrap_or_default()
                };
                return format!(
                    "option `{name}` changed from {:?} to {:?}",
                    value(a),
                    value(&b)
                );
            }
        }
    }
    changed(&probes()[i], before, after)
}

/// Names a probe's first line that changed.
fn changed(probe: &Cmd, before: &str, after: &str) -> String {
    let (mut b, mut a) = (before.lines(), after.lines());
    loop {
        match (b.next(), a.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (x, y) => {
                return format!(
                    "`{}` changed: {:?} became {:?}",
                    probe.line(),
                    x.unwrap_or("(nothing)"),
                    y.unwrap_or("(nothing)")
                )
            }
        }
    }
}

/// What the next pre-call check must do before the fast path is trusted
/// again (see [`log`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Owed {
    /// The latest mark was taken on the recorded configuration.
    Nothing,
    /// The global check: the log no longer reached back to a mark.
    Global,
    /// The full scan: another client ran a command after a mark.
    Full,
}

impl Owed {
    fn of(seen: Since) -> Owed {
        match seen {
            Since::Ours => Owed::Nothing,
            Since::OutOfReach => Owed::Global,
            Since::Other => Owed::Full,
        }
    }
}

/// The option or hook name a `show-options` line is about (`name[3] value`).
fn key_of(line: &str) -> &str {
    line.split([' ', '[']).next().unwrap_or_default()
}

/// The baseline, whether drift was seen, and the background scan's progress.
pub(crate) struct Drift {
    baseline: Mutex<Vec<String>>,
    hooks: Mutex<Vec<String>>,
    /// The copy-mode key tables at start.
    keys: Mutex<Vec<String>>,
    tripped: Mutex<Option<String>>,
    /// Counts calls that finished (each asks for a full scan).
    asked: watch::Sender<u64>,
    /// The highest request the last finished scan covered.
    scanned: watch::Sender<u64>,
    /// What is owed before the latest mark (the last `show-messages` on the
    /// command connection) can be trusted. Held across a pre-call check: the
    /// next one reads the log back to that mark.
    owed: tokio::sync::Mutex<Owed>,
}

impl Default for Drift {
    fn default() -> Drift {
        Drift {
            baseline: Mutex::default(),
            hooks: Mutex::default(),
            keys: Mutex::default(),
            tripped: Mutex::default(),
            asked: watch::channel(0).0,
            scanned: watch::channel(0).0,
            owed: tokio::sync::Mutex::new(Owed::Global),
        }
    }
}

async fn snapshot(hub: &Hub) -> Result<Vec<String>, ToolError> {
    let replies = hub.run_many(probes()).await?;
    Ok(replies.iter().map(|r| joined(r)).collect())
}

/// Reads tmux's message log (a mark for the next check): what ran since the
/// previous mark.
async fn mark(hub: &Hub) -> Result<Since, ToolError> {
    match hub.run(&log::probe()).await {
        Ok(lines) => Ok(log::since_mark(&lines)),
        Err(TmuxError::Command(_)) => Ok(Since::Other),
        Err(e) => Err(e.into()),
    }
}

fn joined(reply: &[Vec<u8>]) -> String {
    reply
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A full scan runs at least this often.
const IDLE_SCAN: Duration = Duration::from_secs(2);

/// How long a call waits for the scan the previous call asked for.
const SCAN_WAIT: Duration = Duration::from_secs(10);

impl Drift {
    /// Records the baseline (at start) and runs the first full scan.
    pub(crate) async fn record(&self, hub: &Hub) -> Result<(), ToolError> {
        // A new baseline (a new server generation): no mark is clean yet.
        *self.owed.lock().await = Owed::Global;
        let keys = hub.run_many(&key_tables()).await?;
        *self.keys.lock().unwrap_or_else(|p| p.into_inner()) =
            keys.iter().map(|k| joined(k)).collect();
        let s = snapshot(hub).await?;
        // Unset hooks are listed by name alone; a set one shows `name[N] command`.
        if let Some(h) = s[..2]
            .iter()
            .flat_map(|x| x.lines())
            .find(|l| l.contains('['))
        {
            return Err(ToolError::Drift(format!("a hook is set at start: {h}")));
        }
        let hooks = s[..2]
            .iter()
            .flat_map(|x| x.lines())
            .map(|l| key_of(l).to_string())
            .collect();
        *self.hooks.lock().unwrap_or_else(|p| p.into_inner()) = hooks;
        *self.baseline.lock().unwrap_or_else(|p| p.into_inner()) = s;
        self.local(hub).await
    }

    /// Why calls are refused, if they are.
    pub(crate) fn tripped(&self) -> Option<String> {
        self.tripped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn trip(&self, why: String) -> ToolError {
        let mut t = self.tripped.lock().unwrap_or_else(|p| p.into_inner());
        // The first reason stays the reason.
        if t.is_none() {
            tracing::warn!(reason = %why, "drift: the tmux configuration changed; tool calls are refused");
        }
        let why = t.get_or_insert(why).clone();
        ToolError::Drift(why)
    }

    /// Before a call: waits for the full scan the previous call asked for,
    /// then reads tmux's message log; the full scan runs when the log shows
    /// any command but this connection's own since the previous check.
    pub(crate) async fn before_call(&self, hub: &Hub) -> Result<(), ToolError> {
        let want = *self.asked.borrow();
        let mut done = self.scanned.subscribe();
        if tokio::time::timeout(SCAN_WAIT, done.wait_for(|d| *d >= want))
            .await
            .is_err()
        {
            return Err(ToolError::Internal(
                "the drift scan after the previous call did not finish (is the tmux server stopped?)"
                    .into(),
            ));
        }
        if let Some(why) = self.tripped() {
            return Err(ToolError::Drift(why));
        }
        let mut owed = self.owed.lock().await;
        let need = (*owed).max(Owed::of(mark(hub).await?));
        if need == Owed::Nothing {
            return Ok(());
        }
        // Owed until paid: a failed check leaves it owed.
        *owed = need;
        match need {
            Owed::Full => self.full(hub).await?,
            _ => self.check(hub).await?,
        }
        // The configuration was as recorded after the first mark; what the
        // second one owes depends on what ran in between.
        *owed = Owed::of(mark(hub).await?);
        Ok(())
    }

    /// After a call: asks the background scanner for a full scan.
    pub(crate) fn after_call(&self) {
        self.asked.send_modify(|n| *n += 1);
    }

    /// The background scanner; runs for the life of the instance.
    /// `hub` gives the connection to the current server generation.
    pub(crate) async fn scanner(&self, hub: impl Fn() -> std::sync::Arc<Hub>) {
        let mut asked = self.asked.subscribe();
        loop {
            tokio::select! {
                r = asked.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(IDLE_SCAN) => {}
            }
            // A frozen sandbox is scanned once it is thawed.
            hub().thawed().await;
            let n = *asked.borrow_and_update();
            // A scan that could not finish (the server stopped or the
            // connection was being replaced) is retried: calls keep waiting
            // (at most SCAN_WAIT) rather than go on unchecked.
            let give_up = tokio::time::Instant::now() + SCAN_WAIT;
            while self.tripped().is_none() {
                match self.full(&hub()).await {
                    // Frozen under the scan: finished after the thaw.
                    Err(ToolError::Tmux(e)) if e.frozen() => hub().thawed().await,
                    Err(ToolError::Tmux(TmuxError::Timeout(_) | TmuxError::Closed(_)))
                        if tokio::time::Instant::now() < give_up =>
                    {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    // Done, drift found, or the server is gone for good (each
                    // call's own global check then fails as well).
                    _ => break,
                }
            }
            self.scanned.send_replace(n);
        }
    }

    /// The global check: compares with the baseline; on a difference, trips
    /// for good.
    pub(crate) async fn check(&self, hub: &Hub) -> Result<(), ToolError> {
        if let Some(why) = self.tripped() {
            return Err(ToolError::Drift(why));
        }
        let now = snapshot(hub).await?;
        let base = self
            .baseline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (i, (a, b)) in base.iter().zip(&now).enumerate() {
            if a != b {
                return Err(self.trip(describe(i, a, b)));
            }
        }
        Ok(())
    }

    /// The global check and every session's, window's and pane's own hooks
    /// and watched options.
    pub(crate) async fn full(&self, hub: &Hub) -> Result<(), ToolError> {
        self.check(hub).await?;
        self.bindings(hub).await?;
        self.local(hub).await
    }

    /// The copy-mode key tables against the ones at start.
    async fn bindings(&self, hub: &Hub) -> Result<(), ToolError> {
        let now = hub.run_many(&key_tables()).await?;
        let base = self.keys.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for ((cmd, a), b) in key_tables().iter().zip(&base).zip(&now) {
            let b = joined(b);
            if *a != b {
                return Err(self.trip(changed(cmd, a, &b)));
            }
        }
        Ok(())
    }

    async fn local(&self, hub: &Hub) -> Result<(), ToolError> {
        let listing = hub.run(&targets_cmd()).await?;
        let (mut sessions, mut windows, mut panes) = (vec![], vec![], vec![]);
        for line in &listing {
            let line = String::from_utf8_lossy(line);
            let mut w = line.split(' ');
            let (Some(s), Some(win), Some(p)) = (w.next(), w.next(), w.next()) else {
                continue;
            };
            for (list, id) in [(&mut sessions, s), (&mut windows, win), (&mut panes, p)] {
                if !list.iter().any(|x: &String| x == id) {
                    list.push(id.to_string());
                }
            }
        }
        let cmds: Vec<Cmd> = sessions
            .iter()
            .map(|s| Cmd::new("show-options").flag("-H").opt("-t", s))
            .chain(
                windows
                    .iter()
                    .map(|w| Cmd::new("show-options").flag("-wH").opt("-t", w)),
            )
            .chain(
                panes
                    .iter()
                    .map(|p| Cmd::new("show-options").flag("-pH").opt("-t", p)),
            )
            .collect();
        let replies = hub.run_each(&cmds).await?;
        let hooks = self.hooks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (cmd, reply) in cmds.iter().zip(replies) {
            let reply = match reply {
                Ok(r) => r,
                // The target went away since the listing: nothing to check.
                Err(TmuxError::Command(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            let text = joined(&reply);
            for line in text.lines() {
                let k = key_of(line);
                if SCALARS.contains(&k) || ARRAYS.contains(&k) || hooks.iter().any(|h| h == k) {
                    return Err(self.trip(format!(
                        "`{}` shows `{line}` (set on that one target)",
                        cmd.line()
                    )));
                }
            }
        }
        Ok(())
    }
}
