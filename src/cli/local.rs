//! `run` and `shell` (and the test harness's `__instance`): instances
//! whose supervisor is this process, unconfined, launched through the one
//! launch path (`supervisor::launch`) and ended here: the proxy's thread,
//! the layer's bound, and what `--on-end` asks once the sandbox is gone.

use super::{fail, EXIT_INTERNAL, EXIT_USAGE};
use crate::profile;
use crate::sandbox::{self, Payload, Stdio3};
use crate::supervisor::launch::{Credentialed, End, Launch, Refresh};
use crate::supervisor::rundir::{Kind, Meta, Rundir};
use crate::supervisor::{self, Instance};
use nix::sys::signal::{SigSet, Signal};
use std::path::PathBuf;
use std::process::ExitCode;

pub(super) fn run(
    policy: profile::Policy,
    command: Vec<std::ffi::OsString>,
    quiet: bool,
) -> ExitCode {
    let creds = match Credentialed::open(policy, Refresh::Here) {
        Ok(c) => c,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    // Where the command starts: here, if here is in the workspace.
    let host_ws = creds.resolved().workspace.clone();
    let cwd = std::env::current_dir()
        .ok()
        .filter(|d| d.starts_with(&host_ws))
        .unwrap_or(host_ws);
    let mut placed = match creds.placed(
        &Rundir::new_id(),
        crate::supervisor::rundir::Serves::Command,
    ) {
        Ok(p) => p,
        Err(e) => return fail(e.exit_code(), e),
    };
    let (resolved, rundir) = placed.parts();
    let cg = match supervisor::make_cgroup(resolved, rundir) {
        Ok(c) => c,
        Err(e) => return fail(e.exit_code(), e),
    };
    crate::log::step("run: cgroup");
    rundir.write_meta(&Meta::now(
        Kind::Run,
        &rundir.id,
        &resolved.name,
        &resolved.workspace,
    ));
    let Launch {
        resolved,
        policy,
        rundir,
        vault,
        guard,
        layer,
    } = match placed.host() {
        Ok(l) => l,
        Err(e) => return fail(e.exit_code(), e),
    };
    let plan = match run_plan(&resolved, &policy, &rundir, cg, command, cwd, quiet) {
        Ok(p) => p,
        Err(e) => return fail(e.exit_code(), e),
    };
    // Termination signals are forwarded to the sandbox by a helper thread.
    let set = blocked_signals();
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
    let status = started.child.wait();
    crate::log::step("run: the sandbox ended");
    let id = rundir.id.clone();
    drop(rundir);
    if let Some(t) = tally {
        eprintln!("{}", crate::proxy::summary(&t));
    }
    run_end(&policy, &id, guard, layer, &over, quiet);
    exit_of(status)
}

/// SIGINT, SIGTERM and SIGHUP blocked in this thread (and the threads it
/// starts after), to be waited for and forwarded to the sandbox.
fn blocked_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    let _ = set.thread_block();
    set
}

/// `run`'s exit status: the command's, or 128 + the signal that ended it.
fn exit_of(status: std::io::Result<std::process::ExitStatus>) -> ExitCode {
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

/// `run`'s plan: the command starts at `cwd` (in a copy workspace, the
/// same place in the copy).
fn run_plan(
    resolved: &profile::Policy,
    policy: &profile::Policy,
    rundir: &Rundir,
    cg: sandbox::cgroup::Placement,
    command: Vec<std::ffi::OsString>,
    cwd: PathBuf,
    quiet: bool,
) -> Result<sandbox::Plan, sandbox::StartError> {
    let cwd = match cwd.strip_prefix(&resolved.workspace) {
        Ok(rel) => policy.workspace.join(rel),
        Err(_) => cwd,
    };
    let payload = Payload::Command {
        argv: command,
        cwd,
        quiet,
    };
    supervisor::plan(policy, rundir, cg, payload, None)
}

/// `run`'s end, once the sandbox has: the guard's end sweep, the layer's
/// end, and what `--on-end` asked.
fn run_end(
    policy: &profile::Policy,
    id: &str,
    guard: Option<crate::guard::watch::Watch>,
    layer: Option<supervisor::layer::Live>,
    over: &Over,
    quiet: bool,
) {
    guard.map(crate::guard::watch::finish_and_say);
    crate::log::step("run: the guard's end sweep");
    let end = end_of(policy, over);
    let line = supervisor::layer::finish(policy, id, layer, end.on_end());
    if let Some(line) = &line {
        tracing::warn!("{line}");
    }
    after_end(policy, id, end, line.as_deref(), quiet);
    crate::log::step("run: the layer finished");
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

/// How the layer ends: as asked, unless the bound ended the sandbox (then
/// it says why, and the layer is kept as it was).
fn end_of(policy: &profile::Policy, over: &Over) -> supervisor::launch::End {
    use supervisor::launch::End;
    let why = over.lock().unwrap_or_else(|p| p.into_inner()).take();
    match why {
        Some(why) => {
            tracing::error!("{why}: the sandbox was ended; its layer is kept as it was");
            End::KeptOverBound
        }
        None => End::AsAsked(policy.on_end),
    }
}

/// After the layer's end (`layer::finish` said `line`, if anything):
/// a discard goes on the record as `sandmux discard` does, and `--on-end
/// apply` applies and says what it did (with `quiet`, only when something
/// is left for the human).
fn after_end(
    policy: &profile::Policy,
    id: &str,
    end: supervisor::launch::End,
    line: Option<&str>,
    quiet: bool,
) {
    let Some(dir) = &policy.layer else { return };
    match end.on_end() {
        profile::OnEnd::Discard => {
            if let Some(line) = line {
                let removed = !dir.exists();
                if let Some(said) = crate::door::record_end(id, dir, line, removed) {
                    tracing::warn!("{said}");
                }
            }
        }
        profile::OnEnd::Apply if dir.exists() => {
            let (lines, left) = crate::door::on_end(id);
            if quiet && !left {
                return;
            }
            for line in lines {
                eprintln!("sandmux: {}", crate::term::printable(&line));
            }
        }
        _ => {}
    }
}

fn mount_in_force(messages: &[sandbox::report::Message]) -> bool {
    sandbox::report::layers(messages)
        .iter()
        .any(|l| l.layer == profile::Layer::Mount && l.enforced)
}

pub(super) fn shell(policy: profile::Policy) -> ExitCode {
    let creds = match Credentialed::open(policy, Refresh::Here) {
        Ok(c) => c,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let vault = creds.vault().cloned();
    let (name, wsp) = (
        creds.resolved().name.clone(),
        creds.resolved().workspace.clone(),
    );
    let mut inst = match Instance::start(creds, crate::supervisor::Proof::Here, &Rundir::new_id()) {
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
    let ws = inst.policy.workspace.display().to_string();
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
    let (policy, id) = (inst.policy.clone(), inst.rundir.id.clone());
    drop(bound);
    let end = end_of(&policy, &over);
    if end == End::KeptOverBound {
        inst.keep_layer_over_bound();
    }
    let said = inst.stop();
    // The layer's line is the warning that names it.
    let line = said
        .iter()
        .find(|t| t.how == crate::guard::quarantine::How::LayerNotice)
        .map(|t| t.why.as_str());
    after_end(&policy, &id, end, line, false);
    if let Some(t) = tally {
        eprintln!("{}", crate::proxy::summary(&t));
    }
    match status {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(EXIT_INTERNAL, format!("tmux client: {e}")),
    }
}

pub(super) fn hold_instance(policy: profile::Policy) -> ExitCode {
    // The test harness's instance probes as `check` does: no credential.
    let creds = Credentialed::unread(policy);
    let inst = match Instance::start(creds, crate::supervisor::Proof::Here, &Rundir::new_id()) {
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
