//! Capabilities, securebits, `no_new_privs` and dumpability.
//!
//! Order matters: the bounding set is cleared first (it needs CAP_SETPCAP), then
//! the securebits are locked (also CAP_SETPCAP), then the ambient, inheritable,
//! permitted and effective sets are emptied. `no_new_privs` makes setuid and
//! file-capability binaries powerless (E15) and is required by Landlock and
//! seccomp for an unprivileged caller.

use caps::{CapSet, Capability};

/// SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
/// SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
/// SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED.
const SECUREBITS_LOCKED: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;

/// Drops every capability from every set, bounding and ambient included, and
/// locks the securebits when the process may still change them.
pub(crate) fn drop_all() -> Result<String, String> {
    let mut locked = false;
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        for cap in caps::all() {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| format!("drop {cap} from bounding set: {e}"))?;
        }
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS_LOCKED, 0, 0, 0) } != 0 {
            return Err(format!(
                "lock securebits: {}",
                std::io::Error::last_os_error()
            ));
        }
        locked = true;
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| format!("clear ambient set: {e}"))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| format!("clear inheritable set: {e}"))?;
    caps::clear(None, CapSet::Effective).map_err(|e| format!("clear effective set: {e}"))?;
    caps::clear(None, CapSet::Permitted).map_err(|e| format!("clear permitted set: {e}"))?;
    let bounding = caps::read(None, CapSet::Bounding)
        .map(|s| s.len())
        .unwrap_or(usize::MAX);
    Ok(format!(
        "all sets empty (bounding: {bounding} left){}",
        if locked { ", securebits locked" } else { "" }
    ))
}

/// Sets `no_new_privs`.
pub(crate) fn set_no_new_privs() -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))
}

/// Makes the process non-dumpable: its /proc entries become root-owned and it
/// cannot be ptraced by same-uid processes.
pub(crate) fn set_nondumpable() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("PR_SET_DUMPABLE: {e}"))
}
