//! The operator's commands: instances already running (`ps`, `attach`,
//! `revoke`, `grant`, `freeze`, `thaw`, `approvals`, `journal`, `metrics`, `token set`, `stop`), the
//! workspace door (`diff`, `apply`, `discard`, `git fetch`), `audit verify`,
//! and the generated documents.

use super::args::{AuditCmd, Cmd, GitCmd, Selection, TokenCmd};
use super::{approvals_cmd, fail};
use crate::runtime::endpoint::{Op, Request};
use crate::sandbox::{EXIT_INTERNAL, EXIT_USAGE};
use std::process::ExitCode;

/// The operator's commands (instances already running), and the documents.
pub(super) fn operator(cmd: Cmd) -> ExitCode {
    match cmd {
        Cmd::Ps { json, all } => {
            print!("{}", crate::operator::ps(json, all));
            ExitCode::SUCCESS
        }
        Cmd::Attach { id, read_write, .. } => {
            let attached = crate::operator::find(&id)
                .and_then(|f| crate::attach::attach(&f, read_write).map_err(|e| e.to_string()));
            match attached {
                Ok(c) => ExitCode::from(c as u8),
                Err(e) => fail(1, e),
            }
        }
        Cmd::Revoke { sel, .. } | Cmd::Grant { sel }
            if sel.toolset.is_none()
                && sel.tool.is_none()
                && !sel.all
                && sel.credential.is_none()
                && sel.approval.is_none()
                && sel.expose.is_none() =>
        {
            fail(
                EXIT_USAGE,
                "name --toolset, --tool, --all, --credential, --approval or --expose",
            )
        }
        Cmd::Grant { sel } if sel.expose.is_some() => fail(
            EXIT_USAGE,
            "a port is exposed with `sandmux expose ID PORT`, not by grant",
        ),
        Cmd::Revoke { sel, freeze } if sel.expose.is_some() => unexpose(&sel, freeze),
        Cmd::Expose {
            id,
            port,
            host_port,
            address,
        } => expose(&id, port, host_port, address),
        Cmd::Revoke { sel, freeze: true } if sel.credential.is_some() || sel.approval.is_some() => fail(
            EXIT_USAGE,
            "--freeze goes with tools, not --credential or --approval (run `sandmux freeze ID` after)",
        ),
        Cmd::Revoke { sel, freeze } => operator_change(Op::Revoke, sel, freeze),
        Cmd::Grant { sel } => operator_change(Op::Grant, sel, false),
        Cmd::Freeze { id } => operator_freeze(Op::Freeze, &id),
        Cmd::Approvals { id, json } => approvals_cmd::list(&id, json),
        Cmd::Metrics { id } => metrics(&id),
        Cmd::Token {
            cmd: TokenCmd::Set { id },
        } => token_set(&id),
        Cmd::Approve {
            id,
            question,
            for_instance,
        } => approvals_cmd::answer(Op::Approve, &id, question, for_instance),
        Cmd::Deny { id, question } => approvals_cmd::answer(Op::Deny, &id, question, false),
        Cmd::Thaw { id } => operator_freeze(Op::Thaw, &id),
        Cmd::Journal { id, follow, json } => match journal(&id, follow, json) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(1, e),
        },
        Cmd::Stop { id } => stop_instance(&id),
        cmd => without_instance(cmd),
    }
}

/// The door's commands, the generated documents, `git fetch` and `audit
/// verify`: the commands that need no running instance.
fn without_instance(cmd: Cmd) -> ExitCode {
    match cmd {
        Cmd::ToolsDoc => {
            print!("{}", crate::mcp::catalog::markdown_table());
            ExitCode::SUCCESS
        }
        Cmd::TablesDoc { name } => {
            match crate::tables::all().into_iter().find(|(n, _)| *n == name) {
                Some((_, t)) => {
                    print!("{t}");
                    ExitCode::SUCCESS
                }
                None => fail(EXIT_USAGE, format!("no table {name:?}")),
            }
        }
        Cmd::Diff {
            id, call: Some(n), ..
        } => ExitCode::from(crate::door::calls::diff(&id, n, false) as u8),
        Cmd::Diff {
            id, since: Some(n), ..
        } => ExitCode::from(crate::door::calls::diff(&id, n, true) as u8),
        Cmd::Log { id, json } => ExitCode::from(crate::door::calls::log(&id, json) as u8),
        Cmd::Rewind { id, n } => super::rewind_cmd::rewind(&id, n),
        Cmd::Diff {
            id,
            paths,
            names_only,
            include_ignored,
            upto,
            ..
        } => {
            let look = crate::door::Look {
                paths,
                names_only,
                include_ignored,
                upto,
            };
            ExitCode::from(crate::door::show(&id, &look) as u8)
        }
        Cmd::Apply {
            id,
            paths,
            include_control,
            include_ignored,
            expect,
            undo,
            upto,
        } => {
            let ask = crate::door::Ask {
                paths,
                include_control,
                include_ignored,
                expect,
                undo,
                upto,
            };
            ExitCode::from(crate::door::apply(&id, &ask) as u8)
        }
        Cmd::Discard { id } => ExitCode::from(crate::door::discard(&id) as u8),
        Cmd::Git {
            cmd: GitCmd::Fetch { id, prune },
        } => match crate::guard::commit::fetch(&id, prune) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(1, e),
        },
        Cmd::Audit {
            cmd: AuditCmd::Verify { path },
        } => audit_verify(&path),
        _ => fail(EXIT_INTERNAL, "not an operator command"),
    }
}

/// `sandmux stop ID`: a clean stop through the endpoint (`serve`), else SIGTERM to the owner.
fn stop_instance(id: &str) -> ExitCode {
    match crate::operator::find(id) {
        Ok(f) if f.is_serve() => match crate::operator::request(&f.dir, Request::new(Op::Stop)) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => fail(1, e),
        },
        Ok(f) => {
            let pid = std::fs::read_to_string(f.dir.join("owner"))
                .ok()
                .and_then(|t| {
                    t.split_whitespace()
                        .next()
                        .and_then(|p| p.parse::<i32>().ok())
                });
            match pid {
                Some(p) => {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                    ExitCode::SUCCESS
                }
                None => fail(1, "cannot tell the instance's pid"),
            }
        }
        Err(e) => fail(1, e),
    }
}

/// `sandmux metrics ID`: the Prometheus text, as `GET /metrics` serves it.
fn metrics(id: &str) -> ExitCode {
    let found = match crate::operator::find(id) {
        Ok(f) if f.is_serve() => f,
        Ok(_) => return fail(1, "only `sandmux serve` instances have metrics (run and shell print their summary at the end)"),
        Err(e) => return fail(1, e),
    };
    match crate::operator::request(&found.dir, Request::new(Op::Metrics)) {
        // The text is sandmux's own: fixed names, label values without
        // control characters (`mcp::metrics`).
        Ok(v) => {
            print!("{}", v["text"].as_str().unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("metrics {}: {e}", found.id)),
    }
}

/// `sandmux token set ID`: the token from stdin (at most 4 KiB and a line
/// end), sent over the operator endpoint; only its digest is printed.
fn token_set(id: &str) -> ExitCode {
    use std::io::Read;
    let mut buf = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(crate::mcp::http::TOKEN_MAX as u64 + 3)
        .read_to_end(&mut buf);
    if let Err(e) = read {
        return fail(1, format!("token set: reading the token from stdin: {e}"));
    }
    let Ok(text) = String::from_utf8(buf) else {
        return fail(EXIT_USAGE, "token set: the token must be printable ASCII");
    };
    let mut req = Request::new(Op::Token);
    req.token = Some(crate::runtime::endpoint::Secret(text));
    match crate::operator::find(id).and_then(|f| crate::operator::request(&f.dir, req)) {
        Ok(v) => {
            eprintln!(
                "token set: {} ({}): the token in force is {}",
                crate::term::field(&v["event"], "?"),
                crate::term::printable(id),
                crate::term::field(&v["token"], "?")
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("token set: {e}")),
    }
}

/// `sandmux journal ID`: a running instance's records (`--follow`: until
/// it ends), or a finished one's, from the audit log named after it.
fn journal(id: &str, follow: bool, json: bool) -> Result<(), String> {
    let out = &mut std::io::stdout();
    match crate::operator::find(id) {
        Ok(f) => crate::operator::journal(&f, follow, json, out),
        Err(_) if !follow => crate::audit::finished(id)
            .map_err(|e| e.to_string())
            .and_then(|p| crate::operator::journal_of_log(&p, json, out)),
        Err(e) => Err(e),
    }
}

/// `sandmux audit verify PATH`.
fn audit_verify(path: &std::path::Path) -> ExitCode {
    match crate::audit::verify(path) {
        Ok(v) if v.sealed => {
            println!(
                "{}: {} records, chain intact, sealed",
                path.display(),
                v.records
            );
            ExitCode::SUCCESS
        }
        Ok(v) => {
            println!("{}: {} records, chain intact, NOT sealed: it does not end with the record a clean stop writes (the instance still runs, was killed, or records after the last one shown were removed)", path.display(), v.records);
            ExitCode::from(3)
        }
        Err(e) => fail(1, format!("{}: {e}", path.display())),
    }
}

fn operator_freeze(which: Op, id: &str) -> ExitCode {
    let op = which.name();
    let found = match crate::operator::find(id) {
        Ok(f) if f.is_serve() => f,
        Ok(_) => return fail(1, "only `sandmux serve` instances can be frozen"),
        Err(e) => return fail(1, e),
    };
    match crate::operator::request(&found.dir, Request::new(which)) {
        Ok(v) => {
            println!("{}", crate::operator::freeze_line(op, &found.id, &v));
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("{op} {}: {e}", found.id)),
    }
}

/// `sandmux expose`: prints where the host reaches the port.
fn expose(id: &str, port: u16, host_port: Option<u16>, address: Option<String>) -> ExitCode {
    let mut req = Request::new(Op::Expose);
    (req.port, req.host_port, req.address) = (Some(port), host_port, address);
    match crate::operator::find(id).and_then(|f| crate::operator::request(&f.dir, req)) {
        Ok(v) => {
            let host = crate::term::field(&v["host"], "?");
            println!("{host}");
            eprintln!(
                "expose: port {port} of the sandbox is reachable at http://{host}/ (sandmux revoke ID --expose {port} ends it)"
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("expose: {e}")),
    }
}

/// `sandmux revoke ID --expose PORT`.
fn unexpose(sel: &Selection, freeze: bool) -> ExitCode {
    if freeze {
        return fail(
            EXIT_USAGE,
            "--freeze goes with tools, not --expose (run `sandmux freeze ID` after)",
        );
    }
    let mut req = Request::new(Op::Revoke);
    req.port = sel.expose;
    match crate::operator::find(&sel.id).and_then(|f| crate::operator::request(&f.dir, req)) {
        Ok(v) => {
            println!(
                "revoke: port {} is no longer exposed ({} closed)",
                v["port"],
                crate::term::field(&v["host"], "?")
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, format!("revoke: {e}")),
    }
}

fn operator_change(which: Op, sel: Selection, freeze: bool) -> ExitCode {
    let op = which.name();
    let mut req = crate::operator::change(which, sel.toolset, sel.tool, sel.all, freeze);
    req.credential = sel.credential.clone();
    req.approval = sel.approval.clone();
    let found = crate::operator::find(&sel.id);
    let id = found.as_ref().map(|f| f.id.clone()).unwrap_or_default();
    match found.and_then(|f| crate::operator::request(&f.dir, req)) {
        Ok(_) if sel.approval.is_some() => {
            let name = crate::term::printable(sel.approval.as_deref().unwrap_or_default());
            println!("{op}: {name} is no longer allowed (it asks again)");
            ExitCode::SUCCESS
        }
        Ok(v) if sel.credential.is_some() => {
            let name = crate::term::printable(sel.credential.as_deref().unwrap_or_default());
            let what = if which == Op::Grant {
                "granted again: requests carrying its placeholder are served"
            } else {
                "revoked: requests carrying its placeholder are refused"
            };
            println!("{op}: credential {name} {what}");
            let _ = v;
            ExitCode::SUCCESS
        }
        Ok(v) => {
            let ts = v["toolsets"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            println!(
                "{op}: {} tools enabled now (toolsets: {})",
                v["tools_enabled"],
                crate::term::printable(&ts)
            );
            if let Some(n) = v["not_granted"].as_array().filter(|a| !a.is_empty()) {
                println!(
                    "not granted (the instance did not start with them): {}",
                    n.iter()
                        .filter_map(|x| x.as_str())
                        .map(crate::term::printable)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if freeze {
                println!("{}", crate::operator::freeze_line("freeze", &id, &v));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, e),
    }
}
