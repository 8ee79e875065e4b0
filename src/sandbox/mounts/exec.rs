//! Executes the plan's mount steps (`plan::compile`): one loop, one arm per
//! kind of step. Nothing here decides what the view holds.

use super::*;
use crate::profile::Layer;
use crate::sandbox::plan::{Attrs, From, Need, Onto, Op, Part, RunFile, Step};
use crate::sandbox::report::Refusal;
use std::collections::BTreeSet;

/// Where the host-side sources of the plan are, for this instance.
pub(crate) struct Sources<'a> {
    /// An empty directory on the host, seen only in this mount namespace.
    pub newroot: &'a Path,
    /// `<rundir>/sock`.
    pub host_sock_dir: &'a Path,
    /// The contents of `/run/sandmux`'s files.
    pub files: &'a RunFiles,
}

/// A step that failed, with the layer it ends start-up as.
#[derive(Debug)]
pub(crate) struct Failed {
    /// The step's layer.
    pub layer: Layer,
    /// What went wrong.
    pub error: MountError,
    /// What refused it, where the fix depends on that: the failed
    /// `mount(2)` says it ([`refused`]), not the error's text.
    pub refused: Option<Refusal>,
}

/// The kernel's refusal of a mount whose fix depends on what refused it
/// (a fresh procfs, the overlay): set where `mount(2)` itself failed, so
/// a step that failed before it (a directory, the layer's `upper/`) gets
/// no container's hint.
fn refused(e: MountError, r: Refusal) -> MountError {
    MountError {
        refused: Some(r),
        ..e
    }
}

impl Attrs {
    /// As `mount_setattr` attributes.
    fn bits(self) -> u64 {
        let mut b = 0;
        for (on, bit) in [
            (self.ro, MOUNT_ATTR_RDONLY),
            (self.nosuid, MOUNT_ATTR_NOSUID),
            (self.nodev, MOUNT_ATTR_NODEV),
            (self.noexec, MOUNT_ATTR_NOEXEC),
        ] {
            if on {
                b |= bit;
            }
        }
        b
    }

    /// As `mount(2)` flags.
    fn ms(self) -> MsFlags {
        let mut f = MsFlags::empty();
        for (on, flag) in [
            (self.ro, MsFlags::MS_RDONLY),
            (self.nosuid, MsFlags::MS_NOSUID),
            (self.nodev, MsFlags::MS_NODEV),
            (self.noexec, MsFlags::MS_NOEXEC),
        ] {
            if on {
                f |= flag;
            }
        }
        f
    }
}

impl Part {
    /// The verb of a bind's error message.
    fn verb(self) -> &'static str {
        match self {
            Part::Gate => "bind the gate binary onto",
            Part::SocketDir => "bind the socket directory onto",
            Part::AgentRepo => "bind the agent's repository onto",
            Part::GitOrigin => "bind the workspace's git directory read-only onto",
            Part::GitOutside => "bind the git directory read-only onto",
            Part::Device => "bind device onto",
            Part::ProcMask | Part::Utempter => "mask",
            Part::ProcCover => "cover",
            Part::ProcFallback => "bind the existing /proc read-only onto",
            _ => "bind onto",
        }
    }
}

/// Builds the view from `steps` and pivots into it. A failing best-effort
/// step whose layer the profile lets go is skipped and returned in
/// [`Built::dropped`]; any other failure ends the build.
pub(crate) fn build_and_pivot(
    steps: &[Step],
    src: &Sources<'_>,
    best_effort: &BTreeSet<Layer>,
) -> Result<Built, Failed> {
    let fail = |layer| {
        move |error| Failed {
            layer,
            error,
            refused: None,
        }
    };
    let (first, rest) = steps.split_first().ok_or_else(|| Failed {
        refused: None,
        layer: Layer::Mount,
        error: MountError {
            what: "the plan has no root",
            path: "/".into(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
            refused: None,
        },
    })?;
    let mut root = make_root(first, src.newroot).map_err(fail(first.layer))?;
    let mut built = Built::default();
    let mut dropped = false;
    for s in rest {
        if s.need == Need::IfDropped && !dropped {
            continue;
        }
        dropped = false;
        match run(&mut root, s, src, &mut built) {
            Ok(()) => {}
            Err(e) if s.need == Need::BestEffort && best_effort.contains(&s.layer) => {
                built.dropped.push((s.layer, e.to_string()));
                dropped = true;
            }
            Err(e) => {
                let refused = e.refused;
                return Err(Failed {
                    refused,
                    ..fail(s.layer)(e)
                });
            }
        }
        if s.need == Need::IfDropped {
            if let Some(d) = built.dropped.last_mut() {
                d.1 = format!("{}; instead: {}", d.1, crate::sandbox::view::describe(s));
            }
        }
    }
    fchdir(&root.fd)
        .map_err(merr("chdir", src.newroot))
        .and_then(|_| pivot_root(".", ".").map_err(merr("pivot_root into", src.newroot)))
        .and_then(|_| umount2(".", MntFlags::MNT_DETACH).map_err(merr("detach the old root", "/")))
        .and_then(|_| nix::unistd::chdir("/").map_err(merr("chdir", "/")))
        .map_err(fail(Layer::Mount))?;
    Ok(built)
}

/// Mounts made in the live view (after `pivot_root`): the socket cover.
pub(crate) fn after_ready(steps: &[Step]) -> Result<(), Failed> {
    for s in steps {
        let Op::Tmpfs { options, attrs } = &s.op else {
            return Err(Failed {
                refused: None,
                layer: s.layer,
                error: MountError {
                    what: "only a tmpfs can be mounted in the live view, not at",
                    path: s.path.display().to_string(),
                    source: std::io::Error::from_raw_os_error(libc::EINVAL),
                    refused: None,
                },
            });
        };
        mount(
            Some("tmpfs"),
            &s.path,
            Some("tmpfs"),
            attrs.ms(),
            Some(options.as_str()),
        )
        .map_err(merr("hide", &s.path))
        .map_err(|error| Failed {
            layer: s.layer,
            error,
            refused: None,
        })?;
    }
    Ok(())
}

/// The new root: `/` made private, a fresh tmpfs at `newroot`.
fn make_root(s: &Step, newroot: &Path) -> Result<Root, MountError> {
    let (Part::Root, Op::Tmpfs { options, attrs }) = (s.part, &s.op) else {
        return Err(MountError {
            what: "the plan's first step must be the root tmpfs, not",
            path: s.path.display().to_string(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
            refused: None,
        });
    };
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(merr("make private", "/"))?;
    mount(
        Some("tmpfs"),
        newroot,
        Some("tmpfs"),
        attrs.ms(),
        Some(options.as_str()),
    )
    .map_err(merr("mount root tmpfs on", newroot))?;
    let fd = nix::fcntl::open(
        newroot,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(merr("open", newroot))?;
    let dev = fstat(&fd).map_err(merr("stat", newroot))?.st_dev;
    Ok(Root {
        fd,
        ours: [dev].into(),
    })
}

/// One step.
fn run(root: &mut Root, s: &Step, src: &Sources<'_>, built: &mut Built) -> Result<(), MountError> {
    let p = s.path.as_path();
    match &s.op {
        Op::Tmpfs { options, attrs } => root.tmpfs(p, options, attrs.ms()).map(drop),
        Op::Procfs { attrs } => {
            let dst = root.ensure_dir(p)?;
            mount(
                Some("proc"),
                &fd_path(&dst),
                Some("proc"),
                attrs.ms(),
                None::<&str>,
            )
            .map_err(merr("mount a fresh procfs on", p))
            .map_err(|e| refused(e, Refusal::FreshProcfs))
        }
        Op::Devpts { options, attrs } => {
            let dst = root.ensure_dir(p)?;
            mount(
                Some("devpts"),
                &fd_path(&dst),
                Some("devpts"),
                attrs.ms(),
                Some(options.as_str()),
            )
            .map_err(merr("mount devpts on", p))
        }
        Op::File { content } => write_run_file(root, p, *content, src.files),
        Op::Bind { from, onto, attrs } => bind_step(root, s, from, *onto, *attrs, src),
        Op::Symlink { target } => {
            let parent = root.ensure_dir(p.parent().unwrap_or(Path::new("/")))?;
            let name = p.file_name().unwrap_or_default();
            symlinkat(target.as_path(), &parent, name).map_err(merr("create symlink", p))
        }
        Op::Mask => mask(root, p, built),
        Op::Pin => pin(root, p),
        Op::Protect => protect(root, p, built),
        Op::ReadOnly => {
            set_attr(&root.reopen(p)?, MOUNT_ATTR_RDONLY, false).map_err(ierr("make read-only", p))
        }
        Op::Overlay { dir } => overlay(root, p, dir),
    }
}

/// The copy-on-write workspace: an overlay whose lower layer is what is
/// mounted at `p` (the workspace's bind) and whose writes land in
/// `<layer>/upper`. Every directory is named by a descriptor opened without
/// following links (`/proc/self/fd/N`), so no path text reaches the options.
/// `userxattr`: the overlay's own marks are `user.overlay.*` (what a user
/// namespace may write, and what `sandmux diff` reads).
fn overlay(root: &Root, p: &Path, layer: &Path) -> Result<(), MountError> {
    let lower = root.reopen(p)?;
    let host = crate::sandbox::beneath::open_root(Path::new("/")).map_err(merr("open", "/"))?;
    let dir = |name: &str| {
        let rel = layer.strip_prefix("/").unwrap_or(layer).join(name);
        beneath(&host, &rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map_err(merr("open the workspace layer's", layer.join(name)))
    };
    let (upper, work) = (dir("upper")?, dir("work")?);
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        fd_path(&lower).display(),
        fd_path(&upper).display(),
        fd_path(&work).display()
    );
    mount(
        Some("overlay"),
        &fd_path(&lower),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(merr("mount the copy-on-write layer on", p))
    .map_err(|e| refused(e, Refusal::Overlay))
}

/// Writes one of `/run/sandmux`'s files (the plan and the files must agree).
fn write_run_file(
    root: &Root,
    p: &Path,
    content: RunFile,
    files: &RunFiles,
) -> Result<(), MountError> {
    let names = files.names.as_ref();
    let text: Option<&str> = match content {
        RunFile::Empty => Some(""),
        RunFile::Passwd => Some(&files.passwd),
        RunFile::Group => Some(&files.group),
        RunFile::GateJson => Some(&files.gate_json),
        RunFile::ResolvConf => names.map(|n| n.0.as_str()),
        RunFile::Hosts => names.map(|n| n.1.as_str()),
        RunFile::TmuxConf => files.tmux_conf.as_deref(),
        RunFile::CaBundle => files.ca.as_ref().map(|c| c.0.as_str()),
        RunFile::Ca => files.ca.as_ref().map(|c| c.1.as_str()),
    };
    let text = text.ok_or_else(|| MountError {
        what: "the plan lists a file the supervisor did not send:",
        path: p.display().to_string(),
        source: std::io::Error::from_raw_os_error(libc::ENOENT),
        refused: None,
    })?;
    let parent = p.parent().unwrap_or(Path::new("/"));
    let dir = openat(
        &root.reopen(parent)?,
        ".",
        OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(merr("open", parent))?;
    let name = p.file_name().unwrap_or_default().to_string_lossy();
    write_file(&dir, &name, text.as_bytes(), 0o444)
}

/// Opens a bind's source tree.
fn open_from(root: &Root, s: &Step, from: &From, src: &Sources<'_>) -> Result<OwnedFd, MountError> {
    let p = s.path.as_path();
    match from {
        From::Host => open_host(p),
        From::HostBeneath { path } => {
            let what = match s.part {
                Part::AgentRepo => "open the agent's repository (no symlinks) at",
                _ => "open the git directory (no symlinks) at",
            };
            let host_root = open_host(Path::new("/"))?;
            beneath(&host_root, &rel(path), OFlag::O_PATH | OFlag::O_DIRECTORY)
                .map_err(merr(what, path))
        }
        // By path: /proc/self/exe refers to a mount of the namespace we left.
        From::Binary => {
            let exe =
                std::fs::read_link("/proc/self/exe").map_err(ierr("read", "/proc/self/exe"))?;
            nix::fcntl::open(&exe, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(merr("open", &exe))
        }
        From::RundirSock => open_host(src.host_sock_dir),
        From::Inside { path } => {
            beneath(&root.fd, &rel(path), OFlag::O_PATH).map_err(merr("open", path))
        }
        From::Itself => Err(MountError {
            what: "a bind of a path onto itself has no separate source:",
            path: p.display().to_string(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
            refused: None,
        }),
    }
}

fn bind_step(
    root: &Root,
    s: &Step,
    from: &From,
    onto: Onto,
    attrs: Attrs,
    src: &Sources<'_>,
) -> Result<(), MountError> {
    let p = s.path.as_path();
    let dst = match onto {
        Onto::IfPresent => match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
            Ok(fd) => fd,
            Err(_) => return Ok(()),
        },
        Onto::Existing => {
            // Opened after the source, as the source's errors come first.
            let src_fd = open_from(root, s, from, src)?;
            let dst = beneath(
                &root.fd,
                &rel(p),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW,
            )
            .map_err(merr("open the workspace's .git at", p))?;
            return bind(&src_fd, &dst, attrs.bits(), s.part.verb(), p);
        }
        Onto::Create => {
            let src_fd = open_from(root, s, from, src)?;
            let is_dir =
                fstat(&src_fd).map_err(merr("stat", p))?.st_mode & libc::S_IFMT == libc::S_IFDIR;
            let dst = if is_dir {
                root.ensure_dir(p)?
            } else {
                root.ensure_file(p)?
            };
            return bind(&src_fd, &dst, attrs.bits(), s.part.verb(), p);
        }
    };
    let src_fd = match from {
        From::Itself => return bind(&dst, &dst, attrs.bits(), s.part.verb(), p),
        _ => open_from(root, s, from, src)?,
    };
    bind(&src_fd, &dst, attrs.bits(), s.part.verb(), p)
}

/// A masked path: resolved on the host already (profile.rs); absent on the
/// host or from the view means there is nothing to hide. Any other failure is
/// an error, never a skip.
fn mask(root: &mut Root, p: &Path, built: &mut Built) -> Result<(), MountError> {
    let Ok(src) = open_host(p) else {
        return Ok(());
    };
    let is_dir = fstat(&src).map_err(merr("stat", p))?.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let dst = match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(e) => return Err(merr("open the path to mask", p)(e)),
    };
    if is_dir {
        mount(
            Some("tmpfs"),
            &fd_path(&dst),
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0555"),
        )
        .map_err(merr("mask", p))?;
    } else {
        let empty = beneath(
            &root.fd,
            &rel(Path::new(crate::sandbox::plan::EMPTY)),
            OFlag::O_PATH,
        )
        .map_err(merr("open", crate::sandbox::plan::EMPTY))?;
        let all = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
        bind(&empty, &dst, all, "mask", p)?;
    }
    built.masked.push(p.to_path_buf());
    Ok(())
}

fn symlinked(what: &'static str, p: &Path) -> MountError {
    MountError {
        what,
        path: crate::term::printable(&p.to_string_lossy()),
        source: std::io::Error::from_raw_os_error(libc::ELOOP),
        refused: None,
    }
}

/// A parent of a protected path, bound onto itself so that renaming it
/// cannot carry a protected path away.
fn pin(root: &Root, p: &Path) -> Result<(), MountError> {
    match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW) {
        Ok(dst) => bind(&dst, &dst, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, "pin", p),
        Err(nix::Error::ENOENT) | Err(nix::Error::ENOTDIR) => Ok(()),
        Err(nix::Error::ELOOP) => Err(symlinked("a parent of a protected path is a symlink (remove it, or take the path off the profile's protected list)", p)),
        Err(e) => Err(merr("open the parent of a protected path", p)(e)),
    }
}

/// A protected path: read-only inside its read-write root, never through a symlink.
fn protect(root: &Root, p: &Path, built: &mut Built) -> Result<(), MountError> {
    match beneath(&root.fd, &rel(p), OFlag::O_PATH | OFlag::O_NOFOLLOW) {
        Ok(dst) => {
            if fstat(&dst).map_err(merr("stat", p))?.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return Err(symlinked("protected path is a symlink (remove it, or take it off the profile's protected list)", p));
            }
            bind(&dst, &dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, "protect", p)?;
            built.protected.push(p.to_path_buf());
            Ok(())
        }
        Err(nix::Error::ENOENT) | Err(nix::Error::ENOTDIR) => Ok(()),
        Err(nix::Error::ELOOP) => Err(symlinked("protected path goes through a symlink (remove it, or take it off the profile's protected list)", p)),
        Err(e) => Err(merr("open protected path", p)(e)),
    }
}
