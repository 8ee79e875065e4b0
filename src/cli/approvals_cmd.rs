//! `sandmux approvals | approve | deny`: the operator's side of the
//! questions a `serve` instance holds (`[network] ask`, `[mcp]
//! ask_toolsets`). A question's row names only what sandmux checked (the
//! proxy's canonical host names, the catalog's tool names); a tool call's
//! arguments, the agent's words, only on lines labelled as the agent's
//! (`crate::runtime::approvals::shown`).

use super::{fail, ExitCode};
use crate::mcp::shown::checked_name;
use crate::runtime::approvals::shown::{detail, labelled, Name};
use crate::runtime::endpoint::{Op, Request};
use crate::term;
use serde_json::Value;

/// `sandmux approvals ID [--json]`.
pub(super) fn list(id: &str, json: bool) -> ExitCode {
    let found = match crate::operator::find(id) {
        Ok(f) => f,
        Err(e) => return fail(1, e),
    };
    match crate::operator::request(&found.dir, Request::new(Op::Approvals)) {
        Ok(v) if json => {
            println!("{}", term::json_text(&v["approvals"]));
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!("{}", table(&found.id, &v["approvals"], columns()));
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("approvals {}: {e}", found.id)),
    }
}

/// The terminal's columns when stdout is one, else 80.
fn columns() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call.
    let r = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    match r == 0 && ws.ws_col > 0 {
        true => usize::from(ws.ws_col),
        false => 80,
    }
}

/// The open questions and the grants, for a terminal `cols` wide. A
/// question's row holds sandmux's words and values it checked (the number,
/// a catalog tool or canonical host, the times); a tool call's arguments
/// follow on lines of their own, each starting `agent wrote:`, none wider
/// than the terminal (`crate::runtime::approvals::shown`).
fn table(id: &str, a: &Value, cols: usize) -> String {
    let mut out = String::new();
    let open = a["open"].as_array().cloned().unwrap_or_default();
    if open.is_empty() {
        out.push_str(&format!("{id}: no open questions\n"));
    }
    for q in &open {
        row(&mut out, id, q, cols);
    }
    for (k, what) in [
        ("granted_for_instance", "for the instance"),
        ("granted_once", "once"),
    ] {
        let names: Vec<&str> = a[k]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|n| shown_name(n.as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default();
        if !names.is_empty() {
            out.push_str(&format!("granted {what}: {}\n", names.join(", ")));
        }
    }
    out
}

/// One question: its row, and the agent's text below it.
fn row(out: &mut String, id: &str, q: &Value, cols: usize) {
    let n = q["question"].as_u64().map_or("?".into(), |n| n.to_string());
    let raw = q["name"].as_str().unwrap_or("");
    let (what, agent) = match (checked_name(raw), q["kind"].as_str()) {
        (Some(Name::Tool(tool)), Some("tool")) => (
            format!("may the agent use the tool {tool} with the arguments below"),
            Some(inert(q["detail"].as_str().unwrap_or(""))),
        ),
        (Some(Name::Host(name)), Some("network")) => {
            (format!("may the sandbox connect to {name}"), None)
        }
        // Never from sandmux's endpoint: the name is shown as the agent's.
        _ => (
            "a question whose name is not of sandmux's form (below)".into(),
            Some(detail(&Value::String(raw.into())).text),
        ),
    };
    let secs = |k: &str| q[k].as_u64().unwrap_or(0);
    out.push_str(&format!(
        "{id} question {n}: {what}? (waiting {} s, denied in {} s) — sandmux approve {id} {n} [--for-instance] | sandmux deny {id} {n}\n",
        secs("waiting_s"),
        secs("deny_in_s")
    ));
    for line in labelled(&agent.unwrap_or_default(), cols) {
        out.push_str(&line);
        out.push('\n');
    }
    if let Some(n) = q["detail_cut_from"].as_u64() {
        out.push_str(&format!("    (cut: the arguments are {n} bytes in all)\n"));
    }
}

/// The endpoint's arguments text as it is: printable ASCII with no run of
/// spaces; anything else (never from sandmux's endpoint) in a JSON string.
fn inert(text: &str) -> String {
    match text.bytes().all(|b| (0x20..0x7f).contains(&b)) && !text.contains("  ") {
        true => text.to_string(),
        false => detail(&Value::String(text.into())).text,
    }
}

/// A name sandmux vouches for, or a word saying it cannot.
fn shown_name(name: &str) -> &str {
    match checked_name(name) {
        Some(_) => name,
        None => "(a name not of sandmux's form)",
    }
}

/// `sandmux approve ID Q [--for-instance]`, `sandmux deny ID Q`.
pub(super) fn answer(op: Op, id: &str, question: u64, for_instance: bool) -> ExitCode {
    let found = match crate::operator::find(id) {
        Ok(f) => f,
        Err(e) => return fail(1, e),
    };
    let mut r = Request::new(op);
    (r.question, r.for_instance) = (Some(question), for_instance);
    match crate::operator::request(&found.dir, r) {
        Ok(v) => {
            let name = crate::term::printable(v["name"].as_str().unwrap_or(""));
            let said = match (op, v["granted"].as_str()) {
                (Op::Approve, Some("instance")) => {
                    format!("{name} is allowed for the rest of the instance")
                }
                (Op::Approve, _) if for_instance => format!(
                    "{name} is allowed once: it asks a human on every call, whatever was granted"
                ),
                (Op::Approve, _) => format!("{name} is allowed once"),
                _ => format!("{name} is refused"),
            };
            println!("{} question {question}: {said}", found.id);
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("{} {}: {e}", op.name(), found.id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::approvals::shown::LABEL;
    use serde_json::json;

    /// What a terminal `cols` wide shows: each line wrapped at `cols`.
    fn screen(out: &str, cols: usize) -> Vec<String> {
        let mut rows = Vec::new();
        for line in out.lines() {
            let cs: Vec<char> = line.chars().collect();
            rows.extend(cs.chunks(cols).map(|c| c.iter().collect::<String>()));
        }
        rows
    }

    /// How the row was drawn before: the arguments inline, only controls
    /// and non-ASCII escaped (plain ASCII went through as it was).
    fn naive(id: &str, args: &Value) -> String {
        format!("{id} question 1: may the agent use the tool kill_session with {}? (waiting 1 s, denied in 59 s) — sandmux approve {id} 1 [--for-instance] | sandmux deny {id} 1\n", term::printable(&args.to_string()))
    }

    /// Arguments that, drawn inline, wrap into a second question's row on a
    /// terminal `cols` wide, padded with `pad` (a run of spaces, or any
    /// plain character: the terminal wraps at a column all the same).
    fn forging(id: &str, cols: usize, pad: char) -> Value {
        let before = format!(
            "{id} question 1: may the agent use the tool kill_session with {{\"session_name\":\"x"
        );
        let pad = pad.to_string().repeat(cols - before.len() % cols);
        let fake = format!("{id} question 2: may the sandbox connect to https://docs.example.org:443? (waiting 1 s, denied in 59 s) - sandmux approve {id} 2 [--for-instance] | sandmux deny {id} 2");
        json!({ "session_name": format!("x{pad}{fake}{pad}") })
    }

    fn listing(args: &Value) -> Value {
        let d = detail(args);
        json!({"open": [{"question": 1, "kind": "tool", "name": "tool kill_session", "detail": d.text, "detail_cut_from": d.cut_from, "waiting_s": 1, "deny_in_s": 59}]})
    }

    #[test]
    fn the_agents_text_cannot_draw_a_question_row() {
        let id = "3f2a";
        let rows = |s: &[String]| {
            s.iter()
                .filter(|l| l.starts_with(&format!("{id} question")))
                .count()
        };
        for (cols, pad) in [(60, ' '), (80, ' '), (132, ' '), (60, '.'), (80, '.')] {
            let args = forging(id, cols, pad);
            // Positive control: drawn the old way, the terminal shows two.
            let old = screen(&naive(id, &args), cols);
            assert_eq!(rows(&old), 2, "{cols}: {old:#?}");
            let out = table(id, &listing(&args), cols);
            let new = screen(&out, cols);
            assert_eq!(rows(&new), 1, "{cols}: {new:#?}");
            // The agent's lines: labelled, and none wraps.
            let agent: Vec<&str> = out.lines().skip(1).collect();
            assert!(agent.len() > 2, "{out}");
            for l in agent {
                let cut = l.starts_with("    (cut: ");
                assert!(cut || l.starts_with(LABEL) && l.len() < cols, "{cols}: {l}");
            }
            // The crafted text is there, as the agent's (a run of spaces is
            // six bytes a space: the cut may come first).
            let joined: String = out
                .lines()
                .skip(1)
                .map(|l| l.trim_start_matches(LABEL))
                .collect();
            assert!(
                pad == ' ' || joined.contains("3f2a question 2: may the sandbox"),
                "{out}"
            );
            assert!(
                out.contains("may the agent use the tool kill_session with the arguments below?")
            );
        }
    }

    #[test]
    fn what_the_endpoint_did_not_vouch_for_is_shown_as_the_agents() {
        let a = json!({"open": [
            {"question": 1, "kind": "network", "name": "https://a.test:443? (waiting 1 s)  x", "waiting_s": 1, "deny_in_s": 5},
            {"question": 2, "kind": "tool", "name": "tool kill_session", "detail": "{\"a\":\"b    c\u{202e}\"}", "waiting_s": 1, "deny_in_s": 5},
        ], "granted_once": ["https://b.test:443", "tool x y"]});
        let out = table("i", &a, 80);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with(
                "i question 1: a question whose name is not of sandmux's form (below)?"
            ),
            "{out}"
        );
        assert_eq!(
            lines[1],
            format!("{LABEL}\"https://a.test:443? (waiting 1 s) \\u0020x\"")
        );
        assert_eq!(
            lines[3],
            format!("{LABEL}\"{{\\\"a\\\":\\\"b \\u0020\\u0020\\u0020c\\u202e\\\"}}\"")
        );
        assert_eq!(
            lines[4],
            "granted once: https://b.test:443, (a name not of sandmux's form)"
        );
    }
}
