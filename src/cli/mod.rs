//! The `sandmux` command line (the binary's `main` calls [`main`]).

use crate::profile::{self, Context, Loaded};
use crate::sandbox::rundir::{Kind, Meta, Rundir};
use crate::sandbox::{self, pane, Payload, Stdio3, EXIT_INTERNAL, EXIT_USAGE};
use crate::supervisor::{self, Instance};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

mod approvals_cmd;
mod args;
mod operator_cmd;
mod profile_cmd;
use args::{Cli, Cmd, Target};
use operator_cmd::operator;
use profile_cmd::profile_cmd;

fn fail(code: i32, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("sandmux: {}", crate::term::message(&msg.to_string()));
    ExitCode::from(code as u8)
}

/// The policy of `t`; `on_end`: what happens to a copy-on-write layer.
fn resolve(t: &Target, on_end: profile::OnEnd) -> Result<profile::Policy, ExitCode> {
    resolve_quiet(t, on_end, false)
}

/// [`resolve`]; `quiet`: no warning that the workspace fell back to live
/// (`run -q`, which silences the line naming the dropped layers too).
fn resolve_quiet(
    t: &Target,
    on_end: profile::OnEnd,
    quiet: bool,
) -> Result<profile::Policy, ExitCode> {
    resolved(t, on_end, quiet).map_err(|e| fail(EXIT_USAGE, e))
}

/// [`resolve_quiet`], the error as text (`serve` also tells the client).
fn resolved(t: &Target, on_end: profile::OnEnd, quiet: bool) -> Result<profile::Policy, String> {
    let ws = t.workspace.clone().unwrap_or_else(|| PathBuf::from("."));
    let ws = profile::check_workspace(&ws).map_err(|e| e.to_string())?;
    let mut loaded: Loaded = profile::load(&t.profile).map_err(|e| e.to_string())?;
    crate::log::step("profile loaded");
    loaded.profile.toolchains.lend.extend(&t.toolchains);
    let mut ctx = Context::of(ws, crate::guard::planner);
    ctx.mode = t.workspace_mode;
    if loaded.may_fall_back(&ctx) {
        ctx.no_overlay = supervisor::layer::possible(&ctx.workspace)
            .err()
            .map(|e| e.to_string());
    }
    let mut policy = loaded.resolve(&ctx).map_err(|e| e.to_string())?;
    crate::log::step("policy resolved (the guard's walk included)");
    policy.on_end = on_end;
    match &policy.workspace_fallback {
        Some(why) if !quiet => tracing::warn!("the workspace is {why}"),
        _ => {}
    }
    if let Some(what) = policy.workspace_mode.not_guarded() {
        if !quiet {
            tracing::warn!("{what}");
        }
    }
    Ok(policy)
}

/// The `sandmux` command line: parses the arguments and runs the command.
pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv0 = args.first().map(PathBuf::from).unwrap_or_default();
    let base = argv0.file_name().and_then(|s| s.to_str()).unwrap_or("");
    if base.trim_start_matches('-') == pane::GATE_NAME {
        pane::main(args);
    }
    let cli = Cli::parse();
    // Nothing inside the sandbox logs: `__init` gets its level in the plan,
    // and the probe's stderr is its answer.
    if !matches!(cli.cmd, Cmd::Init | Cmd::ProbeUserns { .. }) {
        if let Err(e) = crate::log::init(cli.log_format) {
            return fail(EXIT_USAGE, e);
        }
    }
    // The instance's own processes (the broker) log under no instance id
    // of their own: only the commands a person runs mark their start.
    if !matches!(cli.cmd, Cmd::Init | Cmd::ProbeUserns { .. } | Cmd::Broker) {
        crate::log::step("cli: arguments parsed");
    }
    if matches!(cli.cmd, Cmd::Serve { .. } | Cmd::Run { .. }) {
        // Before any thread: as a container's PID 1, a reaping parent stays PID 1.
        crate::entrypoint::take_pid1_duties();
    }
    dispatch(cli.cmd)
}

/// The commands that start or describe a sandbox; the rest are [`operator`]'s.
fn dispatch(cmd: Cmd) -> ExitCode {
    match cmd {
        Cmd::Init => sandbox::init::main(),
        Cmd::Broker => ExitCode::from(crate::supervisor::broker::main() as u8),
        Cmd::ProbeUserns { overlay } if overlay.is_empty() => {
            ExitCode::from(sandbox::probe::userns_child() as u8)
        }
        Cmd::ProbeUserns { overlay } => {
            ExitCode::from(sandbox::probe::overlay_child(&overlay) as u8)
        }
        Cmd::Run {
            target,
            quiet,
            on_end,
            command,
        } => match resolve_quiet(&target, on_end, quiet) {
            Ok(policy) => run(policy, command, quiet),
            Err(c) => c,
        },
        Cmd::Shell { target, on_end } => match resolve(&target, on_end) {
            Ok(policy) => shell(policy),
            Err(c) => c,
        },
        Cmd::Check { target, json } => match resolve(&target, profile::OnEnd::Discard) {
            Ok(policy) => check(policy, json),
            Err(c) => c,
        },
        Cmd::Profile { cmd } => profile_cmd(cmd),
        Cmd::Serve {
            target,
            on_end,
            toolsets,
            tools,
            exclude_tools,
            audit_log,
            no_session,
            record,
            http,
            token_file,
            allowed_host,
            unclaimed,
            token_header,
            upstream_timeout,
            audit_stdout,
        } => {
            if audit_stdout {
                crate::audit::mirror_to_stdout();
            }
            serve(
                &target,
                on_end,
                crate::mcp::toolsets::Flags {
                    toolsets,
                    tools,
                    exclude_tools,
                },
                audit_log,
                no_session,
                record,
                http.map(|addr| crate::mcp::http::Flags {
                    addr,
                    token_file,
                    allowed_hosts: allowed_host,
                    token_header,
                    unclaimed,
                    upstream_timeout,
                }),
            )
        }
        Cmd::Instance { target } => match resolve(&target, profile::OnEnd::Discard) {
            Ok(policy) => hold_instance(policy),
            Err(c) => c,
        },
        other => operator(other),
    }
}

/// `sandmux serve`.
fn serve(
    target: &Target,
    on_end: profile::OnEnd,
    flags: crate::mcp::toolsets::Flags,
    audit_log: Option<PathBuf>,
    no_session: bool,
    record: Option<PathBuf>,
    http: Option<crate::mcp::http::Flags>,
) -> ExitCode {
    // First, before any thread exists: from here on a termination signal is
    // serve's own (a clean stop), never the default action.
    let stop = crate::mcp::exit::Stop::install();
    // A configuration error is the MCP client's answer to `initialize` too
    // (over stdio), in the words the CLI prints, not a closed connection.
    let refuse = |e: &str| {
        let code = fail(EXIT_USAGE, e);
        if http.is_none() {
            crate::mcp::refusal::tell_client(&crate::term::message(e), &|| stop.signal().is_some());
        }
        code
    };
    if on_end == profile::OnEnd::Apply {
        return refuse("serve --on-end apply: serve ends confined to what it needs, which is not the workspace; use keep (the default) and then `sandmux apply ID`, or discard");
    }
    let policy = match resolved(target, on_end, false) {
        Ok(p) => p,
        Err(e) => return refuse(&e),
    };
    let opts = crate::mcp::Options {
        flags,
        audit_log,
        no_session,
        record,
        http,
    };
    crate::mcp::exit::finish(crate::mcp::serve(policy, opts, &stop))
}

fn run(mut policy: profile::Policy, command: Vec<std::ffi::OsString>, quiet: bool) -> ExitCode {
    use nix::sys::signal::{SigSet, Signal};
    let vault = match crate::proxy::credentials::apply(&mut policy) {
        Ok(v) => v,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let mut rundir =
        match Rundir::create(&Rundir::new_id(), crate::sandbox::rundir::Serves::Command) {
            Ok(r) => r,
            Err(e) => return fail(EXIT_INTERNAL, e),
        };
    crate::log::step("run: runtime directory");
    let cg = match supervisor::make_cgroup(&policy, &mut rundir) {
        Ok(c) => c,
        Err(e) => return fail(e.exit_code(), e),
    };
    crate::log::step("run: cgroup");
    rundir.write_meta(&Meta::now(
        Kind::Run,
        &rundir.id,
        &policy.name,
        &policy.workspace,
    ));
    let cwd = std::env::current_dir()
        .ok()
        .filter(|d| d.starts_with(&policy.workspace))
        .unwrap_or_else(|| policy.workspace.clone());
    let guard = match crate::guard::watch::start_for(&mut policy, &rundir.id) {
        Ok(g) => g,
        Err(e) => return fail(e.exit_code(), e),
    };
    crate::log::step("run: the guard's watch");
    let host_ws = policy.workspace.clone();
    let live = match supervisor::layer::create(&mut policy, &rundir.id) {
        Ok(l) => l,
        Err(e) => return fail(EXIT_INTERNAL, format!("the workspace's layer: {e}")),
    };
    // A copy workspace's command starts at the same place in the copy.
    let cwd = match cwd.strip_prefix(&host_ws) {
        Ok(rel) => policy.workspace.join(rel),
        Err(_) => cwd,
    };
    crate::log::step("run: the copy-on-write layer");
    let plan = match supervisor::plan(
        &policy,
        &rundir,
        cg,
        Payload::Command {
            argv: command,
            cwd,
            quiet,
        },
        None,
    ) {
        Ok(p) => p,
        Err(e) => return fail(e.exit_code(), e),
    };
    // Termination signals are forwarded to the sandbox by a helper thread.
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    let _ = set.thread_block();
    crate::log::step("run: plan compiled");
    let mut started = match sandbox::start(&plan, Stdio3::Inherit) {
        Ok(s) => s,
        Err(e) => return fail(e.exit_code(), e),
    };
    let tally = match serve_proxy(&policy, started.proxy.take(), vault) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_INTERNAL, e),
    };
    if let Some(g) = &guard {
        g.mount_in_force(mount_in_force(&started.messages));
    }
    let pid = nix::unistd::Pid::from_raw(started.child.id() as i32);
    let (_bound, over) = bound_ends(&policy, pid);
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    });
    let mut child = started.child;
    let status = child.wait();
    crate::log::step("run: the sandbox ended");
    let id = rundir.id.clone();
    drop(rundir);
    if let Some(t) = tally {
        eprintln!("{}", crate::proxy::summary(&t));
    }
    guard.map(crate::guard::watch::finish_and_say);
    crate::log::step("run: the guard's end sweep");
    if said_over(&over) {
        policy.on_end = profile::OnEnd::Keep;
    }
    if let Some(line) = supervisor::layer::finish(&policy, &id, live) {
        tracing::warn!("{line}");
        record_discard(&policy, &id, &line);
    }
    apply_on_end(&policy, &id, quiet);
    crate::log::step("run: the layer finished");
    match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            let code = s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
            tracing::debug!(code, "the command ended");
            ExitCode::from(code as u8)
        }
        Err(e) => fail(EXIT_INTERNAL, e),
    }
}

/// Proxy mode (`run`, `shell`): serves the sandbox's listener on a thread
/// of this process; the tally is for the summary at the end.
fn serve_proxy(
    policy: &profile::Policy,
    listener: Option<std::net::TcpListener>,
    vault: Option<std::sync::Arc<crate::proxy::credentials::Vault>>,
) -> Result<Option<std::sync::Arc<std::sync::Mutex<crate::proxy::tally::Tally>>>, String> {
    let Some(l) = listener else { return Ok(None) };
    let cfg = crate::proxy::Config::of(&policy.network).map_err(|(k, e)| format!("{k}: {e}"))?;
    // No operator endpoint here: `[network] ask` refuses as before.
    let hooks = crate::proxy::ask::Hooks { vault, ask: None };
    crate::proxy::spawn_counted(l, cfg, policy, hooks)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// What a layer over its bound said, once the sandbox was ended for it.
type Over = std::sync::Arc<std::sync::Mutex<Option<String>>>;

/// `run` and `shell`: the copy-on-write layer's bound (`supervisor::bound`)
/// ends the sandbox whose PID 1 is `pid` (its pid namespace goes with it).
fn bound_ends(
    policy: &profile::Policy,
    pid: nix::unistd::Pid,
) -> (Option<supervisor::bound::Watching>, Over) {
    let over: Over = Default::default();
    let Some(layer) = policy.layer.clone() else {
        return (None, over);
    };
    let said = over.clone();
    let w = supervisor::bound::watch(layer, policy.layer_bound, move |why| {
        *said.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    });
    (Some(w), over)
}

/// Says why the sandbox was ended, if the bound ended it: then the layer
/// is kept as it was, whatever `--on-end` said (true).
fn said_over(over: &Over) -> bool {
    let why = over.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(why) = &why {
        tracing::error!("{why}: the sandbox was ended; its layer is kept as it was");
    }
    why.is_some()
}

/// `--on-end apply`, after the instance ended (and `finish` left the
/// layer): the door's lines, on stderr; with `quiet`, only when something
/// is left for the human.
fn apply_on_end(policy: &profile::Policy, id: &str, quiet: bool) {
    let there = policy.layer.as_ref().is_some_and(|d| d.exists());
    if policy.on_end == profile::OnEnd::Apply && there {
        let (lines, left) = crate::door::on_end(id);
        if quiet && !left {
            return;
        }
        for line in lines {
            eprintln!("sandmux: {}", crate::term::printable(&line));
        }
    }
}

fn mount_in_force(messages: &[sandbox::report::Message]) -> bool {
    sandbox::report::layers(messages)
        .iter()
        .any(|l| l.layer == profile::Layer::Mount && l.enforced)
}

/// A discard at the end (`--on-end discard`) goes on the record, as
/// `sandmux discard` does: a `(door)` record in the instance's log.
fn record_discard(policy: &profile::Policy, id: &str, line: &str) {
    if let (profile::OnEnd::Discard, Some(dir)) = (policy.on_end, &policy.layer) {
        let removed = !dir.exists();
        if let Some(said) = crate::door::record_end(id, dir, line, removed) {
            tracing::warn!("{said}");
        }
    }
}

fn shell(mut policy: profile::Policy) -> ExitCode {
    let vault = match crate::proxy::credentials::apply(&mut policy) {
        Ok(v) => v,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let ws = policy.workspace.display().to_string();
    let name = policy.name.clone();
    let wsp = policy.workspace.clone();
    let mut inst = match Instance::start(policy, crate::supervisor::Proof::Here, &Rundir::new_id())
    {
        Ok(i) => i,
        Err(e) => return fail(e.exit_code(), e),
    };
    let tally = match serve_proxy(&inst.policy, inst.proxy.take(), vault) {
        Ok(t) => t,
        Err(e) => {
            inst.stop();
            return fail(EXIT_INTERNAL, e);
        }
    };
    let init = nix::unistd::Pid::from_raw(inst.init_pid() as i32);
    let (bound, over) = bound_ends(&inst.policy, init);
    inst.rundir
        .write_meta(&Meta::now(Kind::Shell, &inst.rundir.id, &name, &wsp));
    let status = inst
        .client()
        .args([
            "new-session",
            "-s",
            "sandmux",
            "-c",
            &crate::tmux::start_dir_arg(&ws),
        ])
        .status();
    let (mut policy, id) = (inst.policy.clone(), inst.rundir.id.clone());
    drop(bound);
    if said_over(&over) {
        inst.policy.on_end = profile::OnEnd::Keep;
        policy.on_end = profile::OnEnd::Keep;
    }
    let said = inst.stop();
    // The layer's line is the warning that names it.
    if let Some(w) = said
        .iter()
        .find(|t| t.how == crate::supervisor::instance::LAYER_NOTICE)
    {
        record_discard(&policy, &id, &w.why);
    }
    apply_on_end(&policy, &id, false);
    if let Some(t) = tally {
        eprintln!("{}", crate::proxy::summary(&t));
    }
    match status {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(EXIT_INTERNAL, format!("tmux client: {e}")),
    }
}

fn hold_instance(policy: profile::Policy) -> ExitCode {
    let inst = match Instance::start(policy, crate::supervisor::Proof::Here, &Rundir::new_id()) {
        Ok(i) => i,
        Err(e) => return fail(e.exit_code(), e),
    };
    let info = serde_json::json!({
        "socket": inst.socket(),
        "rundir": inst.rundir.path,
        "server_pid": inst.server_pid,
        "tmux": inst.tmux,
        "init_pid": inst.init_pid(),
        "layers": inst.layers(),
        "layer": inst.policy.layer,
    });
    println!("{info}");
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    inst.stop();
    ExitCode::SUCCESS
}

fn check(policy: profile::Policy, json: bool) -> ExitCode {
    let r = crate::check::run(policy);
    let mut out = std::io::stdout().lock();
    if json {
        let text = serde_json::to_string_pretty(&r).unwrap_or_default();
        let _ = std::io::Write::write_all(
            &mut out,
            format!("{}\n", crate::term::inert_json(text)).as_bytes(),
        );
    } else {
        let _ = crate::check::print_human(&r, &mut crate::term::Safe(&mut out));
    }
    if !r.enforceable {
        ExitCode::from(sandbox::EXIT_LAYER as u8)
    } else if r.all_passed && r.warnings.is_empty() {
        ExitCode::SUCCESS
    } else if r.all_passed {
        ExitCode::from(crate::check::EXIT_WARNED)
    } else {
        ExitCode::from(1)
    }
}
