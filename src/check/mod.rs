//! `sandmux check`: what this machine can enforce for a profile, and what a
//! live probe observed from inside a real sandboxed tmux pane.

pub(crate) mod mirror;
pub(crate) mod mirror_profile;
mod network;

pub(crate) use network::EXIT_WARNED;
use network::{network_of, print_network, NetworkView};

use crate::profile::Policy;
use crate::sandbox::observe::{self as inside, Observation};
use crate::sandbox::report::LayerStatus;
use crate::supervisor::probe;
use crate::supervisor::Instance;
use crate::tmux::control;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The full report.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// Profile name.
    pub profile: String,
    /// Profile source.
    pub source: String,
    /// Kernel features measured on the host.
    pub kernel: probe::Kernel,
    /// Whether the profile could start here.
    pub enforceable: bool,
    /// Why not, when it could not.
    pub error: Option<String>,
    /// Layers as reported by the sandbox while it started.
    pub layers: Vec<LayerStatus>,
    /// What the live probe observed from inside a pane.
    pub observations: Vec<Observation>,
    /// Whether every observation matched the profile (warnings aside).
    pub all_passed: bool,
    /// What does not fail the check but is said: allowed names this
    /// network cannot reach (exit status [`EXIT_WARNED`]).
    pub warnings: Vec<String>,
    /// The network mode, and in `proxy` mode the allow list.
    pub network: NetworkView,
    /// Toolchains lent read-only, and where they came from.
    pub toolchains: Vec<crate::profile::Lent>,
    /// Read-only entries that are symlinks on the host, as resolved.
    pub links: Vec<String>,
}

/// Runs the whole check.
pub(crate) fn run(policy: Policy) -> Report {
    let kernel = probe::kernel();
    let profile = policy.name.clone();
    let source = policy.source.to_string();
    let network = network_of(&policy);
    let warnings = network.warnings();
    let toolchains = policy.toolchains.clone();
    let links = crate::profile::links_said(&policy);
    match Instance::start(
        crate::supervisor::launch::Credentialed::unread(policy),
        crate::supervisor::Proof::Here,
        &crate::supervisor::rundir::Rundir::new_id(),
    ) {
        Err(e) => Report {
            profile,
            source,
            kernel,
            enforceable: false,
            layers: with_unreached(crate::sandbox::reported_before(
                e.layers, e.layer, &e.message,
            )),
            error: Some(e.message),
            observations: vec![],
            all_passed: false,
            warnings,
            network,
            toolchains,
            links,
        },
        Ok(inst) => {
            let mut layers = inst.layers();
            let needs = inst.supervisor_needs(Path::new("/dev/null"), None);
            let client = || inst.cmd(&["display-message", "-p", "ok"]).map(|_| ());
            let supervisor = crate::confine::probe(&inst.policy, &needs, &client);
            layers.push(match &supervisor {
                Ok(s) => s.clone(),
                Err(e) => LayerStatus {
                    layer: crate::profile::Layer::Supervisor,
                    enforced: false,
                    detail: e.message.clone(),
                },
            });
            let (observations, error) = match live_probe(&inst) {
                Ok(o) => (judge_dropped(o, &layers), None),
                Err(e) => (vec![], Some(e.to_string())),
            };
            inst.stop();
            let enforceable = supervisor.is_ok();
            let error = error.or(supervisor.err().map(|e| e.message));
            let all_passed = error.is_none()
                && network.reached()
                && !observations.is_empty()
                && observations.iter().all(|o| o.passed);
            Report {
                profile,
                source,
                kernel,
                enforceable,
                error,
                layers,
                observations,
                all_passed,
                warnings,
                network,
                toolchains,
                links,
            }
        }
    }
}

/// The layers a failed start-up reported, then every other one as not
/// reached (start-up ended before it was applied), so the report names them all.
fn with_unreached(mut layers: Vec<LayerStatus>) -> Vec<LayerStatus> {
    if layers.is_empty() {
        return layers;
    }
    for l in crate::profile::Layer::ALL {
        if !layers.iter().any(|s| s.layer == l) {
            layers.push(LayerStatus {
                layer: l,
                enforced: false,
                detail: "not reached: start-up ended before this layer was applied".into(),
            });
        }
    }
    layers.sort_by_key(|s| {
        crate::profile::Layer::ALL
            .iter()
            .position(|l| *l == s.layer)
    });
    layers
}

/// An observation that only a layer the report shows dropped (best-effort)
/// would make true is not a failure: it says what is seen without that layer.
fn judge_dropped(mut obs: Vec<Observation>, layers: &[LayerStatus]) -> Vec<Observation> {
    let dropped = |l: crate::profile::Layer| layers.iter().any(|s| s.layer == l && !s.enforced);
    for o in &mut obs {
        if o.name == "hostname" && !o.passed && dropped(crate::profile::Layer::Uts) {
            o.passed = true;
            o.observed = format!(
                "{} (the uts layer is dropped: the profile's hostname is not set)",
                o.observed
            );
        }
        if o.name == "tcp_connect" && !o.passed && dropped(crate::profile::Layer::Net) {
            o.passed = true;
            o.observed = format!(
                "{} (the net layer is dropped: the host's network is seen, limited by Landlock where it can)",
                o.observed
            );
        }
        if o.name == "pid_view" && !o.passed && dropped(crate::profile::Layer::Pid) {
            o.passed = true;
            o.observed = format!(
                "{} (the pid layer is dropped: the processes around the sandbox are visible)",
                o.observed
            );
        }
    }
    obs
}

/// Why the probe pane gave no report.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The control-mode client could not be started.
    #[error("starting a control client: {0}")]
    Spawn(#[source] std::io::Error),
    /// Its stdout was not kept (it always is).
    #[error("no stdout")]
    NoStdout,
    /// No report in time; the ends of what the pane and the client printed.
    #[error("the probe pane produced no report within 20 s; its last output: {tail:?}; control client: {raw:?}")]
    Silent { tail: String, raw: String },
    /// A report that is not the probe's JSON.
    #[error("probe output did not parse: {0}")]
    Parse(#[source] serde_json::Error),
}

/// Starts a pane running the probe, through a control-mode client attached
/// from the session's creation, and collects its output from `%output`.
pub(crate) fn live_probe(inst: &Instance) -> Result<Vec<Observation>, ProbeError> {
    let ws = inst.policy.workspace.display().to_string();
    let gate = inst.gate().display().to_string();
    let mut child = inst
        .client()
        .args([
            "-C",
            "new-session",
            "-s",
            "sandmux-check",
            "-x",
            "200",
            "-y",
            "50",
            "-c",
            &crate::tmux::start_dir_arg(&ws),
            &gate,
            "--probe",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(ProbeError::Spawn)?;
    let mut stdout = child.stdout.take().ok_or(ProbeError::NoStdout)?;
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut parser = control::Parser::new();
    let mut text = Vec::new();
    let mut raw = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let result = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = match rx.recv_timeout(left) {
            Ok(c) => c,
            Err(_) => {
                let tail =
                    String::from_utf8_lossy(&text[text.len().saturating_sub(600)..]).into_owned();
                let raw =
                    String::from_utf8_lossy(&raw[raw.len().saturating_sub(600)..]).into_owned();
                break Err(ProbeError::Silent { tail, raw });
            }
        };
        raw.extend_from_slice(&chunk[..chunk.len().min(4096)]);
        for ev in parser.feed(&chunk) {
            if let control::Event::Output { data, .. } = ev {
                text.extend_from_slice(&data);
            }
        }
        let s = String::from_utf8_lossy(&text);
        if let (Some(b), Some(e)) = (s.find(inside::BEGIN), s.find(inside::END)) {
            if e > b {
                let body: String = s[b + inside::BEGIN.len()..e]
                    .chars()
                    .filter(|c| *c != '\r' && *c != '\n')
                    .collect();
                break serde_json::from_str(&body).map_err(ProbeError::Parse);
            }
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"kill-session -t sandmux-check\n");
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Prints the report for a person.
pub(crate) fn print_human(r: &Report, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "sandmux check: profile '{}' ({})", r.profile, r.source)?;
    print_kernel(&r.kernel, out)?;
    print_network(&r.network, out)?;
    print_lent(r, out)?;
    if let Some(e) = &r.error {
        writeln!(out, "\nERROR: {e}")?;
    }
    if !r.layers.is_empty() {
        writeln!(
            out,
            "\nlayers (as reported by the sandbox while it started):"
        )?;
        for l in &r.layers {
            writeln!(
                out,
                "  {:<15} {:<9} {}",
                l.layer.name(),
                if l.enforced { "enforced" } else { "DROPPED" },
                l.detail
            )?;
        }
    }
    if !r.observations.is_empty() {
        writeln!(out, "\nlive probe from inside a sandboxed tmux pane:")?;
        for o in &r.observations {
            writeln!(
                out,
                "  {:<24} {:<4} {}",
                o.name,
                if o.passed { "ok" } else { "FAIL" },
                o.observed
            )?;
        }
    }
    if !r.warnings.is_empty() {
        writeln!(
            out,
            "\nwarnings: allowed names this network cannot reach (not a sandbox failure):"
        )?;
        for w in &r.warnings {
            writeln!(out, "  warning {w}")?;
        }
    }
    let result = if !r.enforceable {
        "NOT ENFORCEABLE on this machine".to_string()
    } else if r.all_passed && r.warnings.is_empty() {
        "enforceable; every probe matched the profile".to_string()
    } else if r.all_passed {
        format!(
            "enforceable; every probe matched the profile; {} allowed name(s) not reachable from this network (warnings, exit status {EXIT_WARNED})",
            r.warnings.len()
        )
    } else if r.network.refused() {
        "started, but allowed names resolve only to addresses the proxy refuses: the fix is above"
            .into()
    } else {
        "started, but a probe did not match the profile".into()
    };
    writeln!(out, "\nresult: {result}")
}

/// What the kernel offers, in the human report.
fn print_kernel(k: &probe::Kernel, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "\nkernel {}", k.release)?;
    writeln!(
        out,
        "  landlock ABI      {}",
        if k.landlock_abi == 0 {
            "unavailable".to_string()
        } else {
            k.landlock_abi.to_string()
        }
    )?;
    writeln!(
        out,
        "  user namespaces   {}",
        match &k.userns {
            Ok(()) => "available".to_string(),
            Err(e) => format!("unavailable ({e})"),
        }
    )?;
    writeln!(
        out,
        "  seccomp           {}",
        if k.seccomp {
            "available"
        } else {
            "unavailable"
        }
    )?;
    writeln!(
        out,
        "  cgroup            {}",
        match &k.cgroup {
            Ok(v) => format!("writable ({v})"),
            Err(e) => format!("unavailable ({e})"),
        }
    )?;
    writeln!(
        out,
        "  systemd (user)    {}",
        match &k.systemd_user {
            Ok(v) => format!("can delegate a cgroup ({v})"),
            Err(e) => format!("none ({e})"),
        }
    )?;
    Ok(())
}

/// The toolchains lent and the symlinks resolved, in the human report.
fn print_lent(r: &Report, out: &mut impl Write) -> std::io::Result<()> {
    if !r.toolchains.is_empty() {
        writeln!(out, "\ntoolchains lent (read-only):")?;
        for l in &r.toolchains {
            writeln!(out, "  {}", crate::term::printable(&l.said()))?;
        }
    }
    if !r.links.is_empty() {
        writeln!(out, "\nread-only symlinks, resolved:")?;
        for l in &r.links {
            writeln!(out, "  {}", crate::term::printable(l))?;
        }
    }
    Ok(())
}
