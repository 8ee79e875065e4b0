//! The live probe: runs inside a real sandboxed tmux pane (`sandmux-pane
//! --probe`) and tries what an agent would try. Each observation records what
//! the kernel answered; the supervisor prints them as they are.

use super::plan::GateConfig;
use crate::profile::NetMode;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Marker lines framing the probe's JSON in the pane output.
pub(crate) const BEGIN: &str = "SANDMUX-PROBE-BEGIN";
/// See [`BEGIN`].
pub(crate) const END: &str = "SANDMUX-PROBE-END";

/// One thing the probe tried.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Observation {
    /// Short name.
    pub name: String,
    /// Whether the result is what the profile promises.
    pub passed: bool,
    /// What the kernel answered.
    pub observed: String,
}

fn errno_of(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let errno = nix::errno::Errno::from_raw(n);
            format!("{errno:?} ({})", errno.desc())
        }
        None => e.to_string(),
    }
}

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

fn obs(name: &str, passed: bool, observed: impl Into<String>) -> Observation {
    Observation {
        name: name.into(),
        passed,
        observed: observed.into(),
    }
}

fn try_create(p: &Path) -> Result<(), std::io::Error> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p)
        .map(|_| ())?;
    let _ = std::fs::remove_file(p);
    Ok(())
}

/// Runs every probe (the sandbox's own directory is `g.own`:
/// `/run/sandmux` in the mount view).
pub(crate) fn run(g: &GateConfig) -> Vec<Observation> {
    let own = g.own.dir.as_path();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut v = identity(g, &status);
    v.push(pid_view(&pids));
    v.push(hostname(g));
    v.extend(writes(g, own));
    v.extend(protected_paths(g));
    v.extend(secrets());
    v.push(tcp_probe(g));
    v.extend(tmux_socket(own));
    v.extend(server_reach(&pids));
    v.extend(signal_pid1());
    v.push(tiocsti_probe());
    v.extend(kernel_refusals());
    v.extend(environment(g));
    v
}

/// Who the probe is: uid, no_new_privs, capabilities, seccomp.
fn identity(g: &GateConfig, status: &str) -> Vec<Observation> {
    let mut v = Vec::new();
    let uid = nix::unistd::getuid().as_raw();
    v.push(obs(
        "identity",
        uid != 0 && uid == g.identity.uid,
        format!("uid {uid}, gid {}", nix::unistd::getgid()),
    ));

    let nnp = status_field(status, "NoNewPrivs:");
    v.push(obs(
        "no_new_privs",
        nnp == "1",
        format!("NoNewPrivs: {nnp}"),
    ));

    let caps: Vec<String> = ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"]
        .iter()
        .map(|k| format!("{k} {}", status_field(status, k)))
        .collect();
    let all_zero = caps.iter().all(|c| c.ends_with("0000000000000000"));
    v.push(obs("capabilities", all_zero, caps.join(", ")));

    let filters: u32 = status_field(status, "Seccomp_filters:")
        .parse()
        .unwrap_or(0);
    let mode = status_field(status, "Seccomp:");
    v.push(obs(
        "seccomp",
        mode == "2" && filters >= 3,
        format!("Seccomp: {mode}, Seccomp_filters: {filters}"),
    ));

    v
}

/// How many processes are visible, and that PID 1 is sandmux's.
fn pid_view(pids: &[u32]) -> Observation {
    let pid1 = std::fs::read_to_string("/proc/1/cmdline")
        .map(|s| s.replace('\0', " "))
        .unwrap_or_else(|e| errno_of(&e));
    obs(
        "pid_view",
        pids.len() < 64 && pid1.contains("sandmux"),
        format!("{} processes visible; PID 1: {}", pids.len(), pid1.trim()),
    )
}

/// The sandbox's hostname.
fn hostname(g: &GateConfig) -> Observation {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    obs("hostname", host == g.identity.hostname, host)
}

/// Writes outside the workspace fail; inside it they work.
fn writes(g: &GateConfig, own: &Path) -> Vec<Observation> {
    let mut v = Vec::new();
    let mut outside = Vec::new();
    let mut all_refused = true;
    let mine = [own.join(".sandmux-probe"), own.join("sock/.sandmux-probe")];
    let fixed = ["/etc", "/usr", "/"].map(|d| Path::new(d).join(".sandmux-probe"));
    for p in fixed.iter().chain(&mine) {
        match try_create(p) {
            Ok(()) => {
                all_refused = false;
                outside.push(format!("{}: CREATED", p.display()));
            }
            Err(e) => outside.push(format!("{}: {}", p.display(), errno_of(&e))),
        }
    }
    v.push(obs(
        "write_outside_workspace",
        all_refused,
        outside.join("; "),
    ));

    let ws_probe = g
        .workspace
        .join(format!(".sandmux-probe-{}", std::process::id()));
    match try_create(&ws_probe) {
        Ok(()) => v.push(obs(
            "write_workspace",
            true,
            format!("{}: created and removed", g.workspace.display()),
        )),
        Err(e) => v.push(obs("write_workspace", false, errno_of(&e))),
    }

    v
}

/// Protected paths are read-only.
fn protected_paths(g: &GateConfig) -> Vec<Observation> {
    let mut v = Vec::new();
    let mut prot = Vec::new();
    let mut prot_ok = true;
    for p in &g.protected {
        let target = if p.is_dir() {
            p.join(".sandmux-probe")
        } else {
            p.clone()
        };
        let r = if p.is_dir() {
            try_create(&target)
        } else {
            std::fs::OpenOptions::new()
                .append(true)
                .open(&target)
                .map(|_| ())
        };
        match r {
            Ok(()) => {
                prot_ok = false;
                prot.push(format!("{}: WRITABLE", p.display()));
            }
            Err(e) => prot.push(format!("{}: {}", p.display(), errno_of(&e))),
        }
    }
    if prot.is_empty() {
        prot.push("no protected path exists in this workspace".into());
    }
    v.push(obs("protected_paths", prot_ok, prot.join("; ")));

    v
}

/// Secrets are masked or absent.
fn secrets() -> Vec<Observation> {
    let mut v = Vec::new();
    let shadow = match std::fs::read("/etc/shadow") {
        Ok(b) if b.is_empty() => (true, "/etc/shadow: masked (empty)".to_string()),
        Ok(b) => (false, format!("/etc/shadow: READ {} bytes", b.len())),
        Err(e) => (true, format!("/etc/shadow: {}", errno_of(&e))),
    };
    let home = match std::fs::read_dir("/root") {
        Ok(rd) => {
            let n = rd.count();
            (n == 0, format!("/root: {n} entries"))
        }
        Err(e) => (true, format!("/root: {}", errno_of(&e))),
    };
    v.push(obs(
        "read_secrets",
        shadow.0 && home.0,
        format!("{}; {}", shadow.1, home.1),
    ));

    v
}

/// The tmux socket cannot be reached by path.
fn tmux_socket(own: &Path) -> Vec<Observation> {
    let mut v = Vec::new();
    let path = own.join("sock/tmux.sock");
    let sock = std::os::unix::net::UnixStream::connect(&path);
    let p = path.display();
    v.push(match sock {
        Ok(_) => obs("tmux_socket", false, format!("{p}: CONNECTED")),
        Err(e) => obs("tmux_socket", true, format!("{p}: {}", errno_of(&e))),
    });

    v
}

/// The tmux server's /proc entries and signals are out of reach.
fn server_reach(pids: &[u32]) -> Vec<Observation> {
    let mut v = Vec::new();
    let server = pids.iter().copied().find(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm"))
            .map(|c| c.trim() == "tmux: server")
            .unwrap_or(false)
    });
    match server {
        Some(pid) => {
            // Listing the numbers is allowed (same uid); following any of them needs
            // ptrace access, which the nested Landlock domain denies.
            let mut fd = String::new();
            let mut listed = false;
            let entries: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            for n in &entries {
                let p = format!("/proc/{pid}/fd/{n}");
                if let Ok(t) = std::fs::read_link(&p) {
                    fd = format!("LISTED {p} -> {}", t.display());
                    listed = true;
                    break;
                }
                if std::fs::File::open(&p).is_ok() {
                    fd = format!("LISTED {p} opened");
                    listed = true;
                    break;
                }
            }
            if fd.is_empty() {
                fd = match entries.first() {
                    Some(n) => format!(
                        "readlink/open /proc/{pid}/fd/{n}..: {}",
                        errno_of(&std::fs::read_link(format!("/proc/{pid}/fd/{n}")).unwrap_err())
                    ),
                    None => "no fds visible".into(),
                };
            }
            let resolved = std::fs::read_link(format!("/proc/{pid}/root"));
            let root = match &resolved {
                Ok(p) => format!("RESOLVED {}", p.display()),
                Err(e) => errno_of(e),
            };
            let sig = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                None::<nix::sys::signal::Signal>,
            );
            let sig_s = match sig {
                Ok(()) => "SIGNAL DELIVERED".to_string(),
                Err(e) => format!("{e}"),
            };
            let passed = !listed && resolved.is_err() && sig.is_err();
            v.push(obs(
                "tmux_server_reach",
                passed,
                format!("server pid {pid}: /proc fd: {fd}; /proc root: {root}; kill(0): {sig_s}"),
            ));
        }
        None => v.push(obs("tmux_server_reach", true, "no tmux server visible")),
    }

    v
}

/// PID 1 cannot be signalled.
fn signal_pid1() -> Vec<Observation> {
    let mut v = Vec::new();
    let s1 = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(1),
        None::<nix::sys::signal::Signal>,
    );
    v.push(obs(
        "signal_pid1",
        s1.is_err(),
        match s1 {
            Ok(()) => "SIGNAL DELIVERED".to_string(),
            Err(e) => e.to_string(),
        },
    ));

    v
}

/// New user namespaces and mounts are refused.
fn kernel_refusals() -> Vec<Observation> {
    let mut v = Vec::new();
    let un = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER);
    v.push(obs(
        "unshare_user",
        un.is_err(),
        match un {
            Ok(()) => "CREATED A USER NAMESPACE".to_string(),
            Err(e) => e.to_string(),
        },
    ));

    let m = nix::mount::mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    v.push(obs(
        "mount",
        m.is_err(),
        match m {
            Ok(()) => "MOUNTED".to_string(),
            Err(e) => e.to_string(),
        },
    ));

    v
}

/// Only allowlisted variables are in the environment.
fn environment(g: &GateConfig) -> Vec<Observation> {
    let mut v = Vec::new();
    let names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    let allowed = |n: &str| {
        g.environment.set.contains_key(n)
            || n == "PATH"
            || n == "PWD"
            || n == "SHLVL"
            || n == "_"
            || g.environment
                .keep
                .iter()
                .any(|k| match k.strip_suffix('*') {
                    Some(p) => n.starts_with(p),
                    None => n == k,
                })
    };
    let extra: Vec<&String> = names.iter().filter(|n| !allowed(n)).collect();
    v.push(obs(
        "environment",
        extra.is_empty(),
        if extra.is_empty() {
            format!("only allowlisted: {}", names.join(","))
        } else {
            format!("UNEXPECTED: {extra:?}")
        },
    ));
    v
}

fn tcp_probe(g: &GateConfig) -> Observation {
    use std::net::{SocketAddr, TcpStream};
    // Port 9 (discard) on loopback: never a real service, never off this machine.
    let addr: SocketAddr = "127.0.0.1:9".parse().expect("literal address");
    let r = TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(500));
    let observed = match &r {
        Ok(_) => "CONNECTED".to_string(),
        Err(e) => errno_of(e),
    };
    let code = r.as_ref().err().and_then(|e| e.raw_os_error());
    let passed = match g.net.mode {
        // A refused connect alone cannot tell the sandbox's loopback from
        // the host's: the namespace must also have no interface but `lo`.
        NetMode::None | NetMode::Loopback | NetMode::Proxy if !only_loopback() => false,
        NetMode::None | NetMode::Loopback | NetMode::Proxy => {
            code == Some(libc::ECONNREFUSED) || r.is_ok()
        }
        NetMode::Host => {
            if g.net.connect_tcp.contains(&9) {
                true
            } else {
                matches!(code, Some(libc::EACCES) | Some(libc::EPERM))
            }
        }
    };
    obs(
        "tcp_connect",
        passed,
        format!(
            "mode {}: 127.0.0.1:9: {observed}{}",
            g.net.mode.name(),
            if g.net.mode != NetMode::Host && !only_loopback() {
                "; interfaces besides lo are visible (not the sandbox's own network namespace)"
            } else {
                ""
            }
        ),
    )
}

/// Whether this network namespace has no interface but `lo`
/// (`/proc/net/dev` lists the namespace's own).
fn only_loopback() -> bool {
    std::fs::read_to_string("/proc/net/dev").is_ok_and(|t| {
        t.lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .all(|n| n.trim() == "lo")
    })
}

fn tiocsti_probe() -> Observation {
    let mut results = Vec::new();
    let mut ok = true;
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty");
    let mut fds: Vec<(String, i32)> = (0..3).map(|f| (format!("fd {f}"), f)).collect();
    if let Ok(t) = &tty {
        fds.push(("/dev/tty".into(), t.as_raw_fd()));
    }
    for (name, fd) in fds {
        for (label, req) in [
            ("", super::seccomp::TIOCSTI),
            (" high bits", super::seccomp::TIOCSTI | (1u64 << 32)),
        ] {
            let c: u8 = b'#';
            // SAFETY: TIOCSTI reads one byte from the pointer we pass; fd may be invalid (EBADF).
            let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, req, &c as *const u8) };
            let e = std::io::Error::last_os_error();
            if r == 0 {
                ok = false;
                results.push(format!("{name}{label}: INJECTED"));
            } else {
                results.push(format!("{name}{label}: {}", errno_of(&e)));
            }
        }
    }
    obs("tiocsti", ok, results.join("; "))
}

/// Runs the probe and prints the framed JSON on stdout.
pub(crate) fn run_and_print(g: &GateConfig) {
    let obs = run(g);
    let json = serde_json::to_string(&obs).unwrap_or_else(|_| "[]".into());
    // ASCII only, so the terminal passes it through unchanged.
    let ascii: String = json
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .collect();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n{BEGIN}\n{ascii}\n{END}");
    let _ = out.flush();
}
