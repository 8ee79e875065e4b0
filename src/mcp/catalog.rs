//! The tool catalogue: every MCP tool is declared exactly once, here — name,
//! toolset, annotation class, argument and result types (from which the JSON
//! schemas derive) and handler. `tools/list`, dispatch, the docs table and the
//! classification tests all read this one list.

use super::ctx::Call;
use super::error::ToolError;
use super::targets;
use super::tools::{
    self, buffers, capture, commands, follow, history, input, instance, options, panes, read,
    rewind, sessions, spawn, status, waits, windows,
};
use crate::profile::Toolset;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;

/// What a tool does to the world, which fixes its MCP annotations. The hints
/// are precise because no other client reaches the server (P2) and its
/// configuration is known and watched for drift (P3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Reads tmux metadata.
    MetadataRead,
    /// Reads pane content (text comes from programs the agent runs).
    ContentRead,
    /// Changes something in place (a name, a layout, an option).
    ChangeInPlace,
    /// Creates a buffer.
    Allocate,
    /// Starts processes (sessions, windows, panes).
    Spawn,
    /// Types into a pane.
    PaneInput,
    /// Destroys something.
    Delete,
}

impl Class {
    /// (readOnly, destructive, idempotent, openWorld).
    pub(crate) fn hints(self) -> (bool, bool, bool, bool) {
        match self {
            Class::MetadataRead => (true, false, true, false),
            Class::ContentRead => (true, false, true, true),
            Class::ChangeInPlace => (false, true, true, false),
            Class::Allocate => (false, false, false, false),
            Class::Spawn => (false, false, false, true),
            Class::PaneInput => (false, true, false, true),
            Class::Delete => (false, true, false, false),
        }
    }
}

/// The toolsets, each with its name (in flags, profiles, the operator's
/// requests, the audit log, the docs): the one place they are spelled (a
/// test holds the profile's serde names to it).
pub(crate) const TOOLSETS: [(Toolset, &str); 5] = [
    (Toolset::Inspect, "inspect"),
    (Toolset::Manage, "manage"),
    (Toolset::Execute, "execute"),
    (Toolset::Teardown, "teardown"),
    (Toolset::History, "history"),
];

/// A toolset's name.
pub(crate) fn toolset_name(t: Toolset) -> &'static str {
    TOOLSETS
        .iter()
        .find(|(s, _)| *s == t)
        .map_or("", |(_, n)| n)
}

/// The toolset of a name.
pub(crate) fn toolset_named(name: &str) -> Option<Toolset> {
    TOOLSETS.iter().find(|(_, n)| *n == name).map(|(t, _)| *t)
}

/// Every toolset's name, as a list for messages: "inspect, manage, …".
pub(crate) fn toolset_names() -> String {
    TOOLSETS.map(|(_, n)| n).join(", ")
}

/// What the server and the audit log treat specially about a tool, declared
/// with the tool instead of matched by its name where it matters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Props {
    /// Arguments the audit log keeps only as `{len, sha256}` digests (a
    /// batch's: those of its operations).
    pub secret: &'static [&'static str],
    /// `{NAME: value}` arguments: the log keeps the names and digests each
    /// value (any other form of them whole).
    pub secret_values: &'static [&'static str],
    /// It holds the call until something happens: never inside a read batch.
    pub waits: bool,
    /// It runs operations of its own: never inside a read batch.
    pub batch: bool,
    /// It answers while the sandbox is frozen (it asks tmux nothing).
    pub while_frozen: bool,
    /// It ends the instance, so it runs whatever happened to the server (no
    /// drift check first).
    pub ends_instance: bool,
    /// Every call asks a human first (the approvals path), enabled or not,
    /// whatever an earlier answer granted; with no one to ask, refused.
    pub always_asks: bool,
}

impl Props {
    /// Nothing special.
    pub(crate) const NONE: Props = Props {
        secret: &[],
        secret_values: &[],
        waits: false,
        batch: false,
        while_frozen: false,
        ends_instance: false,
        always_asks: false,
    };
}

/// A boxed handler future.
pub(crate) type BoxFut<'a> = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'a>>;
/// A handler: raw arguments in, structured result out.
pub(crate) type Handler = for<'a> fn(&'a Call<'a>, Value) -> BoxFut<'a>;

/// One tool.
pub(crate) struct ToolDef {
    /// Name on the wire.
    pub name: &'static str,
    /// Toolset it belongs to.
    pub toolset: Toolset,
    /// Annotation class.
    pub class: Class,
    /// One-paragraph description for the model.
    pub description: &'static str,
    /// JSON schema of the arguments.
    pub input_schema: fn() -> Value,
    /// JSON schema of the structured result.
    pub output_schema: fn() -> Value,
    /// The implementation.
    pub handler: Handler,
    /// What is special about it.
    pub props: Props,
}

impl ToolDef {
    /// Whether `call_read_tools_batch` may run it: an inspect tool that
    /// neither waits nor runs operations itself.
    pub(crate) fn in_read_batch(&self) -> bool {
        self.toolset == Toolset::Inspect && !self.props.waits && !self.props.batch
    }
}

/// Every argument name any tool declares secret, and (second) every
/// `{NAME: value}` one. The audit log applies both to every call, a call
/// of an unknown tool and a batch's operations included, so what is secret
/// for one tool is never written in clear for another.
pub(crate) fn secrets() -> &'static (Vec<&'static str>, Vec<&'static str>) {
    static ALL: std::sync::OnceLock<(Vec<&str>, Vec<&str>)> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let mut digested: Vec<&str> = Vec::new();
        let mut maps: Vec<&str> = Vec::new();
        for t in TOOLS {
            digested.extend(t.props.secret.iter().chain(t.props.secret_values));
            maps.extend(t.props.secret_values);
        }
        for v in [&mut digested, &mut maps] {
            v.sort_unstable();
            v.dedup();
        }
        (digested, maps)
    })
}

/// JSON schema of a type, as a plain object (see [`super::schema`]).
pub(crate) fn schema_of<T: schemars::JsonSchema>() -> Value {
    super::schema::plain(serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default())
}

/// JSON schema of a result type (see [`super::schema::plain_output`]), or
/// null for [`Done`](super::tools::tools::Done): a sentence saying what was
/// done needs no schema, and fourteen copies of one would cost every
/// conversation a kilobyte.
pub(crate) fn output_schema_of<T: schemars::JsonSchema>() -> Value {
    if T::schema_name() == "Done" {
        return Value::Null;
    }
    super::schema::plain_output(serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default())
}

/// The argument names a schema declares (its top-level `properties`).
pub(crate) fn property_names(schema: &Value) -> Vec<String> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// Parses arguments after checking that every key is one of `known` (the
/// names the tool's input schema declares).
pub(crate) fn parse_args<T: serde::de::DeserializeOwned>(
    v: Value,
    known: &[String],
) -> Result<T, ToolError> {
    let v = if v.is_null() {
        Value::Object(Default::default())
    } else {
        v
    };
    if let Value::Object(args) = &v {
        for k in args.keys() {
            if !known.contains(k) {
                let hint = if k.starts_with("socket") {
                    "no tool takes a socket: sandmux serves exactly one private tmux server"
                        .to_string()
                } else if known.is_empty() {
                    "this tool takes no arguments".to_string()
                } else {
                    format!("accepted arguments: {}", known.join(", "))
                };
                return Err(ToolError::invalid(k, "unknown argument", &hint));
            }
        }
    }
    T::deserialize(&v).map_err(|e| {
        let msg = e.to_string();
        // The argument whose removal changes the outcome; else the name in
        // serde's message (a missing field); else the arguments as a whole.
        let arg = culprit::<T>(&v, &msg)
            .or_else(|| msg.split('`').nth(1).map(str::to_string))
            .unwrap_or_else(|| "arguments".into());
        ToolError::invalid(&arg, &msg, "see the tool's input schema")
    })
}

/// The argument a type error is about: the one whose removal changes the
/// outcome (serde's message loses the name for flattened target fields, and
/// quotes the bad value rather than the key). Only runs on the error path.
fn culprit<T: serde::de::DeserializeOwned>(v: &Value, msg: &str) -> Option<String> {
    let args = v.as_object()?;
    args.keys()
        .find(|k| {
            let mut less = args.clone();
            less.remove(*k);
            T::deserialize(&Value::Object(less)).map_or_else(|e| e.to_string() != msg, |_| true)
        })
        .cloned()
}

macro_rules! tool {
    ($name:literal, $set:ident, $class:ident, $args:ty, $out:ty, $f:path, $desc:literal $(, $prop:ident: $val:expr)* $(,)?) => {
        ToolDef {
            name: $name,
            toolset: Toolset::$set,
            class: Class::$class,
            description: $desc,
            input_schema: schema_of::<$args>,
            output_schema: output_schema_of::<$out>,
            handler: {
                fn h<'a>(c: &'a Call<'a>, v: Value) -> BoxFut<'a> {
                    // The schema is built once; every call checks names against it.
                    static KNOWN: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
                    let known = KNOWN.get_or_init(|| property_names(&schema_of::<$args>()));
                    Box::pin(async move {
                        let a: $args = parse_args(v, known)?;
                        let o: $out = $f(c, a).await?;
                        let mut v = serde_json::to_value(o)
                            .map_err(|e| ToolError::Internal(e.to_string()))?;
                        super::schema::strip_nulls(&mut v);
                        Ok(v)
                    })
                }
                h
            },
            props: Props {
                $($prop: $val,)*
                ..Props::NONE
            },
        }
    };
}

/// Every tool sandmux has. (libtmux-mcp's `list_servers`, `pipe_pane`,
/// `wait_for_channel` and `signal_channel` are absent on purpose: see
/// docs/mcp.md.)
pub(crate) static TOOLS: &[ToolDef] = &[
    // inspect
    tool!("list_sessions", Inspect, MetadataRead, sessions::ListSessions, sessions::Sessions, sessions::list_sessions, "List tmux sessions (id, name, windows, attached), optionally filtered."),
    tool!("get_session_info", Inspect, MetadataRead, sessions::SessionArgs, sessions::SessionRow, sessions::get_session_info, "Metadata of one session (default: the first)."),
    tool!("list_windows", Inspect, MetadataRead, windows::ListWindows, windows::Windows, windows::list_windows, "List windows (of one session, or all)."),
    tool!("get_window_info", Inspect, MetadataRead, windows::WindowArgs, windows::WindowRow, windows::get_window_info, "Metadata of one window (window_id, or session + window_index; default: the first)."),
    tool!("list_panes", Inspect, MetadataRead, panes::ListPanes, panes::Panes, panes::list_panes, "List panes with id, size, current command and path, dead flag."),
    tool!("get_pane_info", Inspect, MetadataRead, panes::PaneArgs, targets::OnePane, panes::get_pane_info, "Metadata of one pane: the fields of list_panes' items."),
    tool!("find_pane_by_position", Inspect, MetadataRead, panes::FindPane, targets::OnePane, panes::find_pane_by_position, "The pane at a corner of a window: the fields of list_panes' items."),
    tool!("get_server_info", Inspect, MetadataRead, tools::NoArgs, instance::ServerInfo, instance::get_server_info, "The sandboxed tmux server: version, pid, generation, sessions, drift status, profile."),
    tool!("capture_pane", Inspect, ContentRead, capture::Capture, read::Captured, capture::capture_pane, "A pane's text (no escape sequences), its last `max_lines` lines within `max_bytes`; says when it cut."),
    tool!("capture_since", Inspect, ContentRead, capture::CaptureSince, capture::SinceResult, capture::capture_since, "Incremental read: without `cursor`, the screen and a cursor; with one, only output written since (`lines_missed` if some was lost)."),
    tool!("snapshot_pane", Inspect, ContentRead, capture::Snapshot, capture::SnapshotResult, capture::snapshot_pane, "A pane's state (cursor, size, mode, scroll position, alternate screen, pid, dead: the fields of list_panes' items) and text in one call."),
    tool!("search_panes", Inspect, ContentRead, capture::Search, capture::SearchResult, capture::search_panes, "Search every pane's text (or one session's) for a literal or a regex (linear-time engine). Paged."),
    tool!("display_message", Inspect, ContentRead, capture::Display, capture::Displayed, capture::display_message, "Expand a format against a pane (plain lookups of known variables only)."),
    tool!("wait_for_text", Inspect, ContentRead, waits::WaitText, waits::WaitResult, waits::wait_for_text, "Wait until one of `patterns` (or a `stop` pattern) appears in output written after `cursor` or the call's start.", waits: true),
    tool!("wait_for_stable", Inspect, ContentRead, waits::WaitStable, waits::WaitResult, waits::wait_for_stable, "Wait until a pane has written nothing for `quiet_ms`.", waits: true),
    tool!("wait_for_gone", Inspect, ContentRead, waits::WaitGone, waits::WaitResult, waits::wait_for_gone, "Wait until none of `patterns` is on the pane's visible screen.", waits: true),
    tool!("show_option", Inspect, MetadataRead, options::ShowOption, options::OptionValue, options::show_option, "Show a tmux option's value."),
    tool!("show_environment", Inspect, MetadataRead, options::ShowEnv, options::EnvList, options::show_environment, "Show the global or a session's environment (the sandbox's scrubbed one)."),
    tool!("show_hooks", Inspect, MetadataRead, options::ShowHooks, options::Hooks, options::show_hooks, "List hooks. sandmux installs none and stops on any that appear (drift)."),
    tool!("show_hook", Inspect, MetadataRead, options::ShowHook, options::Hooks, options::show_hook, "Show one hook."),
    tool!("show_buffer", Inspect, ContentRead, buffers::ShowBuffer, read::Captured, buffers::show_buffer, "Show a buffer made by load_buffer (tail-capped)."),
    tool!("call_read_tools_batch", Inspect, ContentRead, instance::Batch, instance::BatchResult, instance::call_read_tools_batch, "Run inspect tools in order under one deadline; each result or error in place.", batch: true),
    tool!("export_replay", Inspect, ContentRead, instance::Replay, instance::ReplayResult, instance::export_replay, "Terminal output as asciicast v2 (`asciinema play`), filtered of escapes that act on a viewer: a window of the --record file (page with offset = next_offset), else a pane snapshot. Input is never recorded."),
    tool!("sandbox_status", Inspect, MetadataRead, tools::NoArgs, status::Status, status::sandbox_status, "What confines this terminal: layers as observed, profile, network, workspace mode/guard, limits, audit log.", while_frozen: true),
    // manage
    tool!("rename_session", Manage, ChangeInPlace, sessions::RenameSession, tools::Done, sessions::rename_session, "Rename a session; the name is stored as text, never expanded."),
    tool!("rename_window", Manage, ChangeInPlace, windows::RenameWindow, tools::Done, windows::rename_window, "Rename a window; the name is stored as text."),
    tool!("select_window", Manage, ChangeInPlace, windows::SelectWindow, tools::Done, windows::select_window, "Select a window, or move next/previous/last."),
    tool!("select_layout", Manage, ChangeInPlace, windows::SelectLayout, tools::Done, windows::select_layout, "Apply a preset layout to a window."),
    tool!("resize_window", Manage, ChangeInPlace, windows::ResizeWindow, tools::Done, windows::resize_window, "Resize a window."),
    tool!("move_window", Manage, ChangeInPlace, windows::MoveWindow, tools::Done, windows::move_window, "Move a window to another index or session."),
    tool!("select_pane", Manage, ChangeInPlace, panes::SelectPane, tools::Done, panes::select_pane, "Select a pane by id or direction."),
    tool!("swap_pane", Manage, ChangeInPlace, panes::SwapPane, tools::Done, panes::swap_pane, "Swap two panes."),
    tool!("resize_pane", Manage, ChangeInPlace, panes::ResizePane, tools::Done, panes::resize_pane, "Resize a pane, or toggle zoom."),
    tool!("set_pane_title", Manage, ChangeInPlace, panes::SetTitle, tools::Done, panes::set_pane_title, "Set a pane's title; stored as text."),
    tool!("enter_copy_mode", Manage, ChangeInPlace, panes::CopyMode, tools::Done, panes::enter_copy_mode, "Enter copy mode, optionally scrolling up N lines."),
    tool!("exit_copy_mode", Manage, ChangeInPlace, panes::PaneOnly, tools::Done, panes::exit_copy_mode, "Leave copy mode."),
    tool!("load_buffer", Manage, Allocate, buffers::LoadBuffer, buffers::BufferRef, buffers::load_buffer, "Store text in a new sandmux-named paste buffer (over the control connection; no file) and return its name.", secret: &["content"]),
    // execute
    tool!("create_session", Execute, Spawn, sessions::CreateSession, spawn::Created, sessions::create_session, "Create a session running the sandbox's shell (through the pane gate) in start_directory, with optional environment.", secret_values: &["environment"]),
    tool!("create_window", Execute, Spawn, windows::CreateWindow, spawn::Created, windows::create_window, "Create a window in a session, optionally running `shell` (a command string, run through the pane gate).", secret: &["shell"], secret_values: &["environment"]),
    tool!("split_window", Execute, Spawn, panes::SplitWindow, spawn::Created, panes::split_window, "Split a pane; the new pane runs the shell or `shell`, through the pane gate.", secret: &["shell"], secret_values: &["environment"]),
    tool!("respawn_pane", Execute, PaneInput, panes::Respawn, spawn::Created, panes::respawn_pane, "Restart a pane's process (explicit pane_id), optionally with another `shell` command.", secret: &["shell"], secret_values: &["environment"]),
    tool!("send_keys", Execute, PaneInput, input::SendKeys, input::Sent, input::send_keys, "Type `text` literally and/or press `keys` (validated tmux key names such as C-c, Enter, Up).", secret: &["text", "keys"]),
    tool!("send_keys_batch", Execute, PaneInput, input::SendBatch, input::BatchSent, input::send_keys_batch, "send_keys operations in order, under one deadline.", secret: &["text", "keys"], batch: true),
    tool!("paste_text", Execute, PaneInput, input::PasteText, input::Sent, input::paste_text, "Paste multi-line text through a buffer, bracketed by default, so the shell does not run it line by line.", secret: &["text"]),
    tool!("paste_buffer", Execute, PaneInput, input::PasteBuffer, input::Sent, input::paste_buffer, "Paste a buffer made by load_buffer into a pane."),
    tool!("run_command", Execute, PaneInput, commands::RunCommand, follow::RunResult, commands::run_command, "Run a command in the pane's shell: its output (head and tail) and exit status (`cd`/`export` persist; `exit` ends the pane). On timeout it keeps running: collect it with wait_for_command(command_id).", secret: &["command"]),
    tool!("wait_for_command", Execute, ContentRead, commands::WaitCommand, follow::RunResult, commands::wait_for_command, "Wait for a run_command that timed out (its command_id): its result once it ends, or timeout again. The 64 latest ids are kept.", waits: true),
    tool!("set_option", Execute, ChangeInPlace, options::SetOption, tools::Done, options::set_option, "Set one of a few harmless tmux options (history-limit, remain-on-exit, mode-keys, mouse, synchronize-panes, ...).", secret: &["value"]),
    tool!("set_environment", Execute, ChangeInPlace, options::SetEnv, tools::Done, options::set_environment, "Set a variable in the global or a session's environment (for later panes); tmux, sandmux and loader names are refused.", secret: &["value"]),
    // history (not on by default: the default surface's budget)
    tool!("workspace_rewind", History, Delete, rewind::RewindArgs, rewind::Rewound, rewind::workspace_rewind, "Put your workspace back to how it was after checkpoint n (workspace_history lists them); undone by rewinding to `before`. Every call asks a human first.", always_asks: true),
    tool!("workspace_history", History, MetadataRead, history::HistoryArgs, history::History, history::workspace_history, "Your workspace's checkpoints, one per changing call: number, tool, paths changed (newest 50); with n, one checkpoint's paths.", while_frozen: true),
    // teardown
    tool!("kill_session", Teardown, Delete, sessions::KillSession, tools::Done, sessions::kill_session, "Kill a session (explicit session_id or session_name)."),
    tool!("kill_window", Teardown, Delete, windows::KillWindow, tools::Done, windows::kill_window, "Kill a window (explicit window_id)."),
    tool!("kill_pane", Teardown, Delete, panes::KillPane, tools::Done, panes::kill_pane, "Kill a pane (explicit pane_id)."),
    tool!("clear_pane", Teardown, Delete, panes::PaneOnly, tools::Done, panes::clear_pane, "Reset a pane's screen and clear its history."),
    tool!("delete_buffer", Teardown, Delete, buffers::DeleteBuffer, tools::Done, buffers::delete_buffer, "Delete a buffer made by load_buffer."),
    tool!("kill_server", Teardown, Delete, tools::NoArgs, tools::Done, instance::kill_server, "End this sandmux instance: the tmux server, every process in the sandbox, the runtime directory. The client's connection ends after the reply.", while_frozen: true, ends_instance: true),
];

/// Looks a tool up by name.
pub(crate) fn find(name: &str) -> Option<&'static ToolDef> {
    TOOLS.iter().find(|t| t.name == name)
}

/// The tool table for docs/mcp.md, generated from [`TOOLS`] (a test keeps the
/// document in step with the catalogue).
pub(crate) fn markdown_table() -> String {
    let mut s = String::from("| Tool | Toolset | readOnly | destructive | idempotent | openWorld | What it does |\n|---|---|---|---|---|---|---|\n");
    for t in TOOLS {
        let (ro, de, id, ow) = t.class.hints();
        let ts = toolset_name(t.toolset);
        s.push_str(&format!(
            "| `{}` | {ts} | {ro} | {de} | {id} | {ow} | {} |\n",
            t.name,
            t.description.replace('|', "\\|")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_tool_is_classified_once_with_object_schemas() {
        let mut names = std::collections::BTreeSet::new();
        for t in TOOLS {
            assert!(names.insert(t.name), "{} declared twice", t.name);
            let (ro, destructive, ..) = t.class.hints();
            // Inspect tools are read-only; outside inspect only a wait is
            // (wait_for_command collects what run_command started), and
            // the history's listing (a toolset of its own, off by default;
            // its rewind, which always asks a human first, changes things).
            let history_read = t.toolset == Toolset::History && !t.props.always_asks;
            assert_eq!(
                ro,
                t.toolset == Toolset::Inspect || t.props.waits || history_read,
                "{}: read-only hint must match the inspect toolset",
                t.name
            );
            if t.toolset == Toolset::Teardown {
                assert!(destructive, "{}", t.name);
            }
            let out = (t.output_schema)();
            assert!(
                out.is_null() || out["type"] == "object",
                "{}: {out}",
                t.name
            );
            let input = (t.input_schema)();
            assert_eq!(input["type"], "object", "{}: {input}", t.name);
            assert!(!t.description.is_empty());
        }
        for gone in [
            "list_servers",
            "pipe_pane",
            "wait_for_channel",
            "signal_channel",
        ] {
            assert!(find(gone).is_none(), "{gone} must not exist");
        }
        for t in TOOLS {
            let props = (t.input_schema)()["properties"]
                .as_object()
                .map(|m| m.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default();
            assert!(
                !props.iter().any(|p| p.contains("socket")),
                "{} takes a socket argument",
                t.name
            );
        }
    }

    /// Every secret a tool declares is one of its arguments (a batch's: of
    /// its operations), and the log's lists are what docs/mcp.md says.
    #[test]
    fn secrets_are_real_arguments() {
        for t in TOOLS {
            let input = (t.input_schema)();
            let ops = &input["properties"]["operations"]["items"]["properties"];
            for a in t.props.secret.iter().chain(t.props.secret_values) {
                assert!(
                    input["properties"].get(a).is_some() || ops.get(a).is_some(),
                    "{}: {a} is no argument",
                    t.name
                );
            }
        }
        let (digested, maps) = secrets();
        assert_eq!(
            digested,
            &[
                "command",
                "content",
                "environment",
                "keys",
                "shell",
                "text",
                "value"
            ]
        );
        assert_eq!(maps, &["environment"]);
    }

    /// What any tool declares secret is digested in every record of the
    /// audit log (an unknown tool's and a batch's operations too); a
    /// declared map keeps its names.
    #[test]
    fn the_catalogues_secrets_are_digested_in_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        let a = crate::audit::Audit::open(&p, 1 << 20, secrets()).unwrap();
        let (digested, maps) = secrets();
        let mut calls: Vec<Value> = digested
            .iter()
            .map(|a| json!({ *a: "s3cret", "operations": [{ *a: ["s3cret"] }] }))
            .collect();
        calls.extend(maps.iter().map(|a| json!({ *a: {"NAME": "s3cret"} })));
        for args in &calls {
            a.event(crate::audit::Entry::event("no_such_tool", None, args));
        }
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), calls.len());
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("\"NAME\""), "{text}");
    }

    /// The toolsets' names are the profile's (serde) names, each once.
    #[test]
    fn toolset_names_are_the_profiles() {
        for (t, n) in TOOLSETS {
            assert_eq!(serde_json::to_value(t).unwrap(), *n);
            assert_eq!(toolset_named(n), Some(t));
            assert_eq!(toolset_name(t), n);
        }
        assert_eq!(
            toolset_names(),
            "inspect, manage, execute, teardown, history"
        );
    }

    #[test]
    fn read_batches_hold_inspect_tools_that_neither_wait_nor_batch() {
        let no: Vec<&str> = TOOLS
            .iter()
            .filter(|t| t.toolset == Toolset::Inspect && !t.in_read_batch())
            .map(|t| t.name)
            .collect();
        assert_eq!(
            no,
            [
                "wait_for_text",
                "wait_for_stable",
                "wait_for_gone",
                "call_read_tools_batch"
            ]
        );
    }
}
