//! One tmux control-mode client (`tmux -C`): commands go in as lines, replies
//! come back in order as `%begin`/`%end` blocks, everything else is routed to a
//! [`Sink`]. Every command has a deadline; when the connection dies, every
//! pending command fails at once.
//!
//! Replies that carry pane-controlled text (captures, buffers) are *checked*:
//! the command is followed on the same line by `display-message -p SENTINEL`
//! with a random sentinel. tmux answers each command with its own block, so the
//! reply is accepted only if the very next block is exactly the sentinel and
//! nothing arrived between them. Text that forges a `%end` guard to cut the
//! capture short (T7) leaves a stray guard or an extra block behind; the call
//! then fails, and the client is closed, never left desynchronised.

pub(crate) use super::closing::Closing;
use super::control::{Event, Parser};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

/// A failed tmux command.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub(crate) enum TmuxError {
    /// tmux answered `%error` with this text.
    #[error("tmux: {0}")]
    Command(String),
    /// The connection to the server is gone (server died or was stopped).
    #[error("the tmux server connection is closed ({0})")]
    Closed(Closing),
    /// No answer within the deadline (a stopped or wedged server).
    #[error("tmux did not answer within {0:?} (the server may be stopped or wedged)")]
    Timeout(Duration),
    /// The operator froze the sandbox: nothing is sent to the server.
    #[error("refused: this instance is frozen (the operator stopped every process in the sandbox); calls are refused until they thaw it (sandmux thaw)")]
    Frozen,
    /// The freeze landed while tmux had the command: it may have taken
    /// effect (or take effect at the thaw), so it is no refusal.
    #[error("interrupted: the instance was frozen while tmux had this command (sandbox_status says why: the operator, or a bound); it may have taken effect, or will when it is thawed (sandmux thaw): look before repeating it")]
    FrozenInFlight,
}

impl TmuxError {
    /// Whether a freeze is why (before or while tmux had the command).
    pub(crate) fn frozen(&self) -> bool {
        matches!(self, TmuxError::Frozen | TmuxError::FrozenInFlight)
    }
}

/// Where non-reply events go.
pub(crate) trait Sink: Send + Sync + 'static {
    /// Output of a pane.
    fn output(&self, pane: u32, data: &[u8]);
    /// Any notification line (e.g. `%sessions-changed`).
    fn notification(&self, client: &str, line: &[u8]);
    /// tmux paused a pane for this client.
    fn paused(&self, client: &str, pane: u32);
    /// The client ended.
    fn closed(&self, client: &str, reason: &Closing);
}

type Reply = Result<Vec<Vec<u8>>, TmuxError>;

struct Waiter {
    tx: oneshot::Sender<Reply>,
    /// For checked commands: the sentinel line expected in the next block.
    sentinel: Option<Vec<u8>>,
}

#[derive(Default)]
struct Queue {
    waiters: VecDeque<Waiter>,
    closed: Option<Closing>,
}

struct Shared {
    q: Mutex<Queue>,
    /// Set once the client's output has ended (its process is gone).
    ended: tokio::sync::watch::Sender<bool>,
    /// The session the client was last attached to (`%session-changed`).
    session: tokio::sync::watch::Sender<Option<String>>,
}

impl Shared {
    fn fail_all(&self, reason: &Closing) {
        let mut g = self.q.lock().unwrap_or_else(|p| p.into_inner());
        g.closed = Some(reason.clone());
        for w in g.waiters.drain(..) {
            let _ = w.tx.send(Err(TmuxError::Closed(reason.clone())));
        }
    }
}

/// A checked reply waiting for its sentinel block.
struct Held {
    tx: oneshot::Sender<Reply>,
    lines: Vec<Vec<u8>>,
    error: bool,
    sentinel: Vec<u8>,
}

/// A running control-mode client.
pub(crate) struct Client {
    name: String,
    stdin: tokio::sync::Mutex<ChildStdin>,
    shared: Arc<Shared>,
    child: Mutex<Option<Child>>,
}

fn to_reply(lines: Vec<Vec<u8>>, error: bool) -> Reply {
    if error {
        Err(TmuxError::Command(
            lines
                .iter()
                .map(|l| String::from_utf8_lossy(l).into_owned())
                .collect::<Vec<_>>()
                .join("\n"),
        ))
    } else {
        Ok(lines)
    }
}

fn is_guard(line: &[u8]) -> bool {
    line.starts_with(b"%end ") || line.starts_with(b"%error ") || line.starts_with(b"%begin ")
}

impl Client {
    /// Starts `tmux -N -u -S SOCKET -C attach-session -t TARGET -f FLAGS`.
    pub(crate) async fn attach(
        name: &str,
        tmux: &Path,
        socket: &Path,
        target: &str,
        flags: &str,
        sink: Arc<dyn Sink>,
    ) -> std::io::Result<Client> {
        let mut argv = vec!["attach-session".to_string(), "-t".into(), target.into()];
        if !flags.is_empty() {
            argv.extend(["-f".to_string(), flags.to_string()]);
        }
        Client::start(name, tmux, socket, &argv, sink).await
    }

    /// Starts `tmux -N -u -S SOCKET -C ARGV...`; ARGV is a command that
    /// attaches the client (one that does not ends it). `-N`: never start a
    /// server (a missing one is an error, not a new unconfined server on the
    /// host).
    pub(crate) async fn start(
        name: &str,
        tmux: &Path,
        socket: &Path,
        argv: &[String],
        sink: Arc<dyn Sink>,
    ) -> std::io::Result<Client> {
        let mut cmd = Command::new(tmux);
        cmd.arg("-N")
            .arg("-u")
            .arg("-S")
            .arg(socket)
            .arg("-C")
            .args(argv);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue::default()),
            ended: tokio::sync::watch::channel(false).0,
            session: tokio::sync::watch::channel(None).0,
        });
        let reader = Reader {
            shared: shared.clone(),
            sink,
            name: name.to_string(),
            held: None,
            held_events: Vec::new(),
            own_error: None,
        };
        tokio::spawn(reader.run(stdout));
        Ok(Client {
            name: name.to_string(),
            stdin: tokio::sync::Mutex::new(stdin),
            shared,
            child: Mutex::new(Some(child)),
        })
    }

    /// The client's name (for logs and routing).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    async fn send(&self, line: &str, sentinel: Option<Vec<u8>>, deadline: Duration) -> Reply {
        debug_assert!(!line.contains('\n'), "one command per line");
        let (tx, rx) = oneshot::channel();
        {
            // The queue slot and the write happen under one lock, so replies
            // (which tmux sends in order) always meet their own waiter.
            let mut stdin = self.stdin.lock().await;
            {
                let mut g = self.shared.q.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(reason) = &g.closed {
                    return Err(TmuxError::Closed(reason.clone()));
                }
                g.waiters.push_back(Waiter { tx, sentinel });
            }
            let mut bytes = line.as_bytes().to_vec();
            bytes.push(b'\n');
            if let Err(e) = stdin.write_all(&bytes).await {
                let why = Closing::Io(e.to_string());
                self.shared.fail_all(&why);
                return Err(TmuxError::Closed(why));
            }
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(TmuxError::Closed(Closing::ReaderEnded)),
            Err(_) => {
                self.abandon();
                Err(TmuxError::Timeout(deadline))
            }
        }
    }

    /// Gives the connection up after a deadline passed: every waiter fails
    /// and the process ends, so the next command starts a fresh client.
    fn abandon(&self) {
        self.shared.fail_all(&Closing::Wedged);
        self.kill();
    }

    /// Sends several command lines in one write and waits for all replies
    /// (one round trip instead of one per command).
    pub(crate) async fn run_many(&self, lines: &[String], deadline: Duration) -> Vec<Reply> {
        let mut rxs = Vec::with_capacity(lines.len());
        {
            let mut stdin = self.stdin.lock().await;
            let mut bytes = Vec::new();
            {
                let mut g = self.shared.q.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(reason) = &g.closed {
                    return lines
                        .iter()
                        .map(|_| Err(TmuxError::Closed(reason.clone())))
                        .collect();
                }
                for line in lines {
                    debug_assert!(!line.contains('\n'), "one command per line");
                    let (tx, rx) = oneshot::channel();
                    g.waiters.push_back(Waiter { tx, sentinel: None });
                    rxs.push(rx);
                    bytes.extend_from_slice(line.as_bytes());
                    bytes.push(b'\n');
                }
            }
            if let Err(e) = stdin.write_all(&bytes).await {
                let why = Closing::Io(e.to_string());
                self.shared.fail_all(&why);
                return lines
                    .iter()
                    .map(|_| Err(TmuxError::Closed(why.clone())))
                    .collect();
            }
        }
        let end = tokio::time::Instant::now() + deadline;
        let mut out = Vec::with_capacity(rxs.len());
        for rx in rxs {
            out.push(match tokio::time::timeout_at(end, rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(TmuxError::Closed(Closing::ReaderEnded)),
                Err(_) => {
                    self.abandon();
                    Err(TmuxError::Timeout(deadline))
                }
            });
        }
        out
    }

    /// Sends one command line and waits for its reply, at most `deadline`.
    pub(crate) async fn run(&self, line: &str, deadline: Duration) -> Reply {
        self.send(line, None, deadline).await
    }

    /// Like [`run`](Self::run), for replies that carry pane-controlled text.
    pub(crate) async fn run_checked(&self, line: &str, deadline: Duration) -> Reply {
        let sentinel = format!("sandmux-{}", crate::nonce::hex());
        let full = format!("{line} ; display-message -p {sentinel}");
        self.send(&full, Some(sentinel.into_bytes()), deadline)
            .await
    }

    /// Whether the connection is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared
            .q
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed
            .is_some()
    }

    /// Waits until the client is attached to a session (its own command
    /// made or found one) and returns its id, at most `limit`. Commands
    /// sent before may run before the client's own command: tmux reads a
    /// control client's input from the moment it identifies.
    pub(crate) async fn attached(&self, limit: Duration) -> Reply {
        let mut session = self.shared.session.subscribe();
        let mut ended = self.shared.ended.subscribe();
        let wait = async {
            tokio::select! {
                s = session.wait_for(|s| s.is_some()) => match s {
                    Ok(s) => Ok(vec![s.clone().unwrap_or_default().into_bytes()]),
                    Err(_) => Err(TmuxError::Closed(Closing::ReaderEnded)),
                },
                _ = ended.wait_for(|e| *e) => {
                    let q = self.shared.q.lock().unwrap_or_else(|p| p.into_inner());
                    Err(TmuxError::Closed(q.closed.clone().unwrap_or(Closing::Ended)))
                }
            }
        };
        match tokio::time::timeout(limit, wait).await {
            Ok(r) => r,
            Err(_) => {
                self.abandon();
                Err(TmuxError::Timeout(limit))
            }
        }
    }

    /// Waits until the client's output has ended (its process exited and the
    /// server saw its connection close), at most `limit`.
    pub(crate) async fn ended(&self, limit: Duration) {
        let mut rx = self.shared.ended.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|e| *e)).await;
    }

    /// Ends the client process (a connection not closed yet is marked as
    /// closed by sandmux, so its end is not taken for the server's).
    pub(crate) fn kill(&self) {
        let open = self
            .shared
            .q
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed
            .is_none();
        if open {
            self.shared.fail_all(&Closing::Dropped);
        }
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.start_kill();
            // Reap it, so no zombie lingers until sandmux itself exits.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = c.wait().await;
                });
            }
        }
    }
}

/// The task that reads one client's output and answers its waiters.
struct Reader {
    shared: Arc<Shared>,
    sink: Arc<dyn Sink>,
    name: String,
    /// A checked reply whose sentinel block has not arrived yet.
    held: Option<Held>,
    /// Pane output that arrived between a checked reply and its sentinel.
    held_events: Vec<Event>,
    /// The client's own command failed: why (its end's reason).
    own_error: Option<Closing>,
}

impl Reader {
    async fn run(mut self, mut stdout: tokio::process::ChildStdout) {
        let mut parser = Parser::new();
        let mut buf = vec![0u8; 64 * 1024];
        let reason = 'outer: loop {
            let n = match stdout.read(&mut buf).await {
                Ok(0) => break Closing::Eof,
                Ok(n) => n,
                Err(e) => break Closing::Io(e.to_string()),
            };
            for ev in parser.feed(&buf[..n]) {
                if let Err(reason) = self.event(ev) {
                    break 'outer reason;
                }
            }
        };
        self.end(reason);
    }

    /// Handles one event; `Err` ends the connection with that reason.
    fn event(&mut self, ev: Event) -> Result<(), Closing> {
        let Some(h) = self.held.take() else {
            return self.unheld(ev);
        };
        // Between a checked reply and its sentinel nothing may arrive.
        match ev {
            Event::Reply { flags, lines, .. }
                if flags & 1 == 1 && lines == [h.sentinel.clone()] =>
            {
                let _ = h.tx.send(to_reply(h.lines, h.error));
                for e in std::mem::take(&mut self.held_events) {
                    dispatch(&*self.sink, &self.name, e);
                }
                Ok(())
            }
            Event::Output { .. } | Event::Pause { .. } => {
                self.held_events.push(ev);
                self.held = Some(h);
                Ok(())
            }
            _ => {
                let _ = h.tx.send(Err(TmuxError::Closed(Closing::Forged)));
                Err(Closing::Forged)
            }
        }
    }

    fn unheld(&mut self, ev: Event) -> Result<(), Closing> {
        match ev {
            Event::Reply {
                flags,
                error,
                lines,
                ..
            } => {
                // flags bit 0 clear: a block of the client's own command.
                if flags & 1 == 1 {
                    self.reply(lines, error);
                } else if error
                    && self.own_error.is_none()
                    && self.shared.session.borrow().is_none()
                {
                    let text = lines
                        .iter()
                        .map(|l| String::from_utf8_lossy(l))
                        .collect::<Vec<_>>();
                    self.own_error = Some(Closing::OwnCommand(text.join("; ")));
                }
                Ok(())
            }
            Event::Exit(r) => Err(Closing::Exit(r)),
            // A guard outside any block: a block ended early.
            Event::Notification(ref line) if is_guard(line) => Err(Closing::Forged),
            Event::Notification(ref line) if line.starts_with(b"%session-changed ") => {
                let id = line.split(|b| *b == b' ').nth(1).unwrap_or_default();
                let id = String::from_utf8_lossy(id).into_owned();
                self.shared.session.send_replace(Some(id));
                dispatch(&*self.sink, &self.name, ev);
                Ok(())
            }
            other => {
                dispatch(&*self.sink, &self.name, other);
                Ok(())
            }
        }
    }

    /// A command's reply: to its waiter, or held until its sentinel.
    fn reply(&mut self, lines: Vec<Vec<u8>>, error: bool) {
        let waiter = self
            .shared
            .q
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .waiters
            .pop_front();
        match waiter {
            // After an error tmux runs no further command of the line, so no
            // sentinel follows: deliver at once.
            Some(Waiter {
                tx,
                sentinel: Some(sentinel),
            }) if !error => {
                self.held = Some(Held {
                    tx,
                    lines,
                    error,
                    sentinel,
                })
            }
            Some(Waiter { tx, .. }) => {
                let _ = tx.send(to_reply(lines, error));
            }
            None => {}
        }
    }

    fn end(mut self, ended: Closing) {
        let forged = ended == Closing::Forged;
        if let Some(h) = self.held.take() {
            let _ = h.tx.send(Err(TmuxError::Closed(ended.clone())));
        }
        // A connection already closed (given up on, dropped, or failed on a
        // write) ends with that reason, not with its EOF.
        let reason = {
            let q = self.shared.q.lock().unwrap_or_else(|p| p.into_inner());
            let own = self.own_error.take().filter(|_| !forged);
            q.closed.clone().or(own).unwrap_or(ended)
        };
        self.shared.fail_all(&reason);
        self.sink.closed(&self.name, &reason);
        self.shared.ended.send_replace(true);
    }
}

fn dispatch(sink: &dyn Sink, name: &str, ev: Event) {
    match ev {
        Event::Output { pane, data } => sink.output(pane, &data),
        Event::Pause { pane } => sink.paused(name, pane),
        Event::Notification(line) => sink.notification(name, &line),
        Event::Reply { .. } | Event::Exit(_) => {}
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.kill();
    }
}
