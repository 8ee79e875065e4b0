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
//!
//! The same filter applies to PID 1, the tmux server and every pane: nothing
//! inside needs any denied call. Denied calls are visible to probes as `EPERM`
//! (explicitly denied) or `ENOSYS` (not on the allowlist).

use seccompiler::{
    apply_filter, BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// Errors while building or installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
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
}

/// `TIOCSTI`: push a byte into a terminal's input queue (E1).
pub const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX`: console selection and paste (E2).
pub const TIOCLINUX: u64 = 0x541C;

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

/// Syscalls allowed unconditionally (arguments are checked by the denylist).
/// Grouped by what needs them; anything absent answers `ENOSYS`.
const ALLOWED: &[i64] = &[
    // files and directories
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_open,
    libc::SYS_close,
    libc::SYS_stat,
    libc::SYS_fstat,
    libc::SYS_lstat,
    libc::SYS_lseek,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_creat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_truncate,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync,
    libc::SYS_syncfs,
    libc::SYS_sync_file_range,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    libc::SYS_getdents,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_chdir,
    libc::SYS_fchdir,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rmdir,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_symlink,
    libc::SYS_symlinkat,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchmodat2,
    libc::SYS_chown,
    libc::SYS_fchown,
    libc::SYS_lchown,
    libc::SYS_fchownat,
    libc::SYS_umask,
    libc::SYS_utime,
    libc::SYS_utimes,
    libc::SYS_utimensat,
    libc::SYS_futimesat,
    libc::SYS_mknod,
    libc::SYS_mknodat,
    libc::SYS_flock,
    libc::SYS_fcntl,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_pipe,
    libc::SYS_pipe2,
    libc::SYS_sendfile,
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_vmsplice,
    libc::SYS_copy_file_range,
    libc::SYS_close_range,
    libc::SYS_ioctl,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    463,
    464,
    465,
    466, // setxattrat, getxattrat, listxattrat, removexattrat
    468,
    469, // file_getattr, file_setattr
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    libc::SYS_memfd_create,
    451, // cachestat
    // memory
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_brk,
    libc::SYS_mremap,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_madvise,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_remap_file_pages,
    libc::SYS_mbind,
    libc::SYS_set_mempolicy,
    libc::SYS_get_mempolicy,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_membarrier,
    libc::SYS_pkey_mprotect,
    libc::SYS_pkey_alloc,
    libc::SYS_pkey_free,
    libc::SYS_process_madvise,
    libc::SYS_process_mrelease,
    libc::SYS_mseal,
    453, // map_shadow_stack
    // processes, threads, signals
    libc::SYS_clone,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_kill,
    libc::SYS_tkill,
    libc::SYS_tgkill,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
    libc::SYS_rt_sigsuspend,
    libc::SYS_sigaltstack,
    libc::SYS_signalfd,
    libc::SYS_signalfd4,
    libc::SYS_pause,
    libc::SYS_pidfd_open,
    libc::SYS_pidfd_send_signal,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getpgrp,
    libc::SYS_getpgid,
    libc::SYS_setpgid,
    libc::SYS_getsid,
    libc::SYS_setsid,
    libc::SYS_set_tid_address,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_futex,
    libc::SYS_futex_waitv,
    454,
    455,
    456, // futex_wake, futex_wait, futex_requeue
    libc::SYS_arch_prctl,
    libc::SYS_prctl,
    libc::SYS_set_thread_area,
    libc::SYS_get_thread_area,
    libc::SYS_ptrace,
    libc::SYS_kcmp,
    libc::SYS_personality,
    libc::SYS_seccomp,
    libc::SYS_sched_yield,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getparam,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_get_priority_max,
    libc::SYS_sched_get_priority_min,
    libc::SYS_sched_rr_get_interval,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setattr,
    libc::SYS_sched_getattr,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_ioprio_set,
    libc::SYS_ioprio_get,
    libc::SYS_getrlimit,
    libc::SYS_setrlimit,
    libc::SYS_prlimit64,
    libc::SYS_getrusage,
    libc::SYS_times,
    libc::SYS_sysinfo,
    libc::SYS_uname,
    libc::SYS_getcpu,
    libc::SYS_getrandom,
    libc::SYS_restart_syscall,
    // credentials (no capabilities are left, so these can only lower or keep ids)
    libc::SYS_getuid,
    libc::SYS_getgid,
    libc::SYS_geteuid,
    libc::SYS_getegid,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_getresuid,
    libc::SYS_setresgid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_capget,
    libc::SYS_capset,
    // Landlock: a process may always restrict itself further
    libc::SYS_landlock_create_ruleset,
    libc::SYS_landlock_add_rule,
    libc::SYS_landlock_restrict_self,
    459,
    461, // lsm_get_self_attr, lsm_list_modules
    // time
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_time,
    libc::SYS_getitimer,
    libc::SYS_setitimer,
    libc::SYS_alarm,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_gettime,
    libc::SYS_timer_getoverrun,
    libc::SYS_timer_delete,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // polling and events
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    libc::SYS_io_setup,
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    libc::SYS_io_submit,
    libc::SYS_io_cancel,
    333, // io_pgetevents
    // sockets (families and protocols are checked by the denylist)
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    // System V and POSIX IPC (private to the sandbox's IPC namespace)
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
];

/// Syscalls refused with `EPERM` whatever their arguments.
const DENIED: &[i64] = &[
    // new namespaces and the mount API (E16, E23)
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    457,
    458,
    467, // statmount, listmount, open_tree_attr
    // keyrings (E8)
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    // kernel attack surface
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_modify_ldt,
    libc::SYS_fanotify_init,
    libc::SYS_fanotify_mark,
    libc::SYS_memfd_secret,
    // other processes' memory and files (E6)
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    // host administration
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_adjtimex,
    libc::SYS_clock_adjtime,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_vhangup,
    libc::SYS_lookup_dcookie,
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    460, // lsm_set_self_attr
];

/// Socket families a process inside may create.
const SOCKET_FAMILIES: [u64; 4] = [
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// The compiled programs, in installation order.
pub struct Filters {
    programs: Vec<BpfProgram>,
}

impl Filters {
    /// Number of BPF programs (each shows as one entry in `Seccomp_filters`).
    pub fn count(&self) -> usize {
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
pub fn probe() -> Result<(), String> {
    std::thread::spawn(|| {
        let allow: BpfProgram = vec![seccompiler::sock_filter {
            code: 0x06, // BPF_RET | BPF_K
            jt: 0,
            jf: 0,
            k: 0x7fff_0000, // SECCOMP_RET_ALLOW
        }];
        apply_filter(&allow).map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the probe thread panicked".to_string())?
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

/// Builds the sandbox filter (all three programs).
pub fn build() -> Result<Filters, SeccompError> {
    let arch = arch()?;
    let allow: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED.iter().map(|&n| (n, vec![])).collect();
    let allowlist = SeccompFilter::new(
        allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        arch,
    )?;

    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&n| (n, vec![])).collect();
    let eq32 = |arg: u8, v: u64| Cond::new(arg, Len::Dword, Op::Eq, v);
    deny.insert(
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![eq32(1, TIOCSTI)?])?,
            SeccompRule::new(vec![eq32(1, TIOCLINUX)?])?,
        ],
    );
    let mut clone_rules = Vec::new();
    for flag in CLONE_NS_FLAGS {
        clone_rules.push(SeccompRule::new(vec![Cond::new(
            0,
            Len::Qword,
            Op::MaskedEq(flag),
            flag,
        )?])?);
    }
    deny.insert(libc::SYS_clone, clone_rules);
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
    let denylist = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;

    Ok(Filters {
        programs: vec![x32_guard(), compile(allowlist)?, compile(denylist)?],
    })
}

/// Installs the filters on the calling thread. `no_new_privs` must already be set.
pub fn install(filters: &Filters) -> Result<(), SeccompError> {
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
        for d in DENIED {
            assert!(!ALLOWED.contains(d), "syscall {d} is on both lists");
        }
        assert!(
            !ALLOWED.contains(&libc::SYS_clone3),
            "clone3 must answer ENOSYS"
        );
        assert!(!ALLOWED.contains(&libc::SYS_io_uring_setup));
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
