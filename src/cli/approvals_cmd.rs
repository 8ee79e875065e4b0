//! `sandmux approvals | approve | deny`: the operator's side of the
//! questions a `serve` instance holds (`[network] ask`, `[mcp]
//! ask_toolsets`). Names are the proxy's canonical host names or the
//! catalog's tool names, printed escaped all the same.

use super::{fail, ExitCode};
use crate::mcp::endpoint::{Op, Request};
use serde_json::Value;

/// `sandmux approvals ID [--json]`.
pub(super) fn list(id: &str, json: bool) -> ExitCode {
    let found = match crate::operator::find(id) {
        Ok(f) => f,
        Err(e) => return fail(1, e),
    };
    match crate::operator::request(&found.dir, Request::new(Op::Approvals)) {
        Ok(v) if json => {
            println!("{}", v["approvals"]);
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!("{}", table(&found.id, &v["approvals"]));
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("approvals {}: {e}", found.id)),
    }
}

fn table(id: &str, a: &Value) -> String {
    let p = |v: &Value| crate::term::printable(v.as_str().unwrap_or(""));
    let mut out = String::new();
    let open = a["open"].as_array().cloned().unwrap_or_default();
    if open.is_empty() {
        out.push_str(&format!("{id}: no open questions\n"));
    }
    for q in &open {
        let name = p(&q["name"]);
        let what = match name.strip_prefix("tool ") {
            Some(tool) if q["kind"] == "tool" => {
                format!("may the agent use the tool {tool} with {}", p(&q["detail"]))
            }
            _ => format!("may the sandbox connect to {name}"),
        };
        out.push_str(&format!(
            "{id} question {}: {what}? (waiting {} s, denied in {} s) — sandmux approve {id} {} [--for-instance] | sandmux deny {id} {}\n",
            q["question"], q["waiting_s"], q["deny_in_s"], q["question"], q["question"]
        ));
    }
    for (k, what) in [
        ("granted_for_instance", "for the instance"),
        ("granted_once", "once"),
    ] {
        let names: Vec<String> = a[k]
            .as_array()
            .map(|v| v.iter().map(p).collect())
            .unwrap_or_default();
        if !names.is_empty() {
            out.push_str(&format!("granted {what}: {}\n", names.join(", ")));
        }
    }
    out
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
            let said = match (op, for_instance) {
                (Op::Approve, true) => format!("{name} is allowed for the rest of the instance"),
                (Op::Approve, false) => format!("{name} is allowed once"),
                _ => format!("{name} is refused"),
            };
            println!("{} question {question}: {said}", found.id);
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("{} {}: {e}", op.name(), found.id)),
    }
}
