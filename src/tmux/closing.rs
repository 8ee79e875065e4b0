//! Why a control-mode connection closed: decided on by the hub (whether the
//! server is gone) and by genesis (whether tmux refused the control
//! session), so it is a type, and its message is rendered from it.

/// Why a connection to the tmux server is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Closing {
    /// tmux's output ended.
    #[error("end of output")]
    Eof,
    /// Reading tmux's output, or writing a command to it, failed (the
    /// system's words).
    #[error("{0}")]
    Io(String),
    /// Pane output tried to forge control-mode framing.
    #[error("pane output tried to forge control-mode framing; the connection was reset")]
    Forged,
    /// tmux said `%exit`, with its reason if any.
    #[error("{}", .0.as_deref().unwrap_or("exit"))]
    Exit(Option<String>),
    /// The client's own command (the one that attaches it) failed: tmux's
    /// text, for the message only.
    #[error("tmux: {0}")]
    OwnCommand(String),
    /// A command outlived its deadline: whatever held it (a stopped
    /// server, or a prompt a key binding opened on this client, which
    /// blocks its command queue) goes with the connection, and the next
    /// command gets a fresh one.
    #[error("tmux did not answer in time; the connection was replaced")]
    Wedged,
    /// sandmux itself let go of the client (replaced or dropped).
    #[error("the connection was closed by sandmux")]
    Dropped,
    /// The task reading the client's output is gone.
    #[error("reader ended")]
    ReaderEnded,
    /// The client ended with no reason recorded.
    #[error("ended")]
    Ended,
    /// The hub was shut down: this server generation has ended.
    #[error("this server generation has ended")]
    GenerationEnded,
    /// A fresh command client could not be started.
    #[error("reconnecting: {0}")]
    Reconnecting(String),
    /// The sandbox never started (why).
    #[error("the sandbox did not start: {0}")]
    NotStarted(String),
    /// A pane's output stream closed under a wait.
    #[error("the tmux server is gone (the pane's output stream closed)")]
    StreamClosed,
    /// The instance's end interrupted a wait.
    #[error("the instance is ending (the tmux server is gone or sandmux was told to stop)")]
    InstanceEnding,
}

impl Closing {
    /// Whether sandmux closed the connection itself (given up on, dropped)
    /// or pane output forced it: the server may well be alive.
    pub(crate) fn by_sandmux(&self) -> bool {
        matches!(self, Closing::Forged | Closing::Wedged | Closing::Dropped)
    }
}
