//! Why an audit log could not be opened, why a call was not admitted, and
//! why retention could not look at the audit directory.

use super::file::{LastLinkError, NoRoom};
use std::path::PathBuf;

/// Why the log at a path cannot be written by this instance.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// Its directory could not be made.
    #[error("audit log directory {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// The file could not be opened or made.
    #[error("audit log {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another running instance holds its lock.
    #[error("audit log {}: another running instance writes it ({source}); give each instance its own --audit-log", path.display())]
    Held { path: PathBuf, source: nix::Error },
    /// Its chain cannot be continued.
    #[error(transparent)]
    LastLink(#[from] LastLinkError),
    /// No room can be kept for the first records.
    #[error("audit log {}: no room for records ({source})", path.display())]
    NoRoom { path: PathBuf, source: NoRoom },
}

/// Why a tool call was not admitted: it must be refused (P7, fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unadmitted {
    /// The instance's budget is spent.
    #[error("the audit log reached this instance's budget ({budget} bytes: the profile's [mcp] audit_max_bytes); sandmux refuses calls rather than run them unaudited. A human can end this instance and start a new one")]
    Full { budget: u64 },
    /// A write, or the room for one, failed: the file system's words.
    #[error("the audit log cannot be written ({why}); sandmux refuses calls rather than run them unaudited, until it can be written again (the human sees this in `sandmux ps`)")]
    Failing { why: String },
    /// The log is sealed: the instance is ending.
    #[error("the instance is ending")]
    Ending,
}

/// Why retention could not list the audit directory.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", dir.display())]
pub(crate) struct RetentionError {
    pub(crate) dir: PathBuf,
    pub(crate) source: nix::Error,
}
