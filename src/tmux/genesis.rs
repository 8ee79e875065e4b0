//! A fresh server's first sessions, made by the hub's command client itself
//! (no tmux client of its own before it: each costs a process start).
//!
//! The command client's own command is `if-shell -F` on the server's
//! generation id and pid: only on the server this run started does it make
//! the hidden control session and attach the client to it; on any other the
//! client makes nothing and exits. Once attached, the control pane is kept
//! dead and, unless `--no-session`, the first session is made by the
//! client that will watch it (its own command is `new-session`).

use super::client::{Client, Closing, Sink, TmuxError};
use super::cmd::Cmd;
use super::hub::{CONTROL_SESSION, DEADLINE, WATCH_FLAGS};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The first session's name.
pub(crate) const FIRST_SESSION: &str = "main";

/// What a fresh server is given before it serves, and how it is known.
#[derive(Debug, Clone)]
pub(crate) struct Genesis {
    /// Each session's starting directory (inside the sandbox).
    pub workspace: String,
    /// The pane gate (`Instance::gate`).
    pub gate: String,
    /// Whether the first session is made (not with `--no-session`).
    pub first_session: bool,
    /// The server's `@sandmux_generation`.
    pub generation: String,
    /// Its pid inside the sandbox.
    pub server_pid: i32,
}

impl Genesis {
    /// The command client's own command (argv after `tmux -C`).
    pub(crate) fn argv(&self) -> Vec<String> {
        let control = Cmd::new("new-session")
            .opt("-s", CONTROL_SESSION)
            .opt("-f", "no-output,ignore-size")
            .opt("-x", "80")
            .opt("-y", "24")
            .opt("-c", self.start_dir())
            // The control pane needs no process: it is kept once dead, and
            // ^D ends `cat` (the line discipline holds it until `cat` reads).
            .rest([self.gate.as_str(), "--exec", "--", "cat"]);
        // In the same command list, so the pane is kept whatever its process does.
        let keep = Cmd::new("set-option")
            .flag("-w")
            .opt("-t", CONTROL_SESSION)
            .arg("remain-on-exit")
            .arg("on");
        let cond = format!(
            "#{{==:#{{@sandmux_generation}} #{{pid}},{} {}}}",
            self.generation, self.server_pid
        );
        if_shell(&cond, &[control, keep])
    }

    /// The workspace as `-c` takes it (tmux expands it as a format).
    fn start_dir(&self) -> String {
        crate::tmux::fmt_literal(&self.workspace)
    }

    /// The control pane's id, asked by the attached command client.
    fn control_pane(control: &str) -> Cmd {
        Cmd::new("display-message")
            .flag("-p")
            .opt("-t", control)
            .arg("#{pane_id}")
    }

    /// The first session's watcher's own command: it makes the session
    /// (the sandbox's interactive shell through the gate) and watches it.
    /// (Through `if-shell`, so the workspace is one quoted word of a command
    /// line: as a bare argument, one that ends in `;` would end the command.)
    pub(crate) fn first_argv(&self) -> Vec<String> {
        let first = Cmd::new("new-session")
            .opt("-s", FIRST_SESSION)
            .opt("-f", WATCH_FLAGS)
            .opt("-x", "200")
            .opt("-y", "50")
            .opt("-c", self.start_dir());
        if_shell("1", &[first])
    }
}

/// `if-shell -F COND 'CMD ; CMD…'`: the commands as one quoted list.
fn if_shell(cond: &str, cmds: &[Cmd]) -> Vec<String> {
    let list: Vec<String> = cmds.iter().map(Cmd::line).collect();
    vec![
        "if-shell".into(),
        "-F".into(),
        cond.into(),
        list.join(" ; "),
    ]
}

/// Why [`make`] failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failed {
    /// The command client ended unattached: not listening yet (tmux binds
    /// its socket before it listens), or not the server this run started.
    /// [`prove`] tells which.
    #[error("the command client ended: {0}")]
    Unattached(String),
    /// Anything else.
    #[error(transparent)]
    Other(#[from] GenesisError),
}

/// Why a fresh server's sessions were not made or its identity not proven.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GenesisError {
    /// No plain client answered within the deadline.
    #[error("cannot reach the sandboxed tmux server: no answer")]
    NoAnswer,
    /// A plain tmux client could not be run.
    #[error("tmux: {0}")]
    Spawn(std::io::Error),
    /// The server at the socket has another generation id or pid.
    #[error("{0}")]
    Foreign(String),
    /// The server did not prove itself before the deadline: the last why.
    #[error("cannot reach the sandboxed tmux server: {0}")]
    Unreachable(String),
    /// tmux refused to make the control session.
    #[error("creating the control session: {0}")]
    ControlSession(String),
    /// The command client failed.
    #[error("control client: {0}")]
    Control(TmuxError),
    /// The command client named no control pane.
    #[error("control client: no control pane ({0:?})")]
    NoControlPane(Vec<Vec<u8>>),
    /// Ending the control pane's `cat` failed.
    #[error("the control pane ({line}): {source}")]
    ControlPane { line: String, source: TmuxError },
    /// The first session's watcher could not be started.
    #[error("making the first session: {0}")]
    FirstWatcher(std::io::Error),
    /// The first session could not be made or set up.
    #[error("making the first session: {0}")]
    FirstSession(TmuxError),
}

/// What a server's answer to [`IDENTITY`] says of it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Identity {
    /// This run's generation id and the pid PID 1 reported.
    Ours,
    /// No generation yet: the configuration is not applied.
    Unset,
    /// Another server: why, for the error.
    Foreign(String),
}

/// The format both facts are read with (the generation is a global user
/// option).
pub(crate) const IDENTITY: &str = "#{@sandmux_generation} #{pid}";

/// Reads one answer to [`IDENTITY`] (`shell` and `check` ask with
/// `Instance::verify`, `serve` with [`prove`] after an unattached client).
pub(crate) fn identity(answer: &str, generation: &str, pid: i32) -> Identity {
    let got = answer.trim_end();
    let want = format!("{generation} {pid}");
    match got {
        _ if got == want => Identity::Ours,
        _ if got.starts_with(' ') => Identity::Unset,
        _ => Identity::Foreign(format!(
            "the tmux server at the socket is not the one this run started \
             (generation id and pid {got:?}, expected {want:?})"
        )),
    }
}

/// Proves with plain tmux clients, retried for 3 s, that the server at
/// `socket` listens and has this generation id and pid (the slow path,
/// after [`Failed::Unattached`]).
pub(crate) async fn prove(
    tmux: &Path,
    socket: &Path,
    genesis: &Genesis,
) -> Result<(), GenesisError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let ask = tokio::process::Command::new(tmux)
            .args(["-N", "-u", "-S"])
            .arg(socket)
            .args(["display-message", "-p", IDENTITY])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout_at(deadline + Duration::from_secs(1), ask)
            .await
            .map_err(|_| GenesisError::NoAnswer)?
            .map_err(GenesisError::Spawn)?;
        let got = String::from_utf8_lossy(&out.stdout);
        let why = match out.status.success() {
            true => match identity(&got, &genesis.generation, genesis.server_pid) {
                Identity::Ours => return Ok(()),
                Identity::Foreign(why) => return Err(GenesisError::Foreign(why)),
                Identity::Unset => "the configuration is not applied".to_string(),
            },
            false => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        };
        if tokio::time::Instant::now() > deadline {
            return Err(GenesisError::Unreachable(why));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What [`make`] made.
pub(crate) struct Made {
    /// The control session's id (`$N`) and its pane's (`%N`).
    pub control: (String, String),
    /// The first session's id and its watcher.
    pub first: Option<(String, Client)>,
}

/// Makes the sessions through `cmd`, the command client started with
/// [`Genesis::argv`], and the first session's watcher. One client
/// identifies at a time, and no command runs meanwhile (see `hub`).
pub(crate) async fn make(
    cmd: &Client,
    genesis: &Genesis,
    tmux: &Path,
    socket: &Path,
    sink: Arc<dyn Sink>,
) -> Result<Made, Failed> {
    let control = match cmd.attached(DEADLINE).await {
        Ok(id) => String::from_utf8_lossy(&id.concat()).into_owned(),
        Err(TmuxError::Closed(why @ Closing::OwnCommand(_))) => {
            return Err(GenesisError::ControlSession(why.to_string()).into())
        }
        Err(TmuxError::Closed(why)) => return Err(Failed::Unattached(why.to_string())),
        Err(e) => return Err(GenesisError::Control(e).into()),
    };
    made(cmd, genesis, control, tmux, socket, sink)
        .await
        .map_err(Failed::Other)
}

/// The rest of [`make`], once the command client is attached.
async fn made(
    cmd: &Client,
    genesis: &Genesis,
    control: String,
    tmux: &Path,
    socket: &Path,
    sink: Arc<dyn Sink>,
) -> Result<Made, GenesisError> {
    let pane = cmd
        .run(&Genesis::control_pane(&control).line(), DEADLINE)
        .await
        .map_err(GenesisError::Control)?;
    let pane = match pane.as_slice() {
        [id] if id.starts_with(b"%") && control.starts_with('$') => {
            String::from_utf8_lossy(id).into_owned()
        }
        _ => return Err(GenesisError::NoControlPane(pane.clone())),
    };
    let first = match genesis.first_session {
        true => Some(first_session(cmd, genesis, tmux, socket, sink).await?),
        false => None,
    };
    // `cat` ends only now: its pane's death (and the window's rename) is
    // notified to every control client, so not while one identifies.
    let end_cat = Cmd::new("send-keys").opt("-t", &control).arg("C-d");
    cmd.run(&end_cat.line(), DEADLINE)
        .await
        .map_err(|source| GenesisError::ControlPane {
            line: end_cat.line(),
            source,
        })?;
    Ok(Made {
        control: (control, pane),
        first,
    })
}

/// The first session, made by its own watcher.
async fn first_session(
    cmd: &Client,
    genesis: &Genesis,
    tmux: &Path,
    socket: &Path,
    sink: Arc<dyn Sink>,
) -> Result<(String, Client), GenesisError> {
    let w = Client::start("watch-first", tmux, socket, &genesis.first_argv(), sink)
        .await
        .map_err(GenesisError::FirstWatcher)?;
    let id = w
        .attached(DEADLINE)
        .await
        .map_err(GenesisError::FirstSession)?;
    let id = String::from_utf8_lossy(&id.concat()).into_owned();
    // Its window keeps this size (see tools::spawn::fixed_size).
    let manual = Cmd::new("set-option")
        .flag("-w")
        .opt("-t", &id)
        .arg("window-size")
        .arg("manual");
    cmd.run(&manual.line(), DEADLINE)
        .await
        .map_err(GenesisError::FirstSession)?;
    Ok((id, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn g() -> Genesis {
        Genesis {
            workspace: "/w s/'x\"".into(),
            gate: "/run/sandmux/bin/sandmux-pane".into(),
            first_session: true,
            generation: "abc".into(),
            server_pid: 2,
        }
    }

    #[test]
    fn the_control_session_is_made_only_on_the_proven_server() {
        let a = g().argv();
        assert_eq!(a[0], "if-shell");
        assert_eq!(a[2], "#{==:#{@sandmux_generation} #{pid},abc 2}");
        assert!(a[3].starts_with("new-session -s "), "{}", a[3]);
        assert!(a[3].contains(" ; set-option -w -t "), "{}", a[3]);
        // The workspace is one quoted word of the inner command.
        assert!(!a[3].contains(" s/'x"), "{}", a[3]);
    }

    /// A tmux server, killed when dropped (a failing test leaves none).
    struct Server(std::process::Child);

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A real tmux server (no sandbox) with this generation id.
    fn server(dir: &Path, name: &str, generation: &str) -> (Server, PathBuf) {
        let conf = dir.join(format!("{name}.conf"));
        let body = format!(
            "set -g default-shell /bin/sh\nset -s exit-empty off\nset -g @sandmux_generation {generation}\n"
        );
        std::fs::write(&conf, body).unwrap();
        let sock = dir.join(format!("{name}.sock"));
        let child = std::process::Command::new("tmux")
            .arg("-D")
            .arg("-f")
            .arg(&conf)
            .arg("-S")
            .arg(&sock)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let child = Server(child);
        let t0 = std::time::Instant::now();
        while sessions(&sock).is_none() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        (child, sock)
    }

    /// The server's session names, once it answers.
    fn sessions(sock: &Path) -> Option<Vec<String>> {
        let out = std::process::Command::new("tmux")
            .arg("-N")
            .arg("-S")
            .arg(sock)
            .args(["list-sessions", "-F", "#{session_name}"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // No sessions yet is an error with a server that answers.
        let up =
            out.status.success() || String::from_utf8_lossy(&out.stderr).contains("no sessions");
        up.then(|| text.lines().map(String::from).collect())
    }

    fn genesis_for(dir: &Path, generation: &str, pid: u32) -> Genesis {
        let gate = dir.join("gate");
        std::fs::write(&gate, "#!/bin/sh\nshift 2\nexec \"$@\"\n").unwrap();
        std::fs::set_permissions(&gate, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        Genesis {
            workspace: dir.display().to_string(),
            gate: gate.display().to_string(),
            first_session: true,
            generation: generation.into(),
            server_pid: pid as i32,
        }
    }

    #[tokio::test]
    async fn sessions_are_made_once_the_socket_listens_and_only_on_the_proven_server() {
        use crate::tmux::hub::Hub;
        let dir = tempfile::tempdir().unwrap();
        let tmux = crate::tmux::find_tmux().unwrap();
        let (ours, real) = server(dir.path(), "ours", "gen1");
        // The socket path is bound but not listening (as tmux's is between
        // bind and listen) for 300 ms, then leads to the server.
        let path = dir.path().join("sock");
        let fd = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )
        .unwrap();
        nix::sys::socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &nix::sys::socket::UnixAddr::new(&path).unwrap(),
        )
        .unwrap();
        let (p2, r2) = (path.clone(), real.clone());
        let later = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(fd);
            std::fs::remove_file(&p2).unwrap();
            std::os::unix::fs::symlink(&r2, &p2).unwrap();
        });
        let mut g = genesis_for(dir.path(), "gen1", ours.0.id());
        // A workspace tmux would expand (`-c` is a format) or cut (an
        // argument that ends in `;` ends the command) is taken literally.
        let ws = dir.path().join("w #{pid};");
        std::fs::create_dir(&ws).unwrap();
        g.workspace = ws.display().to_string();
        let hub = Hub::spawn(&tmux, &path, g, 4).await.unwrap();
        assert_eq!(hub.created().await, Ok(()));
        later.join().unwrap();
        let mut names = sessions(&real).unwrap();
        names.sort();
        assert_eq!(names, ["_sandmux", "main"]);
        let cwd = std::process::Command::new("tmux")
            .arg("-S")
            .arg(&real)
            .args([
                "display-message",
                "-p",
                "-t",
                "main",
                "#{pane_current_path}",
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&cwd.stdout).trim(),
            ws.display().to_string()
        );
        assert!(
            hub.control_pane_id().starts_with('%'),
            "{}",
            hub.control_pane_id()
        );
        assert_eq!(hub.watcher_count(), 1);
        hub.shutdown();
        // The control: a server with another generation id gets nothing.
        let (_other, foreign) = server(dir.path(), "other", "gen2");
        let g = genesis_for(dir.path(), "gen1", _other.0.id());
        let hub = Hub::spawn(&tmux, &foreign, g, 4).await.unwrap();
        let err = hub.created().await.unwrap_err();
        assert!(err.contains("not the one this run started"), "{err}");
        assert_eq!(sessions(&foreign).unwrap(), Vec::<String>::new());
        hub.shutdown();
    }

    #[test]
    fn an_argv_start_directory_is_taken_literally() {
        let dir = tempfile::tempdir().unwrap();
        let (_srv, sock) = server(dir.path(), "argv", "gen3");
        for (i, name) in ["w #{pid};", "a\\;", "b;;"].into_iter().enumerate() {
            let ws = dir.path().join(name);
            std::fs::create_dir(&ws).unwrap();
            let arg = crate::tmux::start_dir_arg(&ws.display().to_string());
            let s = format!("s{i}");
            let ok = std::process::Command::new("tmux")
                .arg("-S")
                .arg(&sock)
                .args(["new-session", "-d", "-s", &s, "-c", &arg])
                .status()
                .unwrap();
            assert!(ok.success());
            // The pane's directory is read from its process, which may not
            // have started yet: asked again for up to 5 s.
            let want = ws.display().to_string();
            let t0 = std::time::Instant::now();
            let got = loop {
                let cwd = std::process::Command::new("tmux")
                    .arg("-S")
                    .arg(&sock)
                    .args(["display-message", "-p", "-t", &s, "#{pane_current_path}"])
                    .output()
                    .unwrap();
                let got = String::from_utf8_lossy(&cwd.stdout).trim_end().to_string();
                if got == want || t0.elapsed() > Duration::from_secs(5) {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn an_answer_is_ours_unset_or_foreign() {
        assert_eq!(identity("abc 2\n", "abc", 2), Identity::Ours);
        assert_eq!(identity(" 2\n", "abc", 2), Identity::Unset);
        for other in ["abd 2\n", "abc 3\n", "abc\n", "", "abc 2 x\n"] {
            assert!(
                matches!(identity(other, "abc", 2), Identity::Foreign(_)),
                "{other:?}"
            );
        }
    }

    #[test]
    fn the_first_session_is_made_by_its_watcher_in_the_workspace() {
        let a = g().first_argv();
        assert_eq!(a[..3], ["if-shell", "-F", "1"]);
        assert!(a[3].starts_with("new-session -s "), "{}", a[3]);
        assert_eq!(a.len(), 4);
    }
}
