//! seccomp: the syscall filter every process inside the sandbox runs under.
//!
//! Three BPF programs are stacked (the kernel runs all of them; the most
//! restrictive answer wins, and among equal `ERRNO` answers the newest filter's):
//!
//! 1. **x32 guard** (hand-written, 4 instructions; seccompiler has no range
//!    compare): any syscall number with the x32 bit (`0x4000_0000`) kills the
//!    process. x32 numbers alias x86_64 syscalls and were a classic way past
//!    filters that only list x86_64 numbers (E24).
//! 2. **Allowlist** (seccompiler): the syscalls a shell, tmux, compilers and
//!    interpreters need. Everything else — including syscalls newer than this
//!    list — fails with `ENOSYS`, so libc falls back (`clone3` → `clone`).
//!    seccompiler also kills any call made under another architecture (i386
//!    `int 0x80`).
//! 3. **Denylist with arguments** (seccompiler): `EPERM` for the kernel attack
//!    surface and sandbox-escape primitives — namespaces (`unshare`, `setns`,
//!    `clone` with any `CLONE_NEW*` flag), the mount API, keyrings, bpf,
//!    perf, module and kexec loading, io_uring, `process_vm_*`, handle-based
//!    opens — plus `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)` compared on the low
//!    32 bits of the request (CVE-2019-10063), socket families other than
//!    unix/inet/inet6/netlink, and MPTCP/SCTP sockets (Landlock's TCP rules do
//!    not see them).
//!    And file modes (P8, by the kernel): a mode with the set-user-ID or
//!    set-group-ID bit given to any call that sets one (the chmod family,
//!    `open`/`openat` with `O_CREAT` or `O_TMPFILE`, `creat`, `mknod`), and
//!    `mknod` of a FIFO, a device or a socket, and `renameat2` with
//!    `RENAME_WHITEOUT` (it leaves a `c 0 0` node). No set-ID bit is given
//!    to a file inside, wherever it is; `openat2`, whose mode the filter
//!    cannot read, is off the allowlist. File capabilities need
//!    `CAP_SETFCAP`, which nothing inside holds.
//!
//! The same filter applies to PID 1, the tmux server and every pane: nothing
//! inside needs any denied call. Denied calls are visible to probes as `EPERM`
//! (explicitly denied) or `ENOSYS` (not on the allowlist).

use super::syscalls::{ALLOWED, DENIED, MODE_SETTERS, RENAME_WHITEOUT, SPECIAL_FILE_TYPES};
use seccompiler::{
    apply_filter, BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// Errors while building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SeccompError {
    /// seccompiler refused the rules (a bug in this file).
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    /// Compiling to BPF failed.
    #[error("compiling the seccomp filter: {0}")]
    Compile(String),
    /// The kernel refused the filter.
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
    /// This architecture has no filter yet.
    #[error("seccomp: architecture {0} is not supported by sandmux's filter")]
    Arch(&'static str),
    /// The probe's allow-all filter was refused.
    #[error("{0}")]
    Probe(seccompiler::Error),
    /// The probe's thread panicked.
    #[error("the probe thread panicked")]
    ProbePanicked,
}

/// `TIOCSTI`: push a byte into a terminal's input queue (E1).
pub(crate) const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX`: console selection and paste (E2).
pub(crate) const TIOCLINUX: u64 = 0x541C;

/// Every `CLONE_NEW*` flag (and `CLONE_NEWTIME`).
const CLONE_NS_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

/// Socket families a process inside may create.
const SOCKET_FAMILIES: [u64; 4] = [
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// The compiled programs, in installation order.
pub(crate) struct Filters {
    programs: Vec<BpfProgram>,
}

impl Filters {
    /// Number of BPF programs (each shows as one entry in `Seccomp_filters`).
    pub(crate) fn count(&self) -> usize {
        self.programs.len()
    }
}

fn arch() -> Result<TargetArch, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        other => Err(SeccompError::Arch(match other {
            "aarch64" => "aarch64",
            "riscv64" => "riscv64",
            _ => "this one",
        })),
    }
}

fn compile(filter: SeccompFilter) -> Result<BpfProgram, SeccompError> {
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError::Compile(e.to_string()))
}

/// Whether this kernel lets a process install a filter: tried for real, on a
/// short-lived thread (a filter and `no_new_privs` set without TSYNC bind only
/// the calling thread), with a one-instruction program that allows everything.
pub(crate) fn probe() -> Result<(), SeccompError> {
    std::thread::spawn(|| {
        let allow: BpfProgram = vec![seccompiler::sock_filter {
            code: 0x06, // BPF_RET | BPF_K
            jt: 0,
            jf: 0,
            k: 0x7fff_0000, // SECCOMP_RET_ALLOW
        }];
        apply_filter(&allow).map_err(SeccompError::Probe)
    })
    .join()
    .map_err(|_| SeccompError::ProbePanicked)?
}

/// The x32 guard: kill on any syscall number with bit 30 set.
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter as I;
    const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
    vec![
        I {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        }, // seccomp_data.nr
        I {
            code: BPF_JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        I {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: 0x8000_0000,
        }, // SECCOMP_RET_KILL_PROCESS
        I {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        }, // SECCOMP_RET_ALLOW
    ]
}

/// Every number of a grouped list.
fn all(list: &'static [(&str, &[(&str, i64)])]) -> impl Iterator<Item = i64> {
    list.iter().flat_map(|(_, g)| g.iter().map(|(_, n)| *n))
}

/// Builds the sandbox filter (all three programs).
pub(crate) fn build() -> Result<Filters, SeccompError> {
    let arch = arch()?;
    let allow: BTreeMap<i64, Vec<SeccompRule>> = all(ALLOWED).map(|n| (n, vec![])).collect();
    let allowlist = SeccompFilter::new(
        allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        arch,
    )?;

    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = all(DENIED).map(|n| (n, vec![])).collect();
    let eq32 = |arg: u8, v: u64| Cond::new(arg, Len::Dword, Op::Eq, v);
    deny.insert(
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![eq32(1, TIOCSTI)?])?,
            SeccompRule::new(vec![eq32(1, TIOCLINUX)?])?,
        ],
    );
    deny.insert(libc::SYS_clone, clone_ns_rules()?);
    let mut family_not_allowed = Vec::new();
    for fam in SOCKET_FAMILIES {
        family_not_allowed.push(Cond::new(0, Len::Dword, Op::Ne, fam)?);
    }
    deny.insert(
        libc::SYS_socket,
        vec![
            SeccompRule::new(family_not_allowed)?,
            SeccompRule::new(vec![eq32(2, 262)?])?, // IPPROTO_MPTCP
            SeccompRule::new(vec![eq32(2, libc::IPPROTO_SCTP as u64)?])?,
        ],
    );
    for (nr, rules) in mode_rules(true)? {
        deny.insert(nr, rules);
    }
    let whiteout = Cond::new(
        4,
        Len::Dword,
        Op::MaskedEq(RENAME_WHITEOUT),
        RENAME_WHITEOUT,
    )?;
    deny.insert(libc::SYS_renameat2, vec![SeccompRule::new(vec![whiteout])?]);
    let denylist = eperm(deny, arch)?;

    Ok(Filters {
        programs: vec![x32_guard(), compile(allowlist)?, compile(denylist)?],
    })
}

/// The supervisor's programs (`crate::confine`): the x32 guard, then `EPERM`
/// for `denied`, for a set-ID bit in a mode ([`mode_rules`]; what `denied`
/// refuses whole stays refused whole), `clone` with a `CLONE_NEW*` flag and
/// every socket family but unix; `clone3` answers `ENOSYS` (its flags cannot
/// be inspected; libc falls back to `clone`). `openat2` stays: the workspace
/// guard resolves with it (`RESOLVE_BENEATH`), and its mode, in a struct,
/// cannot be inspected.
pub(crate) fn supervisor_programs(
    denied: &[(&str, i64)],
    inet: Inet,
) -> Result<Vec<BpfProgram>, SeccompError> {
    let arch = arch()?;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        denied.iter().map(|(_, n)| (*n, vec![])).collect();
    for (nr, rules) in mode_rules(false)? {
        deny.entry(nr).or_insert(rules);
    }
    deny.insert(libc::SYS_clone, clone_ns_rules()?);
    deny.insert(libc::SYS_socket, socket_rules(inet)?);
    deny.insert(libc::SYS_ioctl, socket_ioctl_rules()?);
    let denylist = eperm(deny, arch)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    Ok(vec![x32_guard(), compile(denylist)?, compile(clone3)?])
}

/// `O_CREAT` and the bit of `O_TMPFILE` that is not `O_DIRECTORY`: the
/// flags with which `open` and `openat` use their mode.
const CREATING: [u64; 2] = [libc::O_CREAT as u64, 0o20_000_000];

/// The rules (any one denies) for every call of [`MODE_SETTERS`]: a set-ID
/// bit in the mode (for `open`/`openat`, with a creating flag); with
/// `special`, also `mknod` of a FIFO, a device or a socket.
fn mode_rules(special: bool) -> Result<Vec<(i64, Vec<SeccompRule>)>, SeccompError> {
    let bit = |arg: u8, b: u64| Cond::new(arg, Len::Dword, Op::MaskedEq(b), b);
    let mut out = Vec::new();
    for (name, nr, mode, flags) in MODE_SETTERS {
        let mut rules = Vec::new();
        for setid in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
            match flags {
                None => rules.push(SeccompRule::new(vec![bit(*mode, setid)?])?),
                Some(f) => {
                    for c in CREATING {
                        rules.push(SeccompRule::new(vec![bit(*f, c)?, bit(*mode, setid)?])?);
                    }
                }
            }
        }
        if special && name.starts_with("mknod") {
            for (_, t) in SPECIAL_FILE_TYPES {
                let ty = Cond::new(
                    *mode,
                    Len::Dword,
                    Op::MaskedEq(libc::S_IFMT as u64),
                    t as u64,
                );
                rules.push(SeccompRule::new(vec![ty?])?);
            }
        }
        out.push((*nr, rules));
    }
    Ok(out)
}

/// Which inet sockets the supervisor may make (network mode `proxy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inet {
    /// None: unix sockets only.
    No,
    /// TCP (`SOCK_STREAM`, protocol 0 or TCP), inet and inet6.
    Tcp,
    /// TCP and UDP (`SOCK_DGRAM`, protocol 0 or UDP): the host's resolver
    /// asks its name servers over UDP.
    TcpUdp,
}

/// `socket` rules (any one denies): a family other than unix (and inet,
/// inet6 when `inet` allows them); an inet or inet6 socket of a type or
/// protocol `inet` does not name (raw, packet-like, SCTP, ICMP "ping").
fn socket_rules(inet: Inet) -> Result<Vec<SeccompRule>, SeccompError> {
    let mut families = vec![libc::AF_UNIX as u64];
    let (mut types, mut protos) = (vec![], vec![0u64]);
    if inet != Inet::No {
        families.extend([libc::AF_INET as u64, libc::AF_INET6 as u64]);
        types.push(libc::SOCK_STREAM as u64);
        protos.push(libc::IPPROTO_TCP as u64);
    }
    if inet == Inet::TcpUdp {
        types.push(libc::SOCK_DGRAM as u64);
        protos.push(libc::IPPROTO_UDP as u64);
    }
    let mut other = Vec::new();
    for fam in &families {
        other.push(Cond::new(0, Len::Dword, Op::Ne, *fam)?);
    }
    let mut rules = vec![SeccompRule::new(other)?];
    for fam in [libc::AF_INET as u64, libc::AF_INET6 as u64] {
        if inet == Inet::No {
            break;
        }
        // The type's low 4 bits (SOCK_NONBLOCK and SOCK_CLOEXEC above).
        for t in (0..16u64).filter(|t| !types.contains(t)) {
            rules.push(SeccompRule::new(vec![
                Cond::new(0, Len::Dword, Op::Eq, fam)?,
                Cond::new(1, Len::Dword, Op::MaskedEq(0xf), t)?,
            ])?);
        }
        let mut c = vec![Cond::new(0, Len::Dword, Op::Eq, fam)?];
        for p in &protos {
            c.push(Cond::new(2, Len::Dword, Op::Ne, *p)?);
        }
        rules.push(SeccompRule::new(c)?);
    }
    Ok(rules)
}

/// `ioctl` with a socket configuration request (0x89xx: interfaces,
/// routes, ARP, device-private; 0x8bxx: wireless), which any socket, unix
/// included, passes to the host's network stack (`ifconfig … mtu`).
fn socket_ioctl_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    let mut rules = Vec::new();
    for base in [0x8900u64, 0x8b00] {
        rules.push(SeccompRule::new(vec![Cond::new(
            1,
            Len::Dword,
            Op::MaskedEq(0xff00),
            base,
        )?])?);
    }
    Ok(rules)
}

/// A filter answering `EPERM` for the calls (and rules) of `deny`.
fn eperm(
    deny: BTreeMap<i64, Vec<SeccompRule>>,
    arch: TargetArch,
) -> Result<SeccompFilter, SeccompError> {
    Ok(SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?)
}

/// `clone` with any `CLONE_NEW*` flag.
fn clone_ns_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    let mut rules = Vec::new();
    for flag in CLONE_NS_FLAGS {
        rules.push(SeccompRule::new(vec![Cond::new(
            0,
            Len::Qword,
            Op::MaskedEq(flag),
            flag,
        )?])?);
    }
    Ok(rules)
}

/// Installs the filters on the calling thread. `no_new_privs` must already be set.
pub(crate) fn install(filters: &Filters) -> Result<(), SeccompError> {
    for p in &filters.programs {
        apply_filter(p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds() {
        let f = build().unwrap();
        assert_eq!(f.count(), 3);
    }

    #[test]
    fn no_syscall_both_allowed_and_denied_except_argument_checked() {
        let allowed: Vec<i64> = all(ALLOWED).collect();
        for d in all(DENIED) {
            assert!(!allowed.contains(&d), "syscall {d} is on both lists");
        }
        assert!(
            !allowed.contains(&libc::SYS_clone3),
            "clone3 must answer ENOSYS"
        );
        assert!(!allowed.contains(&libc::SYS_io_uring_setup));
    }

    #[test]
    fn ioctl_rules_compare_32_bits() {
        // The rule is built with Dword length: the high half of the request is ignored,
        // so TIOCSTI | (1 << 32) still matches (CVE-2019-10063).
        let c = Cond::new(1, Len::Dword, Op::Eq, TIOCSTI).unwrap();
        let dbg = format!("{c:?}");
        assert!(dbg.contains("Dword"), "{dbg}");
    }
}
