//! The confined tmux server: attacks from inside panes, checked from the host.

use crate::common;
use common::*;
use std::time::Duration;

/// T1/P2: a pane cannot reach the sandbox's own tmux socket, by path or
/// through the server's /proc entries. The host side still can (control).
#[test]
fn pane_cannot_reach_own_socket() {
    let ws = Ws::new();
    let inst = Inst::start(&ws, "default");
    let hooks_before = inst.tmux_ok(&["show-hooks", "-g"]);
    let out = inst.pane(
        &ws,
        "tmux -S /run/sandmux/sock/tmux.sock new-session -d 'touch /tmp/pwned'; echo tmux=$?; \
         ls -a /run/sandmux/sock; echo ls=$?; \
         python3 -c \"import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n  s.connect('/run/sandmux/sock/tmux.sock'); print('CONNECTED')\nexcept OSError as e:\n  print('connect', e.errno)\"; \
         for p in $(pgrep -x 'tmux: server'); do ls -l /proc/$p/fd/ 2>&1 | grep -c socket; readlink /proc/$p/root; echo root=$?; done; \
         find / -xdev -type s 2>/dev/null | grep -c tmux; echo TMUX=${TMUX:-unset}",
    );
    assert!(out.contains("tmux=1"), "{out}");
    assert!(out.contains("ls=2"), "{out}");
    assert!(out.contains(&format!("connect {}", libc::EACCES)), "{out}");
    assert!(!out.contains("CONNECTED"), "{out}");
    assert!(out.contains("root=1"), "{out}");
    assert!(out.contains("TMUX=unset"), "{out}");
    // Host side: one session (the test's panes), no new clients or hooks.
    let sessions = inst.tmux_ok(&["list-sessions", "-F", "#{session_name}"]);
    assert_eq!(sessions.lines().count(), 1, "{sessions}");
    assert_eq!(inst.tmux_ok(&["show-hooks", "-g"]), hooks_before);
    assert_eq!(inst.tmux_ok(&["list-clients"]).trim(), "");
}

/// The setgid utempter helper tmux forks for every pane is emptied in the
/// server's view: a pane finds an empty file it cannot run (and tmux's
/// helper call fails at once).
#[test]
fn the_utempter_helper_is_emptied() {
    let helper = [
        "/usr/lib/x86_64-linux-gnu/utempter/utempter",
        "/usr/lib/aarch64-linux-gnu/utempter/utempter",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(helper) = helper else {
        eprintln!("no utempter helper on this host: nothing to empty");
        return;
    };
    let ws = Ws::new();
    let inst = Inst::start(&ws, "default");
    let out = inst.pane(
        &ws,
        &format!("wc -c < {helper}; {helper} add x; echo run=$?"),
    );
    assert!(out.starts_with("0\n"), "{out}");
    assert!(out.contains("run=126"), "{out}");
    // Positive control: the helper is a real program on the host.
    assert!(std::fs::metadata(helper).unwrap().len() > 0);
}

/// T2: the user's own tmux servers (default socket directory, and the one in
/// the launch-time TMUX) are unreachable, and TMUX never enters the sandbox.
#[test]
fn pane_cannot_reach_host_tmux() {
    let ws = Ws::new();
    let name = format!("sandmux-test-{:x}", rand_u64());
    let tmux = sandmux::testing::find_tmux().unwrap();
    let host = |args: &[&str]| {
        std::process::Command::new(&tmux)
            .arg("-L")
            .arg(&name)
            .args(args)
            .env_remove("TMUX")
            .env("SHELL", "/bin/sh")
            .output()
            .unwrap()
    };
    assert!(host(&[
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "hostsess",
        "sleep 3600"
    ])
    .status
    .success());
    let sock = String::from_utf8(host(&["display-message", "-p", "#{socket_path}"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    let tmux_env = format!("{sock},1,0");
    let inst = Inst::start_env(&ws, "default", &[("TMUX", &tmux_env), ("TMUX_PANE", "%0")]);
    let out = inst.pane(
        &ws,
        &format!(
            "tmux -L {name} new-window 'touch /tmp/x'; echo L=$?; tmux -S {sock} kill-server; echo S=$?; \
             tmux ls; echo D=$?; ls /tmp; env | grep -c TMUX"
        ),
    );
    let after = String::from_utf8(
        host(&["list-sessions", "-F", "#{session_name} #{session_windows}"]).stdout,
    )
    .unwrap();
    let clients = String::from_utf8(host(&["list-clients"]).stdout).unwrap();
    let _ = host(&["kill-server"]);
    assert!(
        out.contains("L=1") && out.contains("S=1") && out.contains("D=1"),
        "{out}"
    );
    assert!(
        out.trim_end().ends_with('0'),
        "TMUX variables inside: {out}"
    );
    assert_eq!(after.trim(), "hostsess 1", "the host server changed");
    assert_eq!(clients.trim(), "");
}

/// T5/E6: signals and ptrace from a pane cannot reach the tmux server or PID 1;
/// the server still answers afterwards.
#[test]
fn pane_cannot_signal_server_or_init() {
    let ws = Ws::new();
    let inst = Inst::start(&ws, "default");
    let out = inst.pane(
        &ws,
        "for p in $(ls /proc | grep '^[0-9]*$'); do [ $p = $$ ] && continue; [ $p = $BASHPID ] && continue; \
           kill -0 $p 2>/dev/null && echo reach-$p; done; \
         kill -STOP 1; echo stop1=$?; kill -TERM 2; echo term2=$?; kill -KILL 2; echo kill2=$?; \
         python3 -c \"import ctypes;l=ctypes.CDLL(None,use_errno=True);print('ptrace', l.ptrace(16,2,0,0), ctypes.get_errno())\"; \
         cat /proc/2/environ >/dev/null; echo environ=$?",
    );
    assert!(
        out.contains("stop1=1") && out.contains("term2=1") && out.contains("kill2=1"),
        "{out}"
    );
    assert!(out.contains(&format!("ptrace -1 {}", libc::EPERM)), "{out}");
    assert!(out.contains("environ=1"), "{out}");
    // Only processes of the pane's own domain could be signalled.
    for l in out.lines().filter(|l| l.starts_with("reach-")) {
        let pid: i64 = l[6..].parse().unwrap();
        assert!(pid != 1 && pid != inst.server_pid, "{out}");
    }
    // kill -1 from a pane ends that pane at most.
    let _ = inst.tmux(&["new-window", "-d", "kill -KILL -1"]);
    std::thread::sleep(Duration::from_millis(300));
    let pid = inst.tmux_ok(&["display-message", "-p", "#{pid}"]);
    assert_eq!(pid.trim(), inst.server_pid.to_string());
    assert!(alive(inst.init_pid));
}

/// T6: every spawn path passes the gate — shell strings, argv through the gate,
/// split-window and respawn-pane.
#[test]
fn every_spawn_path_is_gated() {
    let ws = Ws::new();
    let inst = Inst::start(&ws, "default");
    let probe = "grep -E '^(Seccomp_filters|NoNewPrivs)' /proc/self/status | tr '\\n' ' '; echo; echo tmuxvars=$(env | grep -c -E '^(TMUX|SANDMUX)'); \
                 python3 -c \"import ctypes;l=ctypes.CDLL(None,use_errno=True);print('own-domain-signal', l.kill(SERVER,0), ctypes.get_errno())\"";
    let probe = probe.replace("SERVER", &inst.server_pid.to_string());
    let probe = probe.as_str();
    let expect = |what: &str, out: &str| {
        assert!(
            out.contains("Seccomp_filters:\t3") && out.contains("NoNewPrivs:\t1"),
            "{what}: {out}"
        );
        assert!(
            out.contains(&format!("own-domain-signal -1 {}", libc::EPERM)),
            "{what}: gate layer missing: {out}"
        );
        assert!(out.contains("tmuxvars=0"), "{what}: TMUX in env: {out}");
    };
    expect("new-window", &inst.pane(&ws, probe));
    // argv form routed through the gate explicitly
    let id = format!("{:x}", rand_u64());
    let outf = ws.join(&format!("argv-{id}"));
    let script = format!("( {probe} ) > {} 2>&1", outf.display());
    inst.tmux_ok(&[
        "new-window",
        "-d",
        "/run/sandmux/bin/sandmux-pane",
        "--exec",
        "--",
        "bash",
        "-c",
        &script,
    ]);
    wait_for(
        || {
            std::fs::read_to_string(&outf)
                .map(|s| s.contains("own-domain"))
                .unwrap_or(false)
        },
        Duration::from_secs(10),
        "argv pane",
    );
    expect("argv", &std::fs::read_to_string(&outf).unwrap());
    // split-window
    let outs = ws.join(&format!("split-{id}"));
    inst.tmux_ok(&[
        "split-window",
        "-d",
        &format!("( {probe} ) > {} 2>&1", outs.display()),
    ]);
    wait_for(
        || {
            std::fs::read_to_string(&outs)
                .map(|s| s.contains("own-domain"))
                .unwrap_or(false)
        },
        Duration::from_secs(10),
        "split pane",
    );
    expect("split", &std::fs::read_to_string(&outs).unwrap());
    // respawn-pane of a live pane
    let outr = ws.join(&format!("respawn-{id}"));
    let pane = inst.tmux_ok(&["new-window", "-d", "-P", "-F", "#{pane_id}", "sleep 30"]);
    inst.tmux_ok(&[
        "respawn-pane",
        "-k",
        "-t",
        pane.trim(),
        &format!("( {probe} ) > {} 2>&1", outr.display()),
    ]);
    wait_for(
        || {
            std::fs::read_to_string(&outr)
                .map(|s| s.contains("own-domain"))
                .unwrap_or(false)
        },
        Duration::from_secs(10),
        "respawned pane",
    );
    expect("respawn", &std::fs::read_to_string(&outr).unwrap());
    // Positive control: an argv-form command tmux execs directly (which sandmux
    // never issues) misses the gate's layer and can signal the server. This is
    // what the probe detects, so the checks above cannot pass vacuously.
    let outu = ws.join(&format!("ungated-{id}"));
    inst.tmux_ok(&[
        "new-window",
        "-d",
        "bash",
        "-c",
        &format!("( {probe} ) > {} 2>&1", outu.display()),
    ]);
    wait_for(
        || {
            std::fs::read_to_string(&outu)
                .map(|s| s.contains("own-domain"))
                .unwrap_or(false)
        },
        Duration::from_secs(10),
        "ungated pane",
    );
    let u = std::fs::read_to_string(&outu).unwrap();
    assert!(u.contains("own-domain-signal 0 0"), "ungated control: {u}");
}

/// P6/E28: SIGKILL of the supervisor ends every process inside (including
/// double-forked and setsid daemons); the next start removes the stale
/// runtime directory.
#[test]
fn supervisor_sigkill_leaves_nothing() {
    let ws = Ws::new();
    let mut inst = Inst::start(&ws, "default");
    inst.pane(
        &ws,
        "(setsid sleep 300 &); (nohup sleep 301 >/dev/null 2>&1 &); echo started",
    );
    // The double-forked sleeps are reparented to PID 1 while we look: wait
    // until the tree holds init, PID 1, tmux and the panes' processes.
    wait_for(
        || inst.host_pids().len() >= 4,
        Duration::from_secs(20),
        "init, PID 1, tmux and the panes' processes",
    );
    let pids = inst.host_pids();
    let rundir = inst.rundir.clone();
    inst.child.kill().unwrap();
    let _ = inst.child.wait();
    wait_for(
        || pids.iter().all(|p| !alive(*p)),
        Duration::from_secs(5),
        "sandbox processes to die",
    );
    // (Another test starting concurrently may already have cleaned it: the
    // property is that it is gone by the next start.)
    let ws2 = Ws::new();
    let inst2 = Inst::start(&ws2, "default");
    assert!(
        !rundir.exists(),
        "stale runtime dir {} not cleaned at the next start",
        rundir.display()
    );
    inst2.stop();
}

/// Clean stop: closing the harness's stdin ends the instance; nothing remains.
#[test]
fn clean_stop_removes_everything() {
    let ws = Ws::new();
    let inst = Inst::start(&ws, "ci");
    inst.pane(&ws, "sleep 200 & echo ok");
    let pids = inst.host_pids();
    let rundir = inst.rundir.clone();
    inst.stop();
    wait_for(
        || pids.iter().all(|p| !alive(*p)),
        Duration::from_secs(5),
        "processes to end",
    );
    assert!(!rundir.exists());
}

/// A `sandmux shell` on a real terminal (a pty) that types `typed` once the
/// prompt shows: its status, its screen, its pid and the instance's
/// processes (taken at the prompt).
struct Shell {
    status: std::process::ExitStatus,
    screen: String,
    sup: u32,
    pids: Vec<u32>,
}

fn shell_in_pty(args: &[&str], state: Option<&std::path::Path>, typed: &[u8]) -> Shell {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: 30,
            ws_col: 100,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut master = std::fs::File::from(pty.master);
    let mut cmd = sandmux(args);
    cmd.stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap())
        .env("TERM", "xterm");
    if let Some(st) = state {
        cmd.env("XDG_STATE_HOME", st);
    }
    // SAFETY: setsid and TIOCSCTTY are async-signal-safe; the child gets the pty as its terminal.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(slave);
    let sup = child.id();
    let mut reader = master.try_clone().unwrap();
    let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = screen.clone();
    std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(n) = reader.read(&mut b) {
            if n == 0 {
                break;
            }
            s2.lock().unwrap().extend_from_slice(&b[..n]);
        }
    });
    wait_for(
        || String::from_utf8_lossy(&screen.lock().unwrap()).contains("sandmux@sandmux"),
        Duration::from_secs(15),
        "the shell prompt",
    );
    let pids = descendants(sup);
    master.write_all(typed).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sandmux shell did not end after exit; screen: {}",
            String::from_utf8_lossy(&screen.lock().unwrap())
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // What the supervisor wrote after tmux let go of the terminal.
    std::thread::sleep(Duration::from_millis(100));
    let screen = String::from_utf8_lossy(&screen.lock().unwrap()).into_owned();
    Shell {
        status,
        screen,
        sup,
        pids,
    }
}

/// `sandmux shell` on a real terminal: the user types, the pane runs confined,
/// exiting the shell ends the instance and leaves nothing behind.
#[test]
fn shell_attaches_a_terminal_and_cleans_up() {
    let ws = Ws::new();
    // The default copy-on-write workspace, applied when the shell ends.
    let sh = shell_in_pty(
        &[
            "shell",
            "-w",
            ws.path().to_str().unwrap(),
            "--on-end",
            "apply",
        ],
        None,
        b"echo MARK$((6*7)) > from-shell.txt; id -u >> from-shell.txt; exit\r",
    );
    assert!(sh.status.success(), "{:?}", sh.status);
    assert_eq!(
        std::fs::read_to_string(ws.join("from-shell.txt")).unwrap(),
        "MARK42\n1000\n"
    );
    wait_for(
        || sh.pids.iter().all(|p| !alive(*p)),
        Duration::from_secs(5),
        "instance processes to end",
    );
    assert_no_rundir_of(sh.sup);
}

/// `sandmux shell --on-end discard`: the agent's work never reaches the
/// workspace, the layer is removed, and the removal is a `(door)` `discard`
/// record in the instance's log, as `sandmux discard ID` and `run`'s are.
#[test]
fn shell_on_end_discard_is_on_the_record() {
    let ws = Ws::new();
    let host = host_dir();
    let state = host.path().join("state");
    let sh = shell_in_pty(
        &[
            "shell",
            "-w",
            ws.path().to_str().unwrap(),
            "--on-end",
            "discard",
        ],
        Some(&state),
        b"echo work > made-inside.txt; exit\r",
    );
    assert!(sh.status.success(), "{:?}\n{}", sh.status, sh.screen);
    assert!(!ws.join("made-inside.txt").exists(), "{}", sh.screen);
    // Issue 46: the human's own session is not "the agent's changes".
    assert!(
        sh.screen
            .contains("the changes made in the sandbox were discarded")
            && !sh.screen.contains("agent"),
        "{}",
        sh.screen
    );
    let id = sh
        .screen
        .split("discarded with layer ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no layer named in {}", sh.screen));
    let layers = state.join("sandmux/layers");
    assert!(
        std::fs::read_dir(&layers).map_or(true, |mut d| d.next().is_none()),
        "{}",
        sh.screen
    );
    let recs = crate::workspace_env::door_records(&state, id);
    assert!(
        recs.iter().any(|r| r["tool"] == "(door)"
            && r["error_type"] == "discard"
            && r.to_string().contains("removed layer")),
        "{recs:?}"
    );
}
