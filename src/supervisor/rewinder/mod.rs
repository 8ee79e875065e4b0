//! Rewinding a *running* copy-on-write instance (issue 43): the workspace,
//! as the agent's panes see it, put back to how it was after checkpoint N.
//!
//! Overlayfs forbids changing `upper/` under the mounted overlay, so the
//! write goes through the merged view. The confined supervisor cannot
//! reach a sandbox's mount namespace (Landlock closes another domain's
//! `/proc/PID/ns`), and the broker, which can, never handles agent input.
//! So a *rewinder* does it: a fresh process (`sandmux __rewind`, started
//! by the broker, [`spawn`]) that joins the sandbox's user and mount
//! namespaces, confines itself (no capabilities, `no_new_privs`, a
//! Landlock domain: read and write beneath the workspace inside, read
//! beneath the workspace's own tree on the host), and then takes its plan
//! from the *supervisor* over a socket pair the broker handed back
//! ([`drive`]): the target state (checkpoint N's entries of the layer),
//! the current one, and each file content as a descriptor of the
//! history's object. It writes by descriptor beneath the workspace root,
//! never following a link ([`merged`]), while the instance is frozen.
//!
//! The broker sees only the `__init` pid (one of this instance's), as for
//! `expose`; names and contents go from the supervisor to the rewinder.

pub(crate) mod content;
pub(crate) mod drive;
pub(crate) mod inside;
pub(crate) mod merged;
pub(crate) mod mountroot;
pub(crate) mod spawn;

use crate::supervisor::history::Node;
use std::collections::BTreeMap;

pub(crate) use drive::drive;
pub(crate) use spawn::spawn;

/// The rewinder's descriptors, as `spawn` places them.
pub(crate) const SOCK_FD: i32 = 3;
/// The workspace's own tree on the host (the overlay's lower layer).
pub(crate) const LOWER_FD: i32 = 4;
/// The sandbox's mount namespace.
pub(crate) const MNT_FD: i32 = 5;
/// The sandbox's user namespace (absent when it shares ours).
pub(crate) const USER_FD: i32 = 6;
/// The sandbox's mount table (`/proc/PID/mountinfo` of its `__init`).
pub(crate) const MOUNTINFO_FD: i32 = 7;

/// The longest a rewind may take, end to end: past it the supervisor
/// gives up (the instance stays frozen) and the rewinder is killed.
pub(crate) const DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// What the supervisor sends first: both states of the layer, by hex path.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Plan {
    /// The layer at the checkpoint rewound to.
    pub(crate) target: BTreeMap<String, Node>,
    /// The layer as it is now (the checkpoint taken just before).
    pub(crate) current: BTreeMap<String, Node>,
}

/// One line from the rewinder to the supervisor.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum Ask {
    /// The descriptor of this object (a SHA-256 the target names).
    Object(String),
    /// Finished: what was written and removed.
    Done(Done),
    /// Stopped, saying why (the workspace may be half rewound: the
    /// checkpoint before undoes it).
    Failed(String),
    /// Refused before anything was written, saying why.
    Refused(String),
}

/// What a rewind did.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(crate) struct Done {
    /// Entries written (files, links, directories made or changed).
    pub(crate) written: usize,
    /// Entries removed.
    pub(crate) removed: usize,
}

/// Why a running instance could not be rewound.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RewinderError {
    /// The sandbox's namespace could not be had.
    #[error("{path}: {source} (is the sandbox still running?)")]
    Namespace {
        path: String,
        source: std::io::Error,
    },
    /// The sandbox shares the host's mount namespace: no merged view to
    /// write through.
    #[error(
        "the sandbox has no mount namespace of its own: there is no merged view to rewind through"
    )]
    NoMountNamespace,
    /// The workspace's own tree could not be opened.
    #[error("opening the workspace {}: {source}", .path.display())]
    Workspace {
        path: std::path::PathBuf,
        source: nix::Error,
    },
    /// The rewinder process or its socket.
    #[error("the rewinder: {0}")]
    Io(#[from] std::io::Error),
    /// A line that is not the protocol's.
    #[error("the rewinder: {0}")]
    Json(#[from] serde_json::Error),
    /// The rewinder asked for an object the target does not name.
    #[error("the rewinder asked for an object the plan does not name")]
    Unasked,
    /// The rewinder ended without saying it finished.
    #[error("the rewinder ended without finishing")]
    Ended,
    /// Past [`DEADLINE`].
    #[error("the rewind took longer than {} s", DEADLINE.as_secs())]
    Deadline,
    /// The rewinder stopped, saying why (its text names the agent's paths:
    /// escaped where printed).
    #[error("{0}")]
    Failed(String),
    /// The rewinder refused before writing anything.
    #[error("{0}")]
    Refused(String),
}
