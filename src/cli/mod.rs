//! The `sandmux` command line (the binary's `main` calls [`main`]).

use crate::profile::{self, Context, Loaded};
use crate::sandbox::{self, pane, EXIT_INTERNAL, EXIT_USAGE};
use crate::supervisor;
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

mod approvals_cmd;
mod args;
mod local;
mod operator_cmd;
mod profile_cmd;
mod rewind_cmd;
use args::{Cli, Cmd, Target};
use local::{hold_instance, run, shell};
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
    resolved_capped(t, on_end, quiet, None)
}

/// [`resolved`], with `serve --upstream-timeout`'s ceiling on waits.
fn resolved_capped(
    t: &Target,
    on_end: profile::OnEnd,
    quiet: bool,
    wait_cap: Option<u64>,
) -> Result<profile::Policy, String> {
    let ws = t.workspace.clone().unwrap_or_else(|| PathBuf::from("."));
    let ws = profile::check_workspace(&ws).map_err(|e| e.to_string())?;
    let mut loaded: Loaded = profile::load(&t.profile).map_err(|e| e.to_string())?;
    crate::log::step("profile loaded");
    loaded.profile.toolchains.lend.extend(&t.toolchains);
    let mut ctx = Context::of(ws, crate::guard::planner);
    ctx.mode = t.workspace_mode;
    ctx.on_end = on_end;
    ctx.wait_cap = wait_cap;
    if loaded.may_fall_back(&ctx) {
        ctx.no_overlay = supervisor::layer::possible(&ctx.workspace)
            .err()
            .map(|e| e.to_string());
    }
    let policy = loaded.resolve(&ctx).map_err(|e| e.to_string())?;
    crate::log::step("policy resolved (the guard's walk included)");
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
    // The rewinder joins a user namespace: one thread, nothing started.
    if !matches!(
        cli.cmd,
        Cmd::Init | Cmd::ProbeUserns { .. } | Cmd::Rewinder { .. }
    ) {
        if let Err(e) = crate::log::init(cli.log_format) {
            return fail(EXIT_USAGE, e);
        }
    }
    // The instance's own processes (the broker) log under no instance id
    // of their own: only the commands a person runs mark their start.
    if !matches!(
        cli.cmd,
        Cmd::Init | Cmd::ProbeUserns { .. } | Cmd::Broker | Cmd::Rewinder { .. }
    ) {
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
        Cmd::Rewinder { workspace, userns } => {
            ExitCode::from(crate::supervisor::rewinder::inside::main(&workspace, userns) as u8)
        }
        Cmd::ProbeUserns { overlay } if overlay.is_empty() => {
            ExitCode::from(supervisor::probe::userns_child() as u8)
        }
        Cmd::ProbeUserns { overlay } => {
            ExitCode::from(supervisor::probe::overlay_child(&overlay) as u8)
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
        serve @ Cmd::Serve { .. } => serve_cmd(serve),
        Cmd::Instance { target } => match resolve(&target, profile::OnEnd::Discard) {
            Ok(policy) => hold_instance(policy),
            Err(c) => c,
        },
        other => operator(other),
    }
}

/// `sandmux serve`: its flags as `mcp::Options`, then the server.
fn serve_cmd(cmd: Cmd) -> ExitCode {
    let Cmd::Serve {
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
        resume,
        fork,
        otlp_endpoint,
    } = cmd
    else {
        return ExitCode::from(2);
    };
    use crate::supervisor::layer_from::LayerFrom;
    if audit_stdout {
        crate::audit::mirror_to_stdout();
    }
    let opts = crate::mcp::Options {
        flags: crate::mcp::toolsets::Flags {
            toolsets,
            tools,
            exclude_tools,
        },
        audit_log,
        no_session,
        record,
        http: http.map(|addr| crate::mcp::http::Flags {
            addr,
            token_file,
            allowed_hosts: allowed_host,
            token_header,
            unclaimed,
            upstream_timeout,
        }),
        from: resume.map(LayerFrom::Resume).or(fork.map(LayerFrom::Fork)),
    };
    serve(&target, on_end, opts, otlp_endpoint.as_deref())
}

/// `sandmux serve`.
fn serve(
    target: &Target,
    on_end: profile::OnEnd,
    opts: crate::mcp::Options,
    otlp: Option<&str>,
) -> ExitCode {
    let http = opts.http.clone();
    // First, before any thread exists: from here on a termination signal is
    // serve's own (a clean stop), never the default action.
    let stop = crate::runtime::exit::Stop::install();
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
    let wait_cap = http.as_ref().and_then(crate::mcp::http::router::cap_waits);
    let policy = match resolved_capped(target, on_end, false, wait_cap) {
        Ok(p) => p,
        Err(e) => return refuse(&e),
    };
    // Before confinement: the collector's name is resolved here, once.
    let otlp = crate::otlp::Config::from_flag_or_env(otlp)
        .and_then(|c| c.map_or(Ok(()), crate::otlp::configure));
    if let Err(e) = otlp {
        return refuse(&format!("serve: {e}"));
    }
    // The supervisor may connect to the collector's port only: a rule of
    // Landlock ABI 4. Without it export is refused here, never by dropping
    // the supervisor's Landlock layer (best-effort) or allowing every port.
    let (_, abi) = crate::sandbox::landlock::effective_abi(policy.landlock_abi);
    if crate::otlp::port().is_some() && abi < 4 {
        return refuse(&format!("serve: OTLP export needs Landlock ABI 4 (TCP port rules: serve may then connect to the collector's port and no other), and ABI {abi} is what this kernel and profile give; run without --otlp-endpoint (and OTEL_EXPORTER_OTLP_*ENDPOINT), or on a kernel with Landlock ABI 4 (Linux 6.7)"));
    }
    crate::runtime::exit::finish(crate::mcp::serve(policy, opts, &stop))
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
