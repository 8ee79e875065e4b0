//! Report: what the sandbox tells the supervisor while it starts, over a pipe.
//!
//! Each layer is reported as enforced or dropped by the process that applied it,
//! at the moment it applied it — never as planned. A `Fatal` message ends the
//! start-up and names the layer and the fix.

use crate::profile::Layer;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// One message from the sandbox to the supervisor (JSON lines on fd 4).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Message {
    /// A layer is in force.
    Enforced {
        /// The layer.
        layer: Layer,
        /// What exactly, as observed when it was applied.
        detail: String,
    },
    /// A best-effort layer could not be applied.
    Dropped {
        /// The layer.
        layer: Layer,
        /// Why.
        reason: String,
    },
    /// Start-up failed; nothing runs.
    Fatal {
        /// The missing required layer, if that is the cause.
        layer: Option<Layer>,
        /// What failed.
        message: String,
        /// The layer is missing on this machine (the fix is to provide it),
        /// rather than failing to apply to this workspace.
        #[serde(default)]
        unavailable: bool,
        /// What refused it, where the fix depends on that (the host picks a
        /// container's fix from this, never from `message`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<Refusal>,
    },
    /// Every layer is in force, but the payload could not be executed.
    ExecFailed {
        /// What failed.
        message: String,
        /// 127 (not found) or 126 (not executable), as shells report it.
        code: i32,
    },
    /// A step of `__init`'s, sent only when the plan's log level asks
    /// (logged by the supervisor at trace).
    Note {
        /// What `__init` is doing.
        message: String,
        /// When, on the monotonic clock ([`crate::log::mono_us`]).
        #[serde(default)]
        at_us: u64,
    },
    /// The tmux server listens and its socket directory is hidden (tmux mode).
    Ready {
        /// The server's pid inside the sandbox's pid namespace.
        server_pid: i32,
    },
}

/// What refused a start-up step, where the fix depends on it: said by the
/// step that failed, so the fix never depends on how its message reads.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Refusal {
    /// `unshare` answered EPERM, as a seccomp profile does (a host's
    /// namespace limit answers ENOSPC).
    NamespacesEperm,
    /// The kernel refused the mount of a fresh procfs.
    FreshProcfs,
    /// Tmux mode found no mount namespace for `/run/sandmux`.
    NoMountNamespace,
    /// `sethostname` was refused.
    Sethostname,
    /// The kernel refused the copy-on-write layer's overlay mount.
    Overlay,
}

/// The status of one layer in a finished report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct LayerStatus {
    /// The layer.
    pub layer: Layer,
    /// Whether it is in force.
    pub enforced: bool,
    /// Detail or reason.
    pub detail: String,
}

/// Writes messages to the report pipe.
pub(crate) struct Reporter {
    out: Option<std::fs::File>,
    notes: bool,
    /// The layers reported dropped so far (the last word on a layer wins).
    dropped: Vec<Layer>,
}

impl Reporter {
    /// Wraps the report pipe.
    pub(crate) fn new(out: std::fs::File) -> Self {
        Reporter {
            out: Some(out),
            notes: false,
            dropped: Vec::new(),
        }
    }

    /// The layers this process (and the ones it forked from) reported
    /// dropped, in report order.
    pub(crate) fn dropped(&self) -> &[Layer] {
        &self.dropped
    }

    /// Sends notes from now on if the plan's log level is `trace`.
    pub(crate) fn notes(&mut self, level: &str) {
        self.notes = level == "trace";
    }

    /// Sends a [`Message::Note`] if the plan asked for them.
    pub(crate) fn note(&mut self, message: impl FnOnce() -> String) {
        if self.notes {
            let message = message();
            let at_us = crate::log::mono_us();
            self.send(&Message::Note { message, at_us });
        }
    }

    /// Sends one message; a closed pipe (supervisor gone) is ignored here and
    /// handled by the death signal.
    pub(crate) fn send(&mut self, m: &Message) {
        match m {
            Message::Dropped { layer, .. } if !self.dropped.contains(layer) => {
                self.dropped.push(*layer)
            }
            Message::Enforced { layer, .. } => self.dropped.retain(|l| l != layer),
            _ => {}
        }
        if let Some(out) = &mut self.out {
            let mut line = serde_json::to_vec(m).unwrap_or_default();
            line.push(b'\n');
            let _ = out.write_all(&line);
        }
    }

    /// Closes the pipe (the supervisor sees end-of-file).
    pub(crate) fn close(&mut self) {
        self.out = None;
    }
}

/// Reads messages until `Ready`, `Fatal` or end-of-file.
pub(crate) fn read_until_done(r: impl std::io::Read) -> Vec<Message> {
    let mut out = Vec::new();
    for line in std::io::BufReader::new(r).split(b'\n') {
        let Ok(line) = line else { break };
        match serde_json::from_slice::<Message>(&line) {
            Ok(m) => {
                let done = matches!(
                    m,
                    Message::Ready { .. } | Message::Fatal { .. } | Message::ExecFailed { .. }
                );
                out.push(m);
                if done {
                    break;
                }
            }
            Err(_) => continue,
        }
    }
    out
}

/// Logs what the sandbox reported: one event per layer (debug), `__init`'s
/// notes (trace) and a failure's reason (debug; the caller reports it).
pub(crate) fn log(msgs: &[Message]) {
    for m in msgs {
        match m {
            Message::Enforced { layer, detail } => {
                tracing::debug!(layer = %layer, detail = %detail, "layer enforced")
            }
            Message::Dropped { layer, reason } => {
                tracing::debug!(layer = %layer, reason = %reason, "layer dropped")
            }
            Message::Note { message, at_us } => {
                tracing::trace!(target: "sandmux::sandbox::init", at_us, "{message}")
            }
            Message::Fatal { layer, message, .. } => tracing::debug!(
                layer = %layer.map(|l| l.name()).unwrap_or("-"),
                reason = %message,
                "start-up refused"
            ),
            Message::ExecFailed { message, code } => {
                tracing::debug!(code, reason = %message, "the command could not be executed")
            }
            Message::Ready { server_pid } => {
                tracing::debug!(server_pid, "the tmux server is ready")
            }
        }
    }
}

/// Folds messages into one status per layer (the last word on a layer wins).
pub(crate) fn layers(msgs: &[Message]) -> Vec<LayerStatus> {
    let mut v: Vec<LayerStatus> = Vec::new();
    for m in msgs {
        let (layer, enforced, detail) = match m {
            Message::Enforced { layer, detail } => (*layer, true, detail.clone()),
            Message::Dropped { layer, reason } => (*layer, false, reason.clone()),
            _ => continue,
        };
        // A layer dropped twice (no namespace made, then its mount's
        // fallback) keeps both reasons.
        let earlier = v.iter().position(|s| s.layer == layer).map(|i| v.remove(i));
        let detail = match earlier {
            Some(e) if !enforced && !e.enforced && e.detail != detail => {
                format!("{}; {detail}", e.detail)
            }
            _ => detail,
        };
        v.push(LayerStatus {
            layer,
            enforced,
            detail,
        });
    }
    v.sort_by_key(|s| Layer::ALL.iter().position(|l| *l == s.layer));
    v
}
