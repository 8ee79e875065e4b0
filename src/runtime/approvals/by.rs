//! What a question is about and who answered it, as types: whether a human
//! declined, and which share of the audit budget a record is written in,
//! are decided on these, never on the words they render as (the audit
//! record's `kind` and `by`).

use std::fmt;

/// What a question asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    /// A name a pane wants to reach (`scheme://host:port`).
    Network,
    /// Whether a tool of an asking toolset may run (`tool NAME`).
    Tool,
}

impl Asked {
    /// Its word in the audit record and `sandmux approvals`.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Asked::Network => "network",
            Asked::Tool => "tool",
        }
    }
}

/// Who answered a question, or why it ended without an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum By {
    /// The operator, through the instance's endpoint.
    Operator { uid: u32 },
    /// The MCP client's human (elicitation).
    Client,
    /// The client gave no answer, and no one else may.
    ClientSilent,
    /// No answer before the deadline.
    Timeout,
    /// Its connections went away.
    Gone,
    /// Ended by the instance: a freeze, the end, an operator's revoke.
    Withdrawn(String),
}

impl By {
    /// A human's own answer (a denial then says "a human declined").
    pub(crate) fn human(&self) -> bool {
        matches!(self, By::Operator { .. } | By::Client)
    }
}

impl fmt::Display for By {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            By::Operator { uid } => write!(f, "operator uid {uid}"),
            By::Client => f.write_str("client"),
            By::ClientSilent => f.write_str("the client gave no answer"),
            By::Timeout => f.write_str("timeout"),
            By::Gone => f.write_str("withdrawn: its connections went away"),
            By::Withdrawn(why) => f.write_str(why),
        }
    }
}

/// The share of the audit budget a record is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// A pane's question and what becomes of it without a human: the
    /// proxy's share (a pane asking in a loop cannot spend the calls').
    Pane,
    /// A human's answer, a tool's question: an event.
    Event,
}

impl Share {
    /// A record about a question of `asked`, answered (or ended) `by`.
    pub(crate) fn of(asked: Asked, by: Option<&By>) -> Share {
        let operator = matches!(by, Some(By::Operator { .. }));
        match (asked, operator) {
            (Asked::Network, false) => Share::Pane,
            _ => Share::Event,
        }
    }
}
