//! Tmux mode without a mount namespace: the sandbox's own files on the host.
//!
//! Where a container runtime refuses namespaces (docker's default seccomp
//! profile), there is no `/run/sandmux`. Started as root, PID 1 then keeps
//! the generation's files in a host directory of its own (`Rundir::host_view`:
//! `v` in the instance's view directory in the temporary directory, so every
//! uid can traverse to it) that only root can write, and everything confined
//! runs as an unprivileged uid (`uid`), so file permissions keep the socket
//! out of reach:
//!
//! - `<dir>/` root's, 0755: `tmux.conf` and `gate.json` (0644, read-only to
//!   the sandbox), `bin/sandmux-pane` a link to the sandmux binary (the gate;
//!   tmux names it in `argv[0]`);
//! - `<dir>/sock/` the tmux server's (the dropped uid's) until the server
//!   listens, then root's and 0700 ([`cover`]): no confined process can reach
//!   the socket by path any more, as in the mount view;
//! - `<rundir>/sock/tmux.sock`, where the supervisor and the operator
//!   commands connect, a link to `<dir>/sock/tmux.sock`.
//!
//! The supervisor removes the directory with the runtime directory.

use super::plan::GateConfig;
use super::plan::HostView;
use super::uid::Target;
use super::Plan;
use nix::unistd::AccessFlags;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the host view could not be made, kept or checked. Each says what to
/// do where there is something to do.
#[derive(Debug, thiserror::Error)]
pub(super) enum HostViewError {
    #[error("no binary for the gate")]
    NoGateBinary,
    #[error("no socket directory")]
    NoSocketDir,
    #[error("link {} to {}: {source}", .from.display(), .to.display())]
    Link {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    GateConfig(#[from] serde_json::Error),
    #[error("reading {what}: {source}")]
    Reading {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("tmux mode without a mount namespace keeps its socket from the sandbox by uid {uid}, and other processes run as that uid (pids {pids}): end them, or give this profile a [sandbox] uid of its own (with a workspace that root owns)")]
    NotAlone { uid: u32, pids: String },
    #[error("tmux mode without a mount namespace keeps its socket in {}, which uid {me} cannot reach ({source}): set TMPDIR to a directory every user can traverse", .dir.display())]
    SocketOutOfReach {
        dir: PathBuf,
        me: nix::unistd::Uid,
        source: nix::Error,
    },
    #[error("the pane gate is the sandmux binary {}, which uid {me} cannot run ({source}): install sandmux where every user can run it (e.g. /usr/local/bin)", .exe.display())]
    GateOutOfReach {
        exe: PathBuf,
        me: nix::unistd::Uid,
        source: nix::Error,
    },
    #[error("{connections} connection(s) reached the tmux socket before its directory was closed: another process runs as the sandbox's uid (another sandbox, or one left behind); end it, or give this profile its own [sandbox] uid")]
    Reached { connections: usize },
    #[error("{what} {}: {source}", .path.display())]
    Sys {
        what: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("{} is not a socket: a process of the sandbox's uid replaced it before its directory was closed", .0.display())]
    NotASocket(PathBuf),
    #[error("the tmux socket has {names} names, or its name was moved: another process of the sandbox's uid reached it before its directory was closed; end it, or give this profile its own [sandbox] uid")]
    Renamed { names: libc::nlink_t },
    #[error("the socket's path is not UTF-8")]
    NotUtf8,
    #[error("{} has characters other than letters, digits and /._-: set TMPDIR to a plain path", .0.display())]
    NotPlain(PathBuf),
    /// A file operation: `chmod 0700`, `chmod 0600`, `mkdir`, `write`.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("chown {uid}:{gid} {}: {source}", .path.display())]
    Chown {
        uid: u32,
        gid: u32,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, HostViewError>;

/// A file operation's error on `path`.
fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> HostViewError {
    let path = path.to_path_buf();
    move |source| HostViewError::Io { what, path, source }
}

/// A link's error.
fn link(from: &Path, to: &Path) -> impl FnOnce(std::io::Error) -> HostViewError {
    let (from, to) = (from.to_path_buf(), to.to_path_buf());
    move |source| HostViewError::Link { from, to, source }
}

/// Makes the directory and its files for `hv`, the socket directory `to`'s.
pub(super) fn make(plan: &Plan, hv: &HostView, to: Target) -> Result<()> {
    let p = &hv.paths;
    plain(&p.run_dir)?;
    dir(&p.run_dir, 0o755)?;
    dir(&p.run_dir.join("bin"), 0o755)?;
    let exe = hv.own.exe.as_deref().ok_or(HostViewError::NoGateBinary)?;
    std::os::unix::fs::symlink(exe, &p.gate).map_err(link(&p.gate, exe))?;
    let conf = plan.run_files.tmux_conf.as_deref().unwrap_or_default();
    let conf = format!(
        "{conf}\n# No mount view: the gate is in this instance's host directory.\nset -g default-shell {}\n",
        p.gate.display()
    );
    file(&p.tmux_conf, conf.as_bytes())?;
    let gate = GateConfig::of(&plan.blueprint, Some(hv));
    let json = serde_json::to_vec(&gate)?;
    file(&p.gate_config, &json)?;
    if let Some((bundle, ca)) = &plan.run_files.ca {
        // No mount view: clients find the CA through the variables only.
        file(&p.run_dir.join(super::plan::CA_BUNDLE), bundle.as_bytes())?;
        file(&p.run_dir.join(super::plan::CA), ca.as_bytes())?;
    }
    let sock = p.socket.parent().ok_or(HostViewError::NoSocketDir)?;
    dir(sock, 0o700)?;
    chown(sock, to.uid, to.gid)?;
    let host_sock = plan.rundir.join("sock/tmux.sock");
    std::os::unix::fs::symlink(&p.socket, &host_sock).map_err(link(&host_sock, &p.socket))
}

/// Before the server starts: no other process may run as `uid` (but the
/// relay, `except`). Until the cover, the socket is that uid's to reach;
/// with no process of it but the tmux server, nobody can (only root can
/// start one). A leftover sandbox, another instance with the same sandbox
/// uid or the workspace owner's own processes end start-up here.
pub(super) fn alone(uid: u32, except: &[u32]) -> Result<()> {
    let others: Vec<String> = std::fs::read_dir("/proc")
        .map_err(|source| HostViewError::Reading {
            what: "/proc",
            source,
        })?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !except.contains(pid) && runs_as(*pid, uid))
        .map(|pid| pid.to_string())
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(HostViewError::NotAlone {
        uid,
        pids: others.join(", "),
    })
}

/// Whether a live (not zombie) process has `uid` as any of its uids.
fn runs_as(pid: u32, uid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("");
    let zombie = field("State:").trim_start().starts_with('Z');
    let want = uid.to_string();
    !zombie && field("Uid:").split_whitespace().any(|u| u == want)
}

/// In the payload, once it runs as the dropped uid: that uid can make the
/// socket and run the gate (the kernel checks, not a reading of modes).
pub(super) fn check_reach(hv: &HostView) -> Result<()> {
    let p = &hv.paths;
    let me = nix::unistd::getuid();
    let sock = p.socket.parent().unwrap_or(&p.socket);
    nix::unistd::access(sock, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|source| {
        HostViewError::SocketOutOfReach {
            dir: sock.to_path_buf(),
            me,
            source,
        }
    })?;
    nix::unistd::access(&p.gate, AccessFlags::X_OK).map_err(|source| {
        let exe = hv.own.exe.as_deref().unwrap_or(&p.gate);
        HostViewError::GateOutOfReach {
            exe: exe.to_path_buf(),
            me,
            source,
        }
    })
}

/// Once the server listens: the socket directory becomes root's, 0700,
/// and the socket root's, 0600. Until then any process of the dropped uid could connect (a sandbox of
/// another instance with the same uid, one left by an earlier generation)
/// and keep its connection: a socket with any connection but the listener
/// itself ends start-up.
pub(super) fn cover(sock: &Path) -> Result<()> {
    let dir = sock.parent().ok_or(HostViewError::NoSocketDir)?;
    chown(dir, 0, 0)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod 0700", dir))?;
    close_socket(sock)?;
    match sockets_at(sock)? {
        1 => Ok(()),
        n => Err(HostViewError::Reached {
            connections: n.saturating_sub(1),
        }),
    }
}

/// The socket itself becomes root's 0600: a hard link or an `O_PATH`
/// descriptor taken before the cover would otherwise still reach it
/// (connecting needs write permission on the socket, whatever the name).
/// Done through a descriptor of the name opened without following a link,
/// which must be a socket with this one name.
fn close_socket(sock: &Path) -> Result<()> {
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::{fstat, Mode, SFlag};
    let at = |what: &'static str, source: nix::Error| HostViewError::Sys {
        what,
        path: sock.to_path_buf(),
        source,
    };
    let fd = nix::fcntl::open(
        sock,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| at("open", e))?;
    let st = fstat(&fd).map_err(|e| at("fstat", e))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
        return Err(HostViewError::NotASocket(sock.to_path_buf()));
    }
    nix::unistd::fchownat(
        &fd,
        "",
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(0)),
        AtFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| at("chown", e))?;
    let by_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    std::fs::set_permissions(&by_fd, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod 0600", sock))?;
    let st = fstat(&fd).map_err(|e| at("fstat", e))?;
    let now = std::fs::symlink_metadata(sock).map_err(|source| HostViewError::Stat {
        path: sock.to_path_buf(),
        source,
    })?;
    if st.st_nlink != 1 || now.ino() != st.st_ino || now.dev() != st.st_dev {
        return Err(HostViewError::Renamed { names: st.st_nlink });
    }
    Ok(())
}

/// How many Unix sockets in this network namespace have `path` as their
/// address: the listener, and one per connection made to it, accepted or
/// still queued (`/proc/net/unix`).
fn sockets_at(path: &Path) -> Result<usize> {
    let text =
        std::fs::read_to_string("/proc/net/unix").map_err(|source| HostViewError::Reading {
            what: "/proc/net/unix",
            source,
        })?;
    let want = path.to_str().ok_or(HostViewError::NotUtf8)?;
    Ok(text
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(7) == Some(want))
        .count())
}

/// The paths go into tmux's configuration unquoted: only plain characters.
fn plain(p: &Path) -> Result<()> {
    let ok = p.to_str().is_some_and(|s| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(HostViewError::NotPlain(p.to_path_buf()))
    }
}

/// A fresh directory (never an existing one: the name is this instance's).
fn dir(p: &Path, mode: u32) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(p)
        .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)))
        .map_err(io("mkdir", p))
}

/// A fresh file, 0644.
fn file(p: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .and_then(|mut f| {
            f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            f.write_all(bytes)
        })
        .map_err(io("write", p))
}

fn chown(p: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).map_err(|source| HostViewError::Chown {
        uid,
        gid,
        path: p.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn a_second_name_for_the_socket_ends_start_up_and_the_socket_becomes_roots() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown to root needs root (the 65534 run skips this one)
        }
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let base = tempfile::tempdir().unwrap();
        let fresh = |name: &str| {
            let d = base.path().join(name).join("sock");
            std::fs::create_dir_all(&d).unwrap();
            std::os::unix::fs::lchown(&d, Some(65534), Some(65534)).unwrap();
            let sock = d.join("tmux.sock");
            let l = UnixListener::bind(&sock).unwrap();
            std::os::unix::fs::lchown(&sock, Some(65534), Some(65534)).unwrap();
            (sock, l)
        };
        // Linked before the cover (as a process of the uid could): refused.
        let (sock, _l) = fresh("a");
        std::fs::hard_link(&sock, base.path().join("a/kept")).unwrap();
        let e = super::cover(&sock).unwrap_err().to_string();
        assert!(e.contains("2 names"), "{e}");
        // Its name swapped for a link to it: refused, and the link's target
        // is not touched (root's chmod does not follow it).
        let (sock, _l) = fresh("c");
        let real = base.path().join("c/real");
        std::fs::rename(&sock, &real).unwrap();
        std::os::unix::fs::symlink(&real, &sock).unwrap();
        let e = super::cover(&sock).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::symlink_metadata(&real).unwrap().uid(), 65534);
        // Control: the same socket without the link is covered: root's,
        // 0600, in a root 0700 directory.
        let (sock, _l) = fresh("b");
        super::cover(&sock).unwrap();
        let m = std::fs::symlink_metadata(&sock).unwrap();
        assert_eq!((m.uid(), m.permissions().mode() & 0o777), (0, 0o600));
        let d = std::fs::metadata(sock.parent().unwrap()).unwrap();
        assert_eq!((d.uid(), d.permissions().mode() & 0o777), (0, 0o700));
    }

    #[test]
    fn another_process_of_the_uid_is_seen_and_zombies_and_exceptions_are_not() {
        let me = nix::unistd::getuid().as_raw();
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let e = super::alone(me, &[std::process::id()])
            .unwrap_err()
            .to_string();
        assert!(e.contains(&c.id().to_string()), "{e}");
        let _ = c.kill();
        let _ = c.wait();
        // Control: a uid no process has.
        super::alone(3_999_998, &[]).unwrap();
    }

    /// The typed errors read as the messages did before them (the start-up
    /// report and the tests compare text).
    #[test]
    fn the_errors_read_as_before() {
        use super::HostViewError as E;
        let p = std::path::PathBuf::from("/tmp/v/sock");
        let gone = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let cases = [
            (E::NoSocketDir.to_string(), "no socket directory".to_string()),
            (
                E::Reached { connections: 2 }.to_string(),
                "2 connection(s) reached the tmux socket before its directory was closed: another process runs as the sandbox's uid (another sandbox, or one left behind); end it, or give this profile its own [sandbox] uid".into(),
            ),
            (
                super::io("chmod 0700", &p)(gone()).to_string(),
                format!("chmod 0700 /tmp/v/sock: {}", gone()),
            ),
            (
                E::Chown { uid: 0, gid: 0, path: p.clone(), source: gone() }.to_string(),
                format!("chown 0:0 /tmp/v/sock: {}", gone()),
            ),
            (
                E::Stat { path: p.clone(), source: gone() }.to_string(),
                format!("/tmp/v/sock: {}", gone()),
            ),
            (
                E::Sys { what: "fstat", path: p.clone(), source: nix::Error::ENOENT }.to_string(),
                format!("fstat /tmp/v/sock: {}", nix::Error::ENOENT),
            ),
            (
                super::link(&p, std::path::Path::new("/x"))(gone()).to_string(),
                format!("link /tmp/v/sock to /x: {}", gone()),
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_connection_to_the_socket_is_seen_queued_or_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tmux.sock");
        let listener = UnixListener::bind(&path).unwrap();
        assert_eq!(super::sockets_at(&path).unwrap(), 1);
        // Queued, not accepted: still counted.
        let _c = UnixStream::connect(&path).unwrap();
        assert_eq!(super::sockets_at(&path).unwrap(), 2);
        let (_accepted, _) = listener.accept().unwrap();
        assert_eq!(super::sockets_at(&path).unwrap(), 2);
        // Control: another socket's connections are not this one's.
        let other = dir.path().join("other.sock");
        let _l2 = UnixListener::bind(&other).unwrap();
        let _c2 = UnixStream::connect(&other).unwrap();
        assert_eq!(super::sockets_at(&path).unwrap(), 2);
    }
}
