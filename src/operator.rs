//! The operator's commands: `sandmux ps | revoke | grant | freeze |
//! thaw | journal | stop` (`attach` is `crate::attach`). They find this user's instances in the runtime directory and talk to
//! each `serve` instance through its operator endpoint (`runtime::endpoint`).

use crate::runtime::endpoint::{Op, Request};
use crate::supervisor::rundir::{self, Kind, Meta};
use crate::term;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One running instance.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Instance id (the runtime directory's name).
    pub id: String,
    /// Its runtime directory.
    pub dir: PathBuf,
    /// What `meta.json` says (None: unreadable, or not written yet).
    pub meta: Option<Meta>,
}

impl Found {
    /// Whether a `sandmux serve` runs it (the kind with an endpoint).
    pub(crate) fn is_serve(&self) -> bool {
        self.meta.as_ref().is_some_and(|m| m.kind == Kind::Serve)
    }
}

/// This user's live instances.
pub(crate) fn instances() -> Vec<Found> {
    let Ok(base) = rundir::base() else {
        return vec![];
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let dir = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !rundir::owner_alive(&dir) {
            continue;
        }
        let meta = rundir::Rundir::read_meta(&dir);
        out.push(Found {
            id: name,
            dir,
            meta,
        });
    }
    out.sort_by_key(|f| f.meta.as_ref().map_or(0, |m| m.started));
    out
}

/// Finds an instance by id or unique id prefix.
pub(crate) fn find(id: &str) -> Result<Found, String> {
    let all: Vec<Found> = instances()
        .into_iter()
        .filter(|f| f.id.starts_with(id))
        .collect();
    match all.len() {
        1 => Ok(all.into_iter().next().expect("one")),
        0 => Err(format!("no running instance {id:?} (see sandmux ps)")),
        n => Err(format!("{id:?} matches {n} instances; give more of the id")),
    }
}

/// Sends one request to an instance's endpoint.
pub(crate) fn request(dir: &Path, req: Request) -> Result<Value, String> {
    request_within(dir, req, Duration::from_secs(10))
}

/// [`request`], waiting up to `wait` for the answer (a rewind writes the
/// workspace before it answers).
pub(crate) fn request_within(dir: &Path, req: Request, wait: Duration) -> Result<Value, String> {
    let path = dir.join("control.sock");
    let mut s = UnixStream::connect(&path).map_err(|e| {
        format!(
            "{}: {e} (only `sandmux serve` instances have an endpoint)",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(wait)).ok();
    let mut line = serde_json::to_string(&req).map_err(|e| e.to_string())?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(|e| e.to_string())?;
    let mut reply = String::new();
    BufReader::new(s)
        .read_line(&mut reply)
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&reply).map_err(|e| format!("bad reply: {e}"))?;
    if v["ok"] == true {
        Ok(v)
    } else {
        Err(v["error"].as_str().unwrap_or("refused").to_string())
    }
}

/// The `ps` table.
pub(crate) fn ps(json_out: bool, all: bool) -> String {
    let rows: Vec<Value> = instances().iter().map(ps_row).collect();
    let layers: Vec<Value> = match all {
        true => crate::supervisor::kept::list()
            .iter()
            .map(layer_row)
            .collect(),
        false => Vec::new(),
    };
    if json_out {
        let every = rows.into_iter().chain(layers).collect();
        return format!("{}\n", term::json_text(&Value::Array(every)));
    }
    let mut out = ps_line([
        "ID",
        "KIND",
        "PROFILE",
        "PID",
        "CLIENT",
        "STATE",
        "TOOLSETS",
        "REVERTED",
        "AUDIT",
        "WORKSPACE",
    ]);
    for r in &rows {
        out.push_str(&ps_cells(r));
    }
    // `serve --http`: where clients connect and where the token is.
    for r in rows.iter().filter(|r| r["http"]["url"].is_string()) {
        out.push_str(&format!(
            "{}: MCP at {} (Bearer token in {})\n",
            term::field(&r["id"], ""),
            term::field(&r["http"]["url"], ""),
            term::field(&r["http"]["token_file"], "")
        ));
    }
    // `sandmux expose`: where the host reaches a port of the sandbox.
    for r in &rows {
        for e in r["exposures"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "{}: port {} exposed at {}{} ({} connections)\n",
                term::field(&r["id"], ""),
                e["port"],
                term::field(&e["host"], ""),
                if e["loopback"] == false {
                    " (NOT loopback)"
                } else {
                    ""
                },
                e["tally"]["connections"]
            ));
        }
    }
    for r in rows.iter().filter(|r| r["audit"]["reason"].is_string()) {
        out.push_str(&format!(
            "{}: audit log {}: {}\n",
            term::field(&r["id"], ""),
            term::field(&r["audit"]["state"], ""),
            term::field(&r["audit"]["reason"], "")
        ));
    }
    if all {
        out.push_str(&layers_table(&layers));
    }
    out
}

/// A kept copy-on-write layer's `ps --all` row.
fn layer_row(k: &crate::supervisor::kept::Kept) -> Value {
    json!({
        "id": k.id,
        "kind": "layer",
        "profile": k.meta.profile,
        "workspace": k.meta.workspace,
        "created": k.meta.created,
        "running": k.running,
        "applied": k.applied,
        "bytes": k.bytes,
        "files": k.files,
        "at_least": k.more,
    })
}

/// The kept layers under the instances, one line each (the workspace's
/// path and the profile's name escaped: the agent may choose neither, but
/// a terminal gets nothing raw).
fn layers_table(layers: &[Value]) -> String {
    if layers.is_empty() {
        return "\nNo kept copy-on-write layers.\n".into();
    }
    let mut out = String::from("\nKEPT LAYERS (sandmux diff ID | apply ID | discard ID)\n");
    for l in layers {
        let at_least = if l["at_least"] == true { "≥" } else { "" };
        out.push_str(&format!(
            "{}  {}  {}  {at_least}{} files  {at_least}{} bytes  {}  {}\n",
            term::field(&l["id"], ""),
            term::field(&l["created"], ""),
            match (l["running"] == true, l["applied"] == true) {
                (true, _) => "running",
                (false, true) => "applied",
                (false, false) => "ended",
            },
            l["files"],
            l["bytes"],
            term::field(&l["profile"], ""),
            term::field(&l["workspace"], "")
        ));
    }
    out
}

/// One instance's `ps` row: its metadata and, for `serve`, its status.
fn ps_row(f: &Found) -> Value {
    let st = if f.is_serve() {
        request(&f.dir, Request::new(Op::Status)).ok()
    } else {
        None
    };
    let m = f.meta.as_ref();
    json!({
        "id": f.id,
        "kind": m.map(|m| m.kind),
        "profile": m.map(|m| &m.profile),
        "workspace": m.map(|m| &m.workspace),
        "started": m.map(|m| m.started),
        "pid": m.map(|m| m.pid),
        "toolsets": st.as_ref().map(|s| s["toolsets"].clone()),
        "client_connected": st.as_ref().map(|s| s["client_connected"].clone()),
        "workspace_reverted": st.as_ref().map(|s| s["workspace_reverted"].clone()),
        "frozen": st.as_ref().map(|s| s["frozen"].clone()),
        "questions_open": st.as_ref().map(|s| s["questions_open"].clone()),
        "audit": st.as_ref().map(|s| s["audit"].clone()),
        "exposures": st.as_ref().map(|s| s["exposures"].clone()),
        "http": m.and_then(|m| m.http.as_ref()),
    })
}

/// A row of the `ps` table, its text made printable.
fn ps_cells(r: &Value) -> String {
    let ts = r["toolsets"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(term::printable)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_else(|| "-".into());
    let client = match r["client_connected"].as_bool() {
        Some(true) => "connected",
        Some(false) => "none",
        None => "-",
    };
    let reverted = r["workspace_reverted"]
        .as_u64()
        .map(|n| n.to_string())
        .unwrap_or_else(|| "-".into());
    let state = match &r["frozen"] {
        Value::Null if r["toolsets"].is_null() => "-",
        // A question waits for `sandmux approve` or `deny`.
        Value::Null if r["questions_open"].as_u64().unwrap_or(0) > 0 => "asking",
        Value::Null => "running",
        _ => "frozen",
    };
    ps_line([
        &term::field(&r["id"], ""),
        &term::field(&r["kind"], "?"),
        &term::field(&r["profile"], "?"),
        &r["pid"].as_u64().map(|p| p.to_string()).unwrap_or_default(),
        client,
        state,
        &ts,
        &reverted,
        &term::field(&r["audit"]["state"], "-"),
        &term::field(&r["workspace"], ""),
    ])
}

/// One line of the `ps` table, in its columns.
fn ps_line(c: [&str; 10]) -> String {
    format!(
        "{:<13} {:<6} {:<10} {:<8} {:<10} {:<7} {:<26} {:<8} {:<8} {}\n",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
    )
}

/// The request for `revoke`/`grant` (`freeze`: revoke, then freeze).
pub(crate) fn change(
    op: Op,
    toolset: Option<String>,
    tool: Option<String>,
    all: bool,
    freeze: bool,
) -> Request {
    let mut r = Request::new(op);
    (r.toolset, r.tool, r.all, r.freeze) = (toolset, tool, all, freeze);
    r
}

/// What `freeze`/`thaw` print, from the endpoint's answer.
pub(crate) fn freeze_line(op: &str, id: &str, v: &Value) -> String {
    let f = &v["frozen"];
    match (op, v["already"].as_bool().unwrap_or(false)) {
        ("thaw", true) => format!("{id} was not frozen"),
        ("thaw", false) => format!("{id} thawed: every process in the sandbox runs again; tool calls are served"),
        (_, already) => format!(
            "{id} {}frozen ({}, {} processes stopped, the tmux server and PID 1 included); tool calls are refused until `sandmux thaw {id}`",
            if already { "was already " } else { "" },
            term::field(&f["method"], "?"),
            f["processes"]
        ),
    }
}

/// Prints an instance's audit records; with `follow`, keeps printing new
/// ones until the instance ends.
pub(crate) fn journal(
    f: &Found,
    follow: bool,
    json_out: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    let path = f
        .meta
        .as_ref()
        .and_then(|m| m.audit_log.clone())
        .ok_or("this instance has no audit log (only serve instances do)")?;
    let mut pos = 0u64;
    loop {
        let mut file =
            std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        use std::io::{Read, Seek, SeekFrom};
        file.seek(SeekFrom::Start(pos)).map_err(|e| e.to_string())?;
        let mut buf = String::new();
        file.read_to_string(&mut buf).map_err(|e| e.to_string())?;
        let complete = buf.rfind('\n').map(|i| i + 1).unwrap_or(0);
        for line in buf[..complete].lines() {
            print_record(line, json_out, out);
        }
        let _ = out.flush();
        pos += complete as u64;
        if !follow || !rundir::owner_alive(&f.dir) {
            say_audit_state(f);
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Prints a finished instance's audit records, from its log (`path`).
pub(crate) fn journal_of_log(
    path: &Path,
    json_out: bool,
    out: &mut impl Write,
) -> Result<(), String> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        print_record(&line, json_out, out);
    }
    out.flush().map_err(|e| e.to_string())
}

/// Tells the human (on stderr, so `--json` stays records only) when the
/// instance cannot record calls and refuses them.
fn say_audit_state(f: &Found) {
    let Ok(st) = request(&f.dir, Request::new(Op::Status)) else {
        return;
    };
    if let Some(why) = st["audit"]["reason"].as_str() {
        eprintln!(
            "sandmux: audit log {}: {} ({} calls refused so far)",
            term::field(&st["audit"]["state"], "?"),
            term::printable(why),
            st["audit"]["refused_calls"]
        );
    }
}

/// One audit line for a terminal: agent-chosen strings never act on it
/// (`term`), and `--json` output stays one valid JSON value per line.
/// A record's tool as the journal prints it: a catalog tool or one of
/// sandmux's own `(…)` records as it is; any other name (an unknown tool
/// a client called: its bytes) quoted and escaped, spaces included, so it
/// can draw no column or row of the journal's own.
fn tool_shown(v: &Value) -> String {
    let t = v.as_str().unwrap_or_default();
    let ours = t.len() <= 40
        && t.starts_with('(')
        && t.ends_with(')')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"()-_".contains(&b));
    if ours || crate::mcp::catalog::find(t).is_some() {
        return t.to_string();
    }
    let cut: String = t.chars().take(40).collect();
    let shown = term::printable(&cut)
        .replace('"', "\\\"")
        .replace(' ', "\\u0020");
    format!("?\"{shown}\"")
}

fn print_record(line: &str, json_out: bool, out: &mut impl Write) {
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        if json_out {
            let _ = writeln!(
                out,
                "{}",
                json!({"journal": "a line that is not a JSON record (sandmux audit verify says more)"})
            );
        }
        return;
    };
    if json_out {
        let _ = writeln!(out, "{}", term::json_text(&v));
        return;
    }
    let _ = writeln!(
        out,
        "{:>5} {} {:<24} {:<9} {:<16} {:>5} ms",
        term::field(&v["seq"], "?"),
        term::field(&v["ts"], ""),
        tool_shown(&v["tool"]),
        term::field(&v["outcome"], ""),
        term::field(&v["error_type"], "-"),
        term::field(&v["duration_ms"], "?")
    );
}
