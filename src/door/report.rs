//! A door action's report, line by line, each line with what it says: the
//! audit record counts and lists the lines by their kind, and `--on-end
//! apply` leaves the applied ones out of stderr, never by their words.

/// What one line of a report says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A path brought into the workspace.
    Applied,
    /// A path left in the layer because the human's changed too (or a
    /// branch of the agent's not fetched).
    Conflict,
    /// A path the door's rules hold back.
    HeldBack,
    /// The human's files kept in the layer, and how to put them back.
    Kept,
    /// An undo's steps.
    Undone,
    /// An undo's step that could not be played back.
    NotUndone,
    /// A layer removed.
    Removed,
    /// The action failed (nothing was done).
    Failed,
    /// Anything else: a hint, the digest, what was fetched.
    Note,
}

impl Kind {
    /// The kinds the audit record counts, in the record's order.
    pub(crate) const COUNTED: [Kind; 8] = [
        Kind::Applied,
        Kind::Conflict,
        Kind::HeldBack,
        Kind::Kept,
        Kind::Undone,
        Kind::NotUndone,
        Kind::Removed,
        Kind::Failed,
    ];

    /// The audit record's key for lines of this kind (none for a note).
    pub(crate) fn key(self) -> Option<&'static str> {
        Some(match self {
            Kind::Applied => "applied",
            Kind::Conflict => "conflict",
            Kind::HeldBack => "held_back",
            Kind::Kept => "kept",
            Kind::Undone => "undone",
            Kind::NotUndone => "not_undone",
            Kind::Removed => "removed",
            Kind::Failed => "failed",
            Kind::Note => return None,
        })
    }
}

/// One line of a report: its text as the human reads it, and its kind.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub(crate) kind: Kind,
    pub(crate) text: String,
}

impl Line {
    pub(crate) fn new(kind: Kind, text: impl Into<String>) -> Line {
        Line {
            kind,
            text: text.into(),
        }
    }

    /// A note (counted as nothing).
    pub(crate) fn note(text: impl Into<String>) -> Line {
        Line::new(Kind::Note, text)
    }

    /// "failed: WHY".
    pub(crate) fn failed(why: impl std::fmt::Display) -> Line {
        Line::new(Kind::Failed, format!("failed: {why}"))
    }
}
