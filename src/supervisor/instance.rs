//! An instance on the host: its runtime directory, its workspace guard, the
//! generations of its sandboxed tmux server (started here or by the broker),
//! proven to be the ones this run started, and stopped with everything in
//! them.

use super::generation::{check_visible, end_init, start_generation};
use crate::guard::quarantine::{How, Taken};
use crate::profile::Policy;
use crate::sandbox::report::{self, Message};
use crate::sandbox::{pane, StartError};
use crate::supervisor::rundir::Rundir;
use crate::tmux::{genesis, locate_tmux, read_version, version_probe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// What a tmux command to the instance's server, or the proof that the
/// server is the one this run started, fails with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstanceError {
    /// The tmux client could not be started.
    #[error("tmux: {0}")]
    Spawn(std::io::Error),
    /// tmux refused the command (its first word, and what tmux said).
    #[error("tmux {cmd}: {stderr}")]
    Tmux {
        /// The command.
        cmd: String,
        /// tmux's stderr.
        stderr: String,
    },
    /// A server answers at the socket, but not this run's.
    #[error("{0}")]
    Foreign(String),
    /// No proof within the deadline.
    #[error("cannot reach the sandboxed tmux server: {0}")]
    Unreachable(String),
}

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
    /// The policy the sandbox is built from (`launch::derive`).
    pub policy: Policy,
    /// What happens to the layer at the end.
    on_end: crate::profile::OnEnd,
    /// The workspace guard's watch (P8); it outlives server restarts.
    pub guard: Option<crate::guard::watch::Watch>,
    /// Does for a confined supervisor (`serve`) what it can no longer do:
    /// start later generations, run the signals freezer.
    pub broker: Option<std::sync::Arc<crate::supervisor::broker::Broker>>,
    /// The supervisor's own confinement, once `serve` applied it.
    pub supervisor: Option<report::LayerStatus>,
    /// Proxy mode: the listener to serve, until the caller takes it.
    pub proxy: Option<std::net::TcpListener>,
    /// Copy-on-write mode: the layer's lock, held while the instance lives.
    layer: Option<super::layer::Live>,
}

/// The sandbox `__init` of a generation: this process's child, or the broker's.
enum Init {
    Own(Child),
    Brokered(u32),
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
    /// Starts a fresh confined tmux server as instance `id`
    /// ([`Rundir::new_id`]) through the one launch path
    /// ([`super::launch`]); `proof` says who proves it ours.
    pub(crate) fn start(
        creds: super::launch::Credentialed,
        proof: Proof,
        id: &str,
    ) -> Result<Instance, StartError> {
        let tmux = locate_tmux().map_err(|e| StartError::internal(e.to_string()))?;
        // `tmux -V` runs while the sandbox starts; an old tmux is refused
        // before anything else is reported.
        let probe = version_probe(&tmux).map_err(|e| StartError::internal(e.to_string()))?;
        let launched = check_visible(creds.resolved(), &tmux)
            .map_err(|e| StartError::internal(e.to_string()))
            .and_then(|()| creds.host(id, crate::supervisor::rundir::Serves::Tmux));
        let l = match launched {
            Ok(l) => l,
            Err(e) => {
                let _ = read_version(&tmux, probe); // reaped
                return Err(e);
            }
        };
        let mut inst = Instance {
            on_end: l.policy.on_end,
            rundir: l.rundir,
            init: None,
            messages: Vec::new(),
            server_pid: 0,
            generation: String::new(),
            tmux,
            tmux_version: String::new(),
            policy: l.policy,
            guard: l.guard,
            layer: l.layer,
            broker: None,
            supervisor: None,
            proxy: None,
        };
        let launched = inst.launch(true, proof);
        inst.tmux_version =
            read_version(&inst.tmux, probe).map_err(|e| StartError::internal(e.to_string()))?;
        launched?;
        Ok(inst)
    }

    /// The layer's bound ended the sandbox: its layer is kept as it was,
    /// whatever `--on-end` said ([`super::launch::End`]).
    pub(crate) fn keep_layer_over_bound(&mut self) {
        self.on_end = super::launch::End::KeptOverBound.on_end();
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
            Proof::Here => self
                .verify()
                .map_err(|e| StartError::internal(e.to_string())),
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
    pub(crate) fn cmd(&self, args: &[&str]) -> Result<String, InstanceError> {
        let out = self
            .client()
            .args(args)
            .output()
            .map_err(InstanceError::Spawn)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(InstanceError::Tmux {
                cmd: args.first().unwrap_or(&"").to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// Proves the server at the socket is the one this run started: it carries
    /// this run's generation id and has the pid PID 1 reported.
    pub(crate) fn verify(&self) -> Result<(), InstanceError> {
        use genesis::{identity, Identity, IDENTITY};
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let why = match self.cmd(&["display-message", "-p", IDENTITY]) {
                Ok(g) => match identity(&g, &self.generation, self.server_pid) {
                    Identity::Ours => return Ok(()),
                    Identity::Foreign(why) => return Err(InstanceError::Foreign(why)),
                    Identity::Unset => "the configuration is not applied".to_string(),
                },
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(InstanceError::Unreachable(why));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What `serve` needs of the host once it confines itself
    /// (`confine`), with its audit log and recording.
    pub(crate) fn supervisor_needs(
        &self,
        audit: &Path,
        record: Option<&Path>,
    ) -> crate::confine::Needs {
        use crate::confine::{Files, Needs};
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
            proxy: crate::proxy::dials(&self.policy),
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
        let mut taken = self
            .guard
            .take()
            .map(crate::guard::watch::finish_and_say)
            .unwrap_or_default();
        if let Some(line) = super::layer::finish(
            &self.policy,
            &self.rundir.id,
            self.layer.take(),
            self.on_end,
        ) {
            tracing::warn!("{line}");
            // With the reverts: to the audit log in `serve`, as the
            // layer's own record (`workspace_layer`), not a revert.
            taken.push(Taken::notice(How::LayerNotice, line));
        }
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

impl Drop for Instance {
    fn drop(&mut self) {
        self.shutdown();
    }
}
