//! Tool errors: every failure says what went wrong and what to do next, and
//! maps to one audit outcome.

use crate::tmux::client::TmuxError;

/// A tool call that did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ToolError {
    /// An argument is missing, of the wrong type, unknown or out of range.
    #[error("invalid argument `{arg}`: {message} (hint: {hint})")]
    Invalid {
        /// The argument.
        arg: String,
        /// What is wrong.
        message: String,
        /// What to do instead.
        hint: String,
    },
    /// The target does not exist.
    #[error("{what} not found (hint: {hint})")]
    NotFound {
        /// What was looked for.
        what: String,
        /// What to do instead.
        hint: String,
    },
    /// sandmux's policy refuses this (P3, P4).
    #[error("refused: {0}")]
    Refused(String),
    /// The call's audit record could not be written, so it did not run (P7).
    #[error("refused: {0}")]
    Unaudited(String),
    /// A profile limit (`[limits] max_sessions`, `max_panes`) is reached;
    /// nothing was created.
    #[error("limit reached: {message} (hint: {hint})")]
    Limit {
        /// Which limit, its value, and what exists.
        message: String,
        /// What to do instead.
        hint: String,
    },
    /// tmux failed the command.
    #[error("{0}")]
    Tmux(#[from] TmuxError),
    /// The server's configuration changed behind sandmux's back.
    #[error("configuration drift: {0}; sandmux refuses further calls")]
    Drift(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl ToolError {
    /// A pane's output stream closed under a wait: that server generation is gone.
    pub(crate) fn stream_closed() -> ToolError {
        ToolError::Tmux(TmuxError::Closed(
            crate::tmux::closing::Closing::StreamClosed,
        ))
    }

    /// An invalid argument.
    pub(crate) fn invalid(arg: &str, message: &str, hint: &str) -> ToolError {
        ToolError::Invalid {
            arg: arg.into(),
            message: message.into(),
            hint: hint.into(),
        }
    }
    /// A missing target.
    pub(crate) fn not_found(what: impl Into<String>, hint: &str) -> ToolError {
        ToolError::NotFound {
            what: what.into(),
            hint: hint.into(),
        }
    }
    /// A policy refusal.
    pub(crate) fn refused(why: impl Into<String>) -> ToolError {
        ToolError::Refused(why.into())
    }
    /// The error's kind, as reported to clients and the audit log.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ToolError::Invalid { .. } => "invalid_argument",
            ToolError::NotFound { .. } => "not_found",
            ToolError::Refused(_) => "refused",
            ToolError::Unaudited(_) => "audit_unavailable",
            ToolError::Limit { .. } => "limit_reached",
            ToolError::Tmux(TmuxError::Timeout(_)) => "timeout",
            ToolError::Tmux(TmuxError::Closed(_)) => "server_gone",
            ToolError::Tmux(TmuxError::Frozen | TmuxError::FrozenInFlight) => "frozen",
            ToolError::Tmux(_) => "tmux_error",
            ToolError::Drift(_) => "drift",
            ToolError::Internal(_) => "internal",
        }
    }
    /// The audit outcome: `malformed`, `refused` or `error`.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            ToolError::Invalid { .. } => "malformed",
            ToolError::Refused(_)
            | ToolError::Unaudited(_)
            | ToolError::Drift(_)
            | ToolError::Limit { .. }
            | ToolError::Tmux(TmuxError::Frozen) => "refused",
            _ => "error",
        }
    }
}
