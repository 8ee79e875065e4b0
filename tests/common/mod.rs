//! Shared helpers for the integration tests: they drive the real `sandmux`
//! binary against the real kernel and the real tmux. Nothing here mocks a layer.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod story;
#[allow(unused_imports)]
pub(crate) use story::{ran, run, Ran, Run};

/// The binary under test (`SANDMUX_BIN` overrides, for runs as another uid).
pub(crate) fn bin() -> PathBuf {
    std::env::var_os("SANDMUX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sandmux")))
}

/// A fresh workspace directory (real path, no symlinks), removed on drop.
pub(crate) struct Ws {
    pub dir: tempfile::TempDir,
}

impl Ws {
    pub(crate) fn new() -> Ws {
        let dir = tempfile::Builder::new()
            .prefix("sandmux-test-ws-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Ws { dir }
    }
    pub(crate) fn path(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap()
    }
    pub(crate) fn join(&self, p: &str) -> PathBuf {
        self.path().join(p)
    }
}

/// A directory on the host outside any workspace, for canaries.
pub(crate) fn host_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sandmux-test-host-")
        .tempdir()
        .expect("tempdir")
}

pub(crate) fn sandmux(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args);
    c
}

/// `sandmux run -p PROFILE -w WS -- bash -c SCRIPT`.
pub(crate) fn run_script(ws: &Ws, profile: &str, script: &str) -> Ran {
    run(ws.path()).profile(profile).script(script).output()
}

/// [`run_script`] with the workspace live (the guard's tests).
pub(crate) fn run_script_live(ws: &Ws, profile: &str, script: &str) -> Ran {
    run(ws.path())
        .live()
        .profile(profile)
        .script(script)
        .output()
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Writes a profile file (outside the workspace) derived from a built-in.
pub(crate) fn profile_file(
    dir: &Path,
    name: &str,
    base: &str,
    edit: impl Fn(String) -> String,
) -> PathBuf {
    let out = sandmux(&["profile", "show", base]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, edit(String::from_utf8(out.stdout).unwrap())).unwrap();
    p
}

/// A running instance (`sandmux __instance`), driven with plain tmux clients.
pub(crate) struct Inst {
    pub child: Child,
    pub socket: PathBuf,
    pub rundir: PathBuf,
    pub tmux: PathBuf,
    pub init_pid: u32,
    pub server_pid: i64,
    pub info: serde_json::Value,
}

impl Inst {
    pub(crate) fn start(ws: &Ws, profile: &str) -> Inst {
        Self::start_env(ws, profile, &[])
    }

    /// Live mode: the workspace is these tests' channel from panes to the
    /// host (the copy-on-write workspace has tests of its own).
    pub(crate) fn start_env(ws: &Ws, profile: &str, env: &[(&str, &str)]) -> Inst {
        let mut c = sandmux(&[
            "__instance",
            "-p",
            profile,
            "-w",
            ws.path().to_str().unwrap(),
            "--workspace-mode",
            "live",
        ]);
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = Vec::new();
        let mut out = child.stdout.take().unwrap();
        let mut b = [0u8; 1];
        while out.read(&mut b).map(|n| n == 1).unwrap_or(false) && b[0] != b'\n' {
            line.push(b[0]);
        }
        if line.is_empty() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("instance did not start: {err}");
        }
        let info: serde_json::Value = serde_json::from_slice(&line).expect("instance json");
        let inst = Inst {
            socket: PathBuf::from(info["socket"].as_str().unwrap()),
            rundir: PathBuf::from(info["rundir"].as_str().unwrap()),
            tmux: PathBuf::from(info["tmux"].as_str().unwrap()),
            init_pid: info["init_pid"].as_u64().unwrap() as u32,
            server_pid: info["server_pid"].as_i64().unwrap(),
            info,
            child,
        };
        let wsp = ws.path();
        inst.tmux_ok(&[
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            "160",
            "-y",
            "40",
            "-c",
            wsp.to_str().unwrap(),
        ]);
        inst
    }

    /// A host-side tmux client of this instance's server.
    pub(crate) fn tmux(&self, args: &[&str]) -> Output {
        Command::new(&self.tmux)
            .arg("-N")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env_remove("TMUX")
            .output()
            .unwrap()
    }

    pub(crate) fn tmux_ok(&self, args: &[&str]) -> String {
        let o = self.tmux(args);
        assert!(o.status.success(), "tmux {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Runs `script` in a new pane (shell-string form, through the gate) and
    /// returns what it wrote. Output goes to a file in the workspace.
    pub(crate) fn pane(&self, ws: &Ws, script: &str) -> String {
        self.pane_with(ws, script, &[])
    }

    /// Like [`pane`], with extra tmux arguments for new-window (e.g. argv form).
    pub(crate) fn pane_with(&self, ws: &Ws, script: &str, _extra: &[&str]) -> String {
        let id = format!("{:x}", rand_u64());
        let out = ws.join(&format!(".pane-{id}.out"));
        let done = ws.join(&format!(".pane-{id}.done"));
        let full = format!(
            "( {script} ) > {} 2>&1; touch {}",
            out.display(),
            done.display()
        );
        self.tmux_ok(&["new-window", "-d", "-t", "main", &full]);
        wait_for(
            || done.exists(),
            Duration::from_secs(20),
            "pane script to finish",
        );
        let s = std::fs::read_to_string(&out).unwrap_or_default();
        let _ = std::fs::remove_file(&out);
        let _ = std::fs::remove_file(&done);
        s
    }

    /// Host pids of every process in the sandbox (descendants of the init).
    pub(crate) fn host_pids(&self) -> Vec<u32> {
        descendants(self.init_pid)
    }

    pub(crate) fn stop(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for Inst {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    u64::from_le_bytes(b)
}

pub(crate) fn wait_for(mut f: impl FnMut() -> bool, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// All descendants of `root` (by scanning /proc for parent links).
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            if let Some(i) = stat.rfind(')') {
                let ppid: u32 = stat[i + 2..]
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                parent.insert(pid, ppid);
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&c, &pp) in &parent {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

pub(crate) fn alive(pid: u32) -> bool {
    // A zombie counts as dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

pub(crate) fn uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// Writes bytes to a file, creating parents.
pub(crate) fn put(p: &Path, content: &str) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut f = std::fs::File::create(p).unwrap();
    f.write_all(content.as_bytes()).unwrap();
}

/// This user's runtime base directory (as sandmux chooses it).
pub(crate) fn runtime_base() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(|d| PathBuf::from(d).join("sandmux"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sandmux-{}", uid())))
}

/// Asserts that no runtime directory owned by supervisor `sup` is left.
pub(crate) fn assert_no_rundir_of(sup: u32) {
    for e in std::fs::read_dir(runtime_base())
        .into_iter()
        .flatten()
        .flatten()
    {
        let owner = std::fs::read_to_string(e.path().join("owner")).unwrap_or_default();
        assert!(
            !owner.starts_with(&format!("{sup} ")),
            "runtime dir {} left behind",
            e.path().display()
        );
    }
}

/// Host-side git, as the user runs it: no system or global config of the
/// machine, any owner accepted (the workspace may belong to another uid).
pub(crate) fn host_git(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "user.name=h",
            "-c",
            "user.email=h@example.invalid",
            "-c",
            "protocol.file.allow=always",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", "/nonexistent")
        .env_remove("GIT_DIR")
        .stdin(Stdio::null())
        .output()
        .expect("git")
}

/// A profile text with the workspace guard off: no guarded names, git unguarded.
pub(crate) fn unguard(t: String) -> String {
    let start = t.find("protected = [").expect("protected list");
    let end = start + t[start..].find("\n]\n").expect("end of the protected list") + 3;
    format!("{}protected = []\n{}", &t[..start], &t[end..])
        .replace("git = \"read-only\"", "git = \"unguarded\"")
}

/// Waits (at most 20 s) until `p` exists.
pub(crate) fn wait_for_file(p: &Path) {
    let t0 = Instant::now();
    while !p.exists() {
        assert!(
            t0.elapsed().as_secs() < 20,
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `sandmux run -p PROFILE -w WS -- bash -c SCRIPT` command, stdin closed.
#[allow(dead_code)]
/// Live mode: these are the workspace guard's tests (the copy-on-write
/// workspace's use [`run_cow_cmd`]).
pub(crate) fn run_cmd(ws: &Path, profile: &str, state: &Path, script: &str) -> Command {
    run(ws)
        .live()
        .profile(profile)
        .state(state)
        .script(script)
        .command()
}

/// The profile's own mode (the built-ins': copy-on-write), the layer kept
/// at the end (`--on-end keep`) for the test to look at.
pub(crate) fn run_cow_cmd(ws: &Path, profile: &str, state: &Path, script: &str) -> Command {
    run(ws)
        .flag("--on-end", "keep")
        .profile(profile)
        .state(state)
        .script(script)
        .command()
}
