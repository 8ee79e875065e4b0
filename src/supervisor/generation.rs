//! A generation: one sandbox with a fresh tmux server in it (its cgroup, its
//! plan, its start), and the plan any sandbox of an instance is built from
//! (`run` uses it too).

use super::cgroup;
use crate::nonce;
use crate::profile::{MountKind, Policy};
use crate::sandbox::report::Message;
use crate::sandbox::{self, mounts, Payload, Plan, StartError, Stdio3};
use crate::supervisor::rundir::Rundir;
use crate::tmux::MINIMAL_CONF;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A generation just started, before it is proven ([`Instance::verify`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Generation {
    /// Host pid of its `sandmux __init`.
    pub init_pid: u32,
    /// What the sandbox reported while starting.
    pub messages: Vec<Message>,
    /// The server's pid inside the sandbox.
    pub server_pid: i32,
    /// Its generation id.
    pub generation: String,
    /// The cgroup made for it.
    pub cgroup: Option<cgroup::Cgroup>,
    /// Proxy mode: the listener made in its network namespace (never sent
    /// by the broker: a restarted generation in proxy mode is refused).
    #[serde(skip)]
    pub proxy: Option<std::net::TcpListener>,
}

/// Makes the cgroup and the sandbox and starts tmux in it (the first
/// generation in `Instance::start`, later ones in the broker when there is one).
pub(crate) fn start_generation(
    policy: &Policy,
    rundir: &mut Rundir,
    tmux: &Path,
) -> Result<(Child, Generation), StartError> {
    let cg = make_cgroup(policy, rundir)?;
    rundir.remove_host_view();
    let generation = nonce::hex();
    let conf = format!("{MINIMAL_CONF}\n# Generation id: proves to sandmux that this server is the one it started.\nset -g @sandmux_generation {generation}\n");
    let plan = plan(
        policy,
        rundir,
        cg,
        Payload::Tmux {
            tmux: tmux.to_path_buf(),
        },
        Some(conf),
    )?;
    let started = sandbox::start(&plan, Stdio3::Null)?;
    let server_pid = started
        .messages
        .iter()
        .find_map(|m| match m {
            Message::Ready { server_pid } => Some(*server_pid),
            _ => None,
        })
        .ok_or_else(|| {
            StartError::internal("the sandbox ended before the tmux server was ready".into())
        })?;
    let g = Generation {
        init_pid: started.child.id(),
        messages: started.messages,
        server_pid,
        generation,
        cgroup: rundir.cgroup.clone(),
        proxy: started.proxy,
    };
    Ok((started.child, g))
}

/// Why a generation cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GenerationError {
    /// A binary the sandbox runs (tmux) is outside every read-only tree.
    #[error("{} is not inside a read-only tree of profile '{profile}'; add its directory to [filesystem] read_only", bin.display())]
    NotVisible { bin: PathBuf, profile: String },
}

/// Checks that `bin` is visible inside the sandbox through a read-only entry.
pub(crate) fn check_visible(policy: &Policy, bin: &Path) -> Result<(), GenerationError> {
    let ok = policy
        .fs
        .iter()
        .any(|e| e.kind == MountKind::ReadOnly && bin.starts_with(&e.path));
    if ok {
        Ok(())
    } else {
        Err(GenerationError::NotVisible {
            bin: bin.to_path_buf(),
            profile: policy.name.clone(),
        })
    }
}

/// Creates the instance's cgroup, or applies the profile's rule when there is none.
pub(crate) fn make_cgroup(
    policy: &Policy,
    rundir: &mut Rundir,
) -> Result<cgroup::Placement, StartError> {
    match cgroup::create(
        &format!("sandmux-{}", rundir.id),
        &format!("gen-{}", &nonce::hex()[..8]),
        policy.limits.processes,
        policy.limits.memory.0,
    ) {
        Ok(cg) => {
            rundir.set_cgroup(cg.clone());
            Ok(cgroup::Placement::In(cg))
        }
        Err(reason) if policy.best_effort.contains(&crate::profile::Layer::Cgroup) => {
            Ok(cgroup::Placement::Without {
                why: format!("{reason}. In force instead: {}", without_cgroup(policy)),
            })
        }
        Err(reason) => Err(StartError::layer(
            crate::profile::Layer::Cgroup,
            &reason.to_string(),
        )),
    }
}

/// What limits a sandbox without a cgroup: no memory limit at all, and
/// processes only by RLIMIT_NPROC (which the kernel ignores for host root).
pub(crate) fn without_cgroup(policy: &Policy) -> String {
    let nproc = if nix::unistd::geteuid().is_root() {
        "no process limit (RLIMIT_NPROC is not enforced for host root)".to_string()
    } else {
        format!(
            "processes limited by RLIMIT_NPROC={} only",
            policy.limits.processes
        )
    };
    format!("no memory limit; {nproc}; no OOM kill counts")
}

/// The plan for a sandbox (shared by `run` and the tmux instance).
pub(crate) fn plan(
    policy: &Policy,
    rundir: &Rundir,
    cgroup: cgroup::Placement,
    payload: Payload,
    tmux_conf: Option<String>,
) -> Result<Plan, StartError> {
    let (passwd, group) = sandbox::identity_files(policy);
    let mut blueprint = sandbox::plan::compile(policy, sandbox::mode_of(&payload));
    // Tmux mode: where its files go on the host when there is no mount view
    // (`hostview`; made only then), the gate a link to this binary.
    if let (Payload::Tmux { .. }, Some(dir)) = (&payload, rundir.host_view()) {
        let exe = std::env::current_exe()
            .map_err(|e| StartError::internal(format!("the sandmux binary's path: {e}")))?;
        blueprint.host_view = Some(sandbox::plan::host_view(policy, &dir, &exe));
    }
    let gate_json =
        serde_json::to_string(&sandbox::plan::GateConfig::of(&blueprint, None)).unwrap_or_default();
    let run_dir = blueprint.paths.run_dir.clone();
    Ok(Plan {
        blueprint,
        rundir: rundir.path.clone(),
        supervisor_pid: std::process::id() as i32,
        host_uid: nix::unistd::geteuid().as_raw(),
        host_gid: nix::unistd::getegid().as_raw(),
        cgroup,
        env: ca_env(
            sandbox::env::build(&policy.environment, std::env::vars_os()),
            policy,
            &run_dir,
        ),
        run_files: mounts::RunFiles {
            tmux_conf,
            gate_json,
            passwd,
            group,
            names: sandbox::name_files(policy),
            ca: policy
                .ca_pem
                .as_deref()
                .map(|ca| (ca_bundle(ca), ca.to_string())),
        },
        payload,
        log: crate::log::init_level(),
    })
}

/// With credentials, the variables that point clients at the instance's CA
/// (in `run`, the directory of the sandbox's own files: `/run/sandmux`, or
/// the host view's).
fn ca_env(
    mut env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    policy: &Policy,
    run: &Path,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    use sandbox::plan::{CA, CA_BUNDLE};
    if policy.ca_pem.is_none() {
        return env;
    }
    let bundle = run.join(CA_BUNDLE);
    let mut set = |k: &str, v: &Path| {
        env.retain(|(n, _)| n != k);
        env.push((k.into(), v.into()));
    };
    for k in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "CARGO_HTTP_CAINFO",
        "PIP_CERT",
        "NPM_CONFIG_CAFILE",
    ] {
        set(k, &bundle);
    }
    set("NODE_EXTRA_CA_CERTS", &run.join(CA));
    env
}

/// The bundle clients inside read: the host's first system bundle found and
/// the instance's CA.
fn ca_bundle(ca: &str) -> String {
    let host = sandbox::plan::SYSTEM_BUNDLES
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    format!("{host}\n# sandmux: this instance's CA (credentials are put in by its proxy)\n{ca}")
}

/// Ends a sandbox: SIGTERM to its `__init`, SIGKILL after 3 s, reaped.
pub(crate) fn end_init(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}
