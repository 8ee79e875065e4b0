//! The drift check's fast path: tmux's message log.
//!
//! tmux 3.3 adds every command it fires (from any client, a key binding or a
//! hook, once the configuration is loaded) to its message log as
//! `CLIENT[USER] command: COMMAND`, and `show-messages` prints the log newest
//! first, each entry on one line (`cmd_print` escapes newlines) after a time
//! and `": "`. The log keeps the last `message-limit` entries
//! (`minimal-tmux.conf` sets 8), oldest dropped first.
//!
//! The newest entry is always the `show-messages` that asked, so it shows how
//! this connection's entries begin. If every entry after it down to this
//! connection's previous `show-messages` (the previous mark: marks are taken
//! one check at a time) begins the same way, no other client fired anything
//! in between, and the configuration at the previous mark is still the one
//! in force: sandmux's own commands never change what drift watches (P3).
//! Another client's or a key's entry, a hook's, a message, or an entry of
//! ours that is not a plain read or typing command (tmux logs a pane hook or
//! a copy-mode binding that our command fired under our name) sends the
//! caller to the full scan; a log that no longer reaches back, to the global
//! check.
//! A host process that can reach the socket and lies to tmux about its own
//! pid or terminal name can pass as this connection; the two-second idle
//! scan still catches what it changes.

use crate::tmux::hub::Cmd;

/// The probe.
pub(super) fn probe() -> Cmd {
    Cmd::new("show-messages")
}

/// The text of a log line, after its time (`HH:MM: ` or a date).
fn text(line: &[u8]) -> Option<&[u8]> {
    let at = line.windows(2).position(|w| w == b": ")?;
    Some(&line[at + 2..])
}

/// What the log shows since this connection's previous `show-messages`.
#[derive(Debug, PartialEq)]
pub(super) enum Since {
    /// Only this connection's commands.
    Ours,
    /// The previous mark is no longer in the log; all that is, is ours.
    OutOfReach,
    /// Another client's command, a key's, a hook's or a message (or a
    /// reply that is not a log).
    Other,
}

/// Reads a `show-messages` reply back to the previous mark.
pub(super) fn since_mark(lines: &[Vec<u8>]) -> Since {
    const PROBE: &[u8] = b"show-messages";
    let Some((newest, older)) = lines.split_first() else {
        return Since::Other;
    };
    let Some(ours) = text(newest).and_then(|t| t.strip_suffix(PROBE)) else {
        return Since::Other;
    };
    if !ours.ends_with(b" command: ") {
        return Since::Other;
    }
    for line in older {
        match text(line).and_then(|t| t.strip_prefix(ours)) {
            Some(PROBE) => return Since::Ours,
            Some(cmd) if plain(cmd) => {}
            // Another client's, or a command of ours that could change what
            // drift watches (or a hook's or a binding's run for our client).
            _ => return Since::Other,
        }
    }
    Since::OutOfReach
}

/// Commands that read, type or select and change nothing drift watches: the
/// ones sandmux's reads and typing send. Anything else on this connection
/// (sandmux's own `set-option`, a pane hook or a copy-mode binding our
/// command fired, which tmux logs under our name) counts as another
/// client's.
const PLAIN: &[&[u8]] = &[
    b"capture-pane",
    b"clear-history",
    b"copy-mode",
    b"delete-buffer",
    b"display-message",
    b"list-buffers",
    b"list-keys",
    b"list-panes",
    b"list-sessions",
    b"list-windows",
    b"paste-buffer",
    b"refresh-client",
    b"select-pane",
    b"select-window",
    b"send-keys",
    b"set-buffer",
    b"show-buffer",
    b"show-environment",
    b"show-hooks",
    b"show-options",
];

fn plain(cmd: &[u8]) -> bool {
    let name = cmd.split(|b| *b == b' ').next().unwrap_or_default();
    PLAIN.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::{since_mark, Since};

    fn log(lines: &[&str]) -> Vec<Vec<u8>> {
        lines.iter().map(|l| l.as_bytes().to_vec()).collect()
    }

    #[test]
    fn own_commands_since_the_previous_mark_pass() {
        assert_eq!(
            Since::Ours,
            since_mark(&log(&[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9272 command: list-panes -a -F '#{pane_id}'",
                "03:35: client-9272 command: show-messages",
                "03:35: client-1 command: set-hook -g after-new-window x",
            ]))
        );
        assert_eq!(
            Since::Ours,
            since_mark(&log(&[
                "Dec02: client-7[nobody] command: show-messages",
                "Dec02: client-7[nobody] command: show-messages",
            ]))
        );
        assert_eq!(
            Since::OutOfReach,
            since_mark(&log(&[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9272 command: list-panes",
            ]))
        );
        assert_eq!(
            Since::OutOfReach,
            since_mark(&log(&["03:36: client-9272 command: show-messages"]))
        );
    }

    #[test]
    fn anything_else_is_another_clients() {
        let cases: &[&[&str]] = &[
            // Another client between the marks.
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9273 command: set-hook -g after-new-window x",
                "03:35: client-9272 command: show-messages",
            ],
            // The same pid, another user.
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9272[root] command: set -g status on",
                "03:35: client-9272 command: show-messages",
            ],
            // A human's key binding.
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: /dev/pts/3 key C-b: command-prompt",
                "03:35: client-9272 command: show-messages",
            ],
            // A message, a hook's command (no client).
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9272 message: x",
                "03:35: client-9272 command: show-messages",
            ],
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: command: display-message x",
                "03:35: client-9272 command: show-messages",
            ],
            // Our own connection, but a command that can change what drift
            // watches (a pane hook or a copy-mode binding fired by our
            // command is logged under our name).
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9272 command: set-option -g status on",
                "03:36: client-9272 command: send-keys -t %1 j",
                "03:35: client-9272 command: show-messages",
            ],
            &[
                "03:36: client-9272 command: show-messages",
                "03:36: client-9272 command: run-shell 'id'",
                "03:35: client-9272 command: show-messages",
            ],
            // Nothing, or not a log.
            &[],
            &["show-messages", "show-messages"],
            &[
                "03:36: client-9272 key x: show-messages",
                "03:36: client-9272 key x: show-messages",
            ],
        ];
        for c in cases {
            assert_eq!(Since::Other, since_mark(&log(c)), "{c:?}");
        }
    }
}
