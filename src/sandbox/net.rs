//! Network: in `loopback` mode, bring `lo` up in the sandbox's own network
//! namespace. (`none` leaves it down; `host` shares the host's network and is
//! limited by Landlock TCP rules, see `landlock.rs`.) In `proxy` mode the
//! outer `__init` also brings `lo` up, binds the proxy's listener there and
//! hands it to the supervisor over [`PROXY_FD`] ([`send_listener`],
//! [`recv_listener`]), which serves it (`crate::proxy`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub(crate) use crate::profile::allow::LISTEN;
use crate::profile::NetMode;
use serde::{Deserialize, Serialize};

/// The network as the sandbox applies it, compiled from `[network]`: the
/// mode, and the TCP ports Landlock opens where the mode needs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Net {
    /// none | loopback | host | proxy.
    pub mode: NetMode,
    /// TCP ports that may be connected to.
    pub connect_tcp: Vec<u16>,
    /// TCP ports that may be bound.
    pub bind_tcp: Vec<u16>,
}

/// The descriptor `__init` gets in proxy mode: a Unix socket to the supervisor.
pub(crate) const PROXY_FD: i32 = 5;

/// Why proxy mode's listener was not handed over.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetError {
    /// `lo` could not be brought up.
    #[error("bringing lo up: {0}")]
    LoopbackUp(std::io::Error),
    /// The listener could not be bound.
    #[error("binding {listen}: {0}", listen = LISTEN)]
    Bind(std::io::Error),
    /// The listener could not be sent.
    #[error("handing the listener to the supervisor: {0}")]
    Send(nix::Error),
    /// Nothing could be received.
    #[error("the sandbox sent no proxy listener: {0}")]
    Receive(nix::Error),
    /// The control messages could not be read.
    #[error("{0}")]
    Control(nix::Error),
    /// The listener could not be made non-blocking.
    #[error("{0}")]
    Nonblocking(std::io::Error),
    /// A message came without a listener.
    #[error("the sandbox sent no proxy listener")]
    NoListener,
}

/// In the sandbox's network namespace: `lo` up, the proxy's listener bound
/// there and sent over [`PROXY_FD`], which is then closed (nothing below
/// the outer process inherits it, nor the listener).
pub(crate) fn send_listener() -> Result<(), NetError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    loopback_up().map_err(NetError::LoopbackUp)?;
    let l = std::net::TcpListener::bind(LISTEN).map_err(NetError::Bind)?;
    // SAFETY: the supervisor passes PROXY_FD in proxy mode; owned from here on.
    let chan = unsafe { OwnedFd::from_raw_fd(PROXY_FD) };
    let fds = [l.as_raw_fd()];
    let iov = [std::io::IoSlice::new(b"L")];
    sendmsg::<()>(
        chan.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(NetError::Send)?;
    Ok(())
}

/// The supervisor's side: the listener `__init` sent, which must be there
/// once the sandbox reported start-up done.
pub(crate) fn recv_listener(
    chan: &std::os::unix::net::UnixStream,
) -> Result<std::net::TcpListener, NetError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        chan.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(NetError::Receive)?;
    for c in msg.cmsgs().map_err(NetError::Control)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let [fd] = fds.as_slice() {
                // SAFETY: the kernel just installed this descriptor for us.
                let l = unsafe { std::net::TcpListener::from_raw_fd(*fd) };
                l.set_nonblocking(true).map_err(NetError::Nonblocking)?;
                return Ok(l);
            }
        }
    }
    Err(NetError::NoListener)
}

/// Brings the loopback interface up (needs CAP_NET_ADMIN in the namespace).
pub(crate) fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket(2) call; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor we exclusively own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the union field written by SIOCGIFFLAGS is ifru_flags.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
