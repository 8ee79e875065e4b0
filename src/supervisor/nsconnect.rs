//! One TCP connection to `127.0.0.1:PORT` *inside* a sandbox's network
//! namespace, made from the host (`sandmux expose`, run by the broker).
//!
//! A socket belongs to the network namespace it was made in, whoever uses
//! it later. So a helper forked for the one connection joins the sandbox's
//! user namespace (the supervisor's uid owns it: full capabilities there)
//! and network namespace, makes the socket, connects it to the one port the
//! operator named, hands the connected descriptor back over a socket pair
//! (`SCM_RIGHTS`) and exits. Nothing of the sandbox runs here and nothing
//! is taken from it: no agent input reaches this code, the address is
//! always the sandbox's own loopback, and the helper is in no namespace the
//! agent can see (pid, mount) long enough to be reached.
//!
//! In network mode `host` the sandbox shares the host's namespaces: the
//! helper joins nothing, and `127.0.0.1` is the host's own loopback.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Steps of the helper, as it reports a failure.
const STAGES: [&str; 5] = [
    "",
    "joining the sandbox's user namespace",
    "joining the sandbox's network namespace",
    "making the socket",
    "connecting",
];

/// Why no connection inside the sandbox was made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NsConnectError {
    /// The sandbox's namespace link is gone.
    #[error("{path}: {source} (is the sandbox still running?)")]
    Gone {
        path: String,
        source: std::io::Error,
    },
    /// The sandbox's namespace could not be opened.
    #[error("{path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    /// The socket pair to the helper.
    #[error("{0}")]
    Pair(std::io::Error),
    /// The helper could not be forked.
    #[error("fork: {0}")]
    Fork(std::io::Error),
    /// A step of the helper failed (connecting included).
    #[error("{stage} (127.0.0.1:{port} inside the sandbox): {errno}")]
    Step {
        stage: &'static str,
        port: u16,
        errno: std::io::Error,
    },
    /// Nothing usable came back from the helper.
    #[error("the connecting helper: {0}")]
    Helper(#[source] Box<NsConnectError>),
    /// Receiving over the descriptor channel failed.
    #[error("{0}")]
    Recv(nix::Error),
    /// The other end sent no answer.
    #[error("the helper ended without an answer")]
    NoAnswer,
}

/// A connected TCP socket to `127.0.0.1:port` in the network namespace of
/// the sandbox whose outer `__init` is `init_pid` (the caller checked it is
/// one of this instance's).
pub(crate) fn connect_inside(init_pid: u32, port: u16) -> Result<OwnedFd, NsConnectError> {
    let ns = |n: &str| -> Result<Option<OwnedFd>, NsConnectError> {
        let path = format!("/proc/{init_pid}/ns/{n}");
        let theirs = match std::fs::read_link(&path) {
            Ok(t) => t,
            Err(source) => return Err(NsConnectError::Gone { path, source }),
        };
        if std::fs::read_link(format!("/proc/self/ns/{n}")).ok() == Some(theirs) {
            return Ok(None);
        }
        std::fs::File::open(&path)
            .map(|f| Some(f.into()))
            .map_err(|source| NsConnectError::Open { path, source })
    };
    let (user, net) = (ns("user")?, ns("net")?);
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(NsConnectError::Pair)?;
    let raw = |f: &Option<OwnedFd>| f.as_ref().map(|f| f.as_raw_fd());
    let (u, n, chan) = (raw(&user), raw(&net), theirs.as_raw_fd());
    // SAFETY: the child makes only async-signal-safe system calls on values
    // prepared before the fork, and `_exit`s.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(NsConnectError::Fork(std::io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: in the forked child; `helper` never returns.
        unsafe { helper(u, n, port, chan) }
    }
    drop(theirs);
    ours.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok();
    let got = recv_fd(&ours);
    let mut st = 0;
    // SAFETY: waiting for the child just made.
    unsafe { libc::waitpid(child, &mut st, 0) };
    match got {
        Ok((0, _, Some(fd))) => Ok(fd),
        Ok((stage, errno, _)) => Err(NsConnectError::Step {
            stage: STAGES.get(stage as usize).copied().unwrap_or("the helper"),
            port,
            errno: std::io::Error::from_raw_os_error(errno),
        }),
        Err(e) => Err(NsConnectError::Helper(Box::new(e))),
    }
}

/// The forked helper.
///
/// # Safety
/// Only in a child just forked: it never returns.
unsafe fn helper(user: Option<RawFd>, net: Option<RawFd>, port: u16, chan: RawFd) -> ! {
    let fail = |stage: u8| -> ! {
        let e = *libc::__errno_location();
        send_raw(chan, stage, e, None);
        libc::_exit(1)
    };
    if let Some(u) = user {
        if libc::setns(u, libc::CLONE_NEWUSER) != 0 {
            fail(1);
        }
    }
    if let Some(n) = net {
        if libc::setns(n, libc::CLONE_NEWNET) != 0 {
            fail(2);
        }
    }
    // Non-blocking: the connect is only started here, and the socket sent
    // back at once; the supervisor waits for it (bounded), so a port inside
    // that never accepts cannot hold the broker, which also stops and
    // freezes the instance.
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    let s = libc::socket(libc::AF_INET, kind, 0);
    if s < 0 {
        fail(3);
    }
    let mut sa: libc::sockaddr_in = std::mem::zeroed();
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = port.to_be();
    sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    let sap = &sa as *const libc::sockaddr_in as *const libc::sockaddr;
    let sal = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    if libc::connect(s, sap, sal) != 0 && *libc::__errno_location() != libc::EINPROGRESS {
        fail(4);
    }
    send_raw(chan, 0, 0, Some(s));
    libc::_exit(0)
}

/// Sends `[stage, errno (4 bytes)]`, with `fd` attached when given.
///
/// # Safety
/// Plain system calls on descriptors the caller owns; no allocation.
unsafe fn send_raw(chan: RawFd, stage: u8, errno: i32, fd: Option<RawFd>) {
    let mut body = [0u8; 5];
    body[0] = stage;
    body[1..].copy_from_slice(&errno.to_le_bytes());
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr() as *mut libc::c_void,
        iov_len: body.len(),
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut space = [0u64; 8];
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let len = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32);
        msg.msg_control = space.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = len as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::copy_nonoverlapping(
            &fd as *const RawFd as *const u8,
            libc::CMSG_DATA(c),
            std::mem::size_of::<RawFd>(),
        );
    }
    libc::sendmsg(chan, &msg, 0);
}

/// Receives `[stage, errno]` and the descriptor sent with it, if any.
pub(crate) fn recv_fd(
    chan: &std::os::unix::net::UnixStream,
) -> Result<(u8, i32, Option<OwnedFd>), NsConnectError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut body = [0u8; 5];
    let mut iov = [std::io::IoSliceMut::new(&mut body)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        chan.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(NsConnectError::Recv)?;
    let mut fd = None;
    for c in msg.cmsgs().map_err(NsConnectError::Recv)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for f in fds {
                // SAFETY: the kernel just installed this descriptor for us.
                let owned = unsafe { OwnedFd::from_raw_fd(f) };
                fd.get_or_insert(owned);
            }
        }
    }
    if msg.bytes != 5 {
        return Err(NsConnectError::NoAnswer);
    }
    let errno = i32::from_le_bytes([body[1], body[2], body[3], body[4]]);
    Ok((body[0], errno, fd))
}

/// Sends a descriptor the way [`recv_fd`] reads it (stage 0), or a failure
/// (`stage` > 0, no descriptor).
pub(crate) fn send_fd(chan: &std::os::unix::net::UnixStream, fd: Option<RawFd>, stage: u8) {
    // SAFETY: a plain sendmsg on a descriptor we own.
    unsafe { send_raw(chan.as_raw_fd(), stage, 0, fd) }
}
