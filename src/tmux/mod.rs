//! The tmux server sandmux owns: started fresh inside the sandbox with the
//! embedded minimal configuration, proven to be the one this run started, and
//! stopped with everything in it.

pub(crate) mod client;
pub(crate) mod cmd;
pub mod control;
pub(crate) mod genesis;
pub(crate) mod hub;
pub(crate) mod streams;

use crate::nonce;
use crate::profile::{MountKind, Policy};
use crate::sandbox::report::{self, Message};
use crate::sandbox::rundir::Rundir;
use crate::sandbox::{self, cgroup, mounts, pane, Payload, Plan, StartError, Stdio3};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The embedded configuration (see `minimal-tmux.conf`).
pub(crate) const MINIMAL_CONF: &str = include_str!("../../minimal-tmux.conf");

/// Oldest tmux sandmux runs (allow-passthrough appeared in 3.3).
pub(crate) const MIN_VERSION: (u32, u32) = (3, 3);

/// A running, confined tmux server.
pub(crate) struct Instance {
    /// Runtime directory (removed on drop).
    pub rundir: Rundir,
    init: Option<Init>,
    /// What the sandbox reported while starting.
    pub messages: Vec<Message>,
    /// The server's pid inside the sandbox.
    pub server_pid: i32,
    /// Random generation id, set as `@sandmux_generation` in the server.
    pub generation: String,
    /// The tmux binary.
    pub tmux: PathBuf,
    /// Its `tmux -V`.
    pub tmux_version: String,
    /// The resolved policy.
    pub policy: Policy,
    /// The workspace guard's watch (P8); it outlives server restarts.
    pub guard: Option<crate::guard::watch::Watch>,
    /// Does for a confined supervisor (`serve`) what it can no longer do:
    /// start later generations, run the signals freezer.
    pub broker: Option<std::sync::Arc<crate::mcp::broker::Broker>>,
    /// The supervisor's own confinement, once `serve` applied it.
    pub supervisor: Option<report::LayerStatus>,
    /// Proxy mode: the listener to serve, until the caller takes it.
    pub proxy: Option<std::net::TcpListener>,
}

/// The sandbox `__init` of a generation: this process's child, or the broker's.
enum Init {
    Own(Child),
    Brokered(u32),
}

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
    );
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

/// A start directory as one argv word of a tmux command: `#` doubled (tmux
/// expands `-c` as a format) and a final `;` escaped (one would end the
/// command).
pub(crate) fn start_dir_arg(dir: &str) -> String {
    let s = crate::mcp::text::fmt_literal(dir);
    match s.strip_suffix(';') {
        Some(head) => format!("{head}\\;"),
        None => s,
    }
}

/// Finds tmux on PATH and checks its version.
pub fn find_tmux() -> Result<PathBuf, String> {
    find_tmux_version().map(|(bin, _)| bin)
}

/// Finds tmux on PATH and checks its version; returns it with its `-V`.
pub(crate) fn find_tmux_version() -> Result<(PathBuf, String), String> {
    let bin = locate_tmux()?;
    let probe = version_probe(&bin)?;
    read_version(&bin, probe).map(|v| (bin, v))
}

/// tmux on PATH, its links resolved.
fn locate_tmux() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let bin = std::env::split_paths(&path)
        .map(|d| d.join("tmux"))
        .find(|p| p.is_file())
        .ok_or("tmux not found on PATH (install it, e.g. apt-get install tmux)")?;
    std::fs::canonicalize(&bin).map_err(|e| format!("{}: {e}", bin.display()))
}

/// `tmux -V`, started now and read later ([`read_version`]).
fn version_probe(bin: &Path) -> Result<Child, String> {
    Command::new(bin)
        .arg("-V")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} -V: {e}", bin.display()))
}

/// The probe's answer, checked against [`MIN_VERSION`].
fn read_version(bin: &Path, probe: Child) -> Result<String, String> {
    let out = probe
        .wait_with_output()
        .map_err(|e| format!("{} -V: {e}", bin.display()))?;
    let v = String::from_utf8_lossy(&out.stdout);
    let num: String = v
        .trim()
        .trim_start_matches("tmux ")
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = num.split('.').map(|s| s.parse::<u32>().unwrap_or(0));
    let ver = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    if ver < MIN_VERSION {
        return Err(format!(
            "{} is {}; sandmux needs tmux {}.{} or newer",
            bin.display(),
            v.trim(),
            MIN_VERSION.0,
            MIN_VERSION.1
        ));
    }
    Ok(v.trim().to_string())
}

/// Checks that `bin` is visible inside the sandbox through a read-only entry.
pub(crate) fn check_visible(policy: &Policy, bin: &Path) -> Result<(), String> {
    let ok = policy
        .fs
        .iter()
        .any(|e| e.kind == MountKind::ReadOnly && bin.starts_with(&e.path));
    if ok {
        Ok(())
    } else {
        Err(format!("{} is not inside a read-only tree of profile '{}'; add its directory to [filesystem] read_only", bin.display(), policy.name))
    }
}

/// Creates the instance's cgroup, or applies the profile's rule when there is none.
pub(crate) fn make_cgroup(
    policy: &Policy,
    rundir: &mut Rundir,
) -> Result<Result<cgroup::Cgroup, String>, StartError> {
    match cgroup::create(
        &format!("sandmux-{}", rundir.id),
        &format!("gen-{}", &nonce::hex()[..8]),
        policy.limits.processes,
        policy.limits.memory.0,
    ) {
        Ok(cg) => {
            rundir.set_cgroup(cg.clone());
            Ok(Ok(cg))
        }
        Err(reason) if policy.best_effort.contains(&crate::profile::Layer::Cgroup) => Ok(Err(
            format!("{reason}. In force instead: {}", without_cgroup(policy)),
        )),
        Err(reason) => Err(StartError::layer(crate::profile::Layer::Cgroup, &reason)),
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
    cgroup: Result<cgroup::Cgroup, String>,
    payload: Payload,
    tmux_conf: Option<String>,
) -> Plan {
    let (passwd, group) = sandbox::identity_files(policy);
    let gate_json = serde_json::to_string(&pane::GateConfig {
        policy: policy.clone(),
        own: Default::default(),
    })
    .unwrap_or_default();
    Plan {
        policy: policy.clone(),
        rundir: rundir.path.clone(),
        host_view: matches!(payload, Payload::Tmux { .. })
            .then(|| rundir.host_view())
            .flatten(),
        supervisor_pid: std::process::id() as i32,
        host_uid: nix::unistd::geteuid().as_raw(),
        host_gid: nix::unistd::getegid().as_raw(),
        cgroup,
        env: sandbox::env::build(&policy.environment, std::env::vars_os()),
        run_files: mounts::RunFiles {
            tmux_conf,
            gate_json,
            passwd,
            group,
            names: sandbox::name_files(policy),
        },
        payload,
        log: crate::log::init_level(),
    }
}

/// Who proves that a fresh server is the one this run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proof {
    /// A tmux client, before the server is handed on ([`Instance::verify`]).
    Here,
    /// `serve`'s hub: its command client makes the control session only on
    /// the server with this generation id and pid (`genesis`).
    Hub,
}

impl Instance {
    /// Starts a fresh confined tmux server; `proof` says who proves it ours.
    pub(crate) fn start(mut policy: Policy, proof: Proof) -> Result<Instance, StartError> {
        let tmux = locate_tmux().map_err(StartError::internal)?;
        // `tmux -V` runs while the sandbox starts; an old tmux is refused
        // before anything else is reported.
        let probe = version_probe(&tmux).map_err(StartError::internal)?;
        let host = (|| {
            check_visible(&policy, &tmux).map_err(StartError::internal)?;
            let rundir = Rundir::create().map_err(StartError::internal)?;
            let guard = crate::guard::watch::start_for(&mut policy, &rundir.id)?;
            Ok::<_, StartError>((rundir, guard))
        })();
        let (rundir, guard) = match host {
            Ok(h) => h,
            Err(e) => {
                let _ = read_version(&tmux, probe); // reaped
                return Err(e);
            }
        };
        let mut inst = Instance {
            rundir,
            init: None,
            messages: Vec::new(),
            server_pid: 0,
            generation: String::new(),
            tmux,
            tmux_version: String::new(),
            policy,
            guard: Some(guard),
            broker: None,
            supervisor: None,
            proxy: None,
        };
        let launched = inst.launch(true, proof);
        inst.tmux_version = read_version(&inst.tmux, probe).map_err(StartError::internal)?;
        launched?;
        Ok(inst)
    }

    /// Replaces the server with a fresh generation in the same runtime
    /// directory (same id, socket path and operator endpoint): the old sandbox
    /// and its cgroup are ended first, then a new sandbox, cgroup and
    /// generation id are made exactly as at start.
    pub(crate) fn restart(&mut self, proof: Proof) -> Result<(), StartError> {
        self.shutdown();
        if let Some(cg) = self.rundir.cgroup.take() {
            cg.remove();
        }
        let _ = std::fs::remove_file(self.socket());
        self.messages.clear();
        self.server_pid = 0;
        self.launch(false, proof)
    }

    /// Starts a generation (here, or later in the broker when there is
    /// one); proves it here unless the hub will.
    fn launch(&mut self, first: bool, proof: Proof) -> Result<(), StartError> {
        let g = match &self.broker {
            Some(b) if !first => {
                let g = b.launch()?;
                if let Some(cg) = g.cgroup.clone() {
                    self.rundir.set_cgroup(cg);
                }
                self.init = Some(Init::Brokered(g.init_pid));
                g
            }
            _ => {
                let (child, g) = start_generation(&self.policy, &mut self.rundir, &self.tmux)?;
                self.init = Some(Init::Own(child));
                g
            }
        };
        self.proxy = g.proxy;
        self.messages = g.messages;
        self.server_pid = g.server_pid;
        self.generation = g.generation;
        if let Some(w) = &self.guard {
            let mount = report::layers(&self.messages)
                .iter()
                .any(|l| l.layer == crate::profile::Layer::Mount && l.enforced);
            w.mount_in_force(mount);
        }
        match proof {
            Proof::Here => self.verify().map_err(StartError::internal),
            Proof::Hub => Ok(()),
        }
    }

    /// What the hub makes on this generation, and how it knows it.
    pub(crate) fn genesis(&self, first_session: bool) -> genesis::Genesis {
        genesis::Genesis {
            workspace: self.policy.workspace.display().to_string(),
            gate: self.gate().display().to_string(),
            first_session,
            generation: self.generation.clone(),
            server_pid: self.server_pid,
        }
    }

    /// The socket, host side.
    pub(crate) fn socket(&self) -> PathBuf {
        self.rundir.socket()
    }

    /// The pane gate: the mount view's, or without one the host view's
    /// (`sandbox::hostview`).
    pub(crate) fn gate(&self) -> PathBuf {
        let mount = report::layers(&self.messages)
            .iter()
            .any(|l| l.layer == crate::profile::Layer::Mount && l.enforced);
        match self.rundir.host_view() {
            Some(v) if !mount => v.join("bin/sandmux-pane"),
            _ => pane::GATE_PATH.into(),
        }
    }

    /// A tmux client command for this server: `-N` so it can never start a
    /// server of its own on the host, `-u` for UTF-8, no `TMUX` from the caller.
    pub(crate) fn client(&self) -> Command {
        let mut c = Command::new(&self.tmux);
        c.arg("-N").arg("-u").arg("-S").arg(self.socket());
        c.env_remove("TMUX").env_remove("TMUX_PANE");
        c
    }

    /// Runs one tmux command and returns its standard output.
    pub(crate) fn cmd(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .client()
            .args(args)
            .output()
            .map_err(|e| format!("tmux: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "tmux {}: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Proves the server at the socket is the one this run started: it carries
    /// this run's generation id and has the pid PID 1 reported.
    pub(crate) fn verify(&self) -> Result<(), String> {
        use genesis::{identity, Identity, IDENTITY};
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let why = match self.cmd(&["display-message", "-p", IDENTITY]) {
                Ok(g) => match identity(&g, &self.generation, self.server_pid) {
                    Identity::Ours => return Ok(()),
                    Identity::Foreign(why) => return Err(why),
                    Identity::Unset => "the configuration is not applied".to_string(),
                },
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(format!("cannot reach the sandboxed tmux server: {why}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What `serve` needs of the host once it confines itself
    /// (`sandbox::supervisor`), with its audit log and recording.
    pub(crate) fn supervisor_needs(
        &self,
        audit: &Path,
        record: Option<&Path>,
    ) -> crate::sandbox::supervisor::Needs {
        use crate::sandbox::supervisor::{Files, Needs};
        let trees: Vec<PathBuf> = self
            .policy
            .guard
            .trees
            .iter()
            .map(|t| t.root.clone())
            .collect();
        let cgroup = self
            .rundir
            .cgroup
            .as_ref()
            .map(|c| c.instance.clone())
            .unwrap_or_default();
        let view_base = self.rundir.view_base();
        let files = Files {
            rundir: &self.rundir.path,
            host_view: view_base.as_deref(),
            tmux: &self.tmux,
            audit,
            record,
            cgroup: &cgroup,
            guard: self
                .guard
                .as_ref()
                .map(|g| (trees.as_slice(), g.state.as_path())),
        };
        Needs::supervisor(&self.policy, &files)
    }

    /// The layer statuses reported at start.
    pub(crate) fn layers(&self) -> Vec<report::LayerStatus> {
        let mut l = report::layers(&self.messages);
        l.extend(self.supervisor.clone());
        l
    }

    /// Host pid of the `sandmux __init` process (0 once stopped).
    pub(crate) fn init_pid(&self) -> u32 {
        match &self.init {
            Some(Init::Own(c)) => c.id(),
            Some(Init::Brokered(pid)) => *pid,
            None => 0,
        }
    }

    /// Stops the instance: the server, every process inside, the runtime directory.
    pub(crate) fn stop(mut self) -> Vec<crate::guard::quarantine::Taken> {
        self.shutdown();
        let taken = self
            .guard
            .take()
            .map(crate::guard::watch::finish_and_say)
            .unwrap_or_default();
        // The instance's cgroup directory lies below a parent a confined
        // supervisor may not write: its broker removes it.
        if let (Some(cg), Some(b)) = (self.rundir.cgroup.take(), &self.broker) {
            cg.remove();
            b.end();
        }
        taken
    }

    fn shutdown(&mut self) {
        let mut child = match self.init.take() {
            Some(Init::Own(c)) => c,
            Some(Init::Brokered(pid)) => {
                if let Some(b) = &self.broker {
                    b.stop(pid);
                }
                return;
            }
            None => return,
        };
        end_init(&mut child);
    }
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

impl Drop for Instance {
    fn drop(&mut self) {
        self.shutdown();
    }
}
