//! MCP prompts: text-only recipes (they never contact tmux).

use rmcp::model::{GetPromptResult, Prompt, PromptArgument, PromptMessage, Role};
use serde_json::{Map, Value};

fn arg(name: &str, desc: &str, required: bool) -> PromptArgument {
    PromptArgument::new(name)
        .with_description(desc)
        .with_required(required)
}

/// The prompts.
pub(crate) fn list() -> Vec<Prompt> {
    let mut v = listed();
    for p in &mut v {
        p.icons = Some(super::server::icons::icons());
    }
    v
}

fn listed() -> Vec<Prompt> {
    vec![
        Prompt::new(
            "run_and_wait",
            Some("Run a command in a pane and wait for its exit status"),
            Some(vec![
                arg("command", "the shell command", true),
                arg("pane_id", "the pane, e.g. %1", true),
                arg("timeout", "seconds (clamped to the wait ceiling)", false),
            ]),
        ),
        Prompt::new(
            "diagnose_failing_pane",
            Some("Work out why a pane's program failed"),
            Some(vec![arg("pane_id", "the pane", true)]),
        ),
        Prompt::new(
            "build_dev_workspace",
            Some("Set up editor, shell and log panes in a new session"),
            Some(vec![
                arg("session_name", "the session to create", true),
                arg("log_command", "command for the log pane", false),
            ]),
        ),
        Prompt::new(
            "interrupt_gracefully",
            Some("Stop what runs in a pane, and check that it stopped"),
            Some(vec![arg("pane_id", "the pane", true)]),
        ),
    ]
}

fn get_str(args: Option<&Map<String, Value>>, k: &str) -> Option<String> {
    args.and_then(|a| a.get(k)).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// Longest prompt argument, in bytes.
const MAX_ARG: usize = 32 * 1024;

/// Renders a prompt.
pub(crate) fn get(
    name: &str,
    args: Option<&Map<String, Value>>,
    ceiling: f64,
) -> Result<GetPromptResult, String> {
    // A prompt quotes its arguments: each is as bounded as a call's text.
    if let Some((k, _)) = args
        .into_iter()
        .flatten()
        .find(|(_, v)| v.as_str().is_some_and(|s| s.len() > MAX_ARG))
    {
        return Err(format!(
            "argument {:?} is longer than {MAX_ARG} bytes",
            crate::mcp::text::shown(k)
        ));
    }
    let need = |k: &str| get_str(args, k).ok_or_else(|| format!("missing argument: {k}"));
    let text = match name {
        "run_and_wait" => {
            let cmd = need("command")?;
            let pane = need("pane_id")?;
            let t: f64 = get_str(args, "timeout")
                .and_then(|t| t.parse().ok())
                .unwrap_or(ceiling)
                .min(ceiling);
            let mut s = format!("Call run_command with pane_id={pane}, timeout={t} and command:\n\n{cmd}\n\nIt returns the output and the exit status. If status is \"timeout\", the command is still running: collect it with wait_for_command and the result's command_id, or send_keys with keys=[\"C-c\"] to stop it.");
            if cmd.contains('\n') {
                s.push_str(
                    "\n\nThe command has several lines; each runs in turn in the same shell.",
                );
            }
            s
        }
        "diagnose_failing_pane" => {
            let pane = need("pane_id")?;
            format!("Diagnose pane {pane}: call snapshot_pane (is it dead? in the alternate screen? what is the foreground command?), then capture_pane with max_lines=200 and read the last error. If the pane is dead, its exit status is in dead_status; respawn_pane restarts it. Do not guess: quote the lines you rely on.")
        }
        "build_dev_workspace" => {
            let s = need("session_name")?;
            let log = get_str(args, "log_command").unwrap_or_else(|| "watch -n 1 date".into());
            format!("Call create_session with session_name={s:?}. Then split_window (direction=right) for a shell, and split_window (direction=below, shell={log:?}) for logs. Use select_layout main-vertical, and list_panes to learn the pane ids.")
        }
        "interrupt_gracefully" => {
            let pane = need("pane_id")?;
            format!("Call send_keys with pane_id={pane} and keys=[\"C-c\"] (a key, not text). Then wait_for_stable, and get_pane_info: the foreground command should be the shell again. An echoed ^C is not proof that the program stopped; if it still runs, send C-c once more, then consider kill_pane.")
        }
        other => {
            return Err(format!(
                "unknown prompt {:?}",
                crate::mcp::text::shown(other)
            ))
        }
    };
    Ok(GetPromptResult::new(vec![PromptMessage::new_text(
        Role::User,
        text,
    )]))
}
