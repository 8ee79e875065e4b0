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

/// Why a capability step failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CapsError {
    /// A capability could not be dropped from the bounding set.
    #[error("drop {cap} from bounding set: {source}")]
    Bounding {
        cap: Capability,
        source: caps::errors::CapsError,
    },
    /// The securebits could not be locked.
    #[error("lock securebits: {0}")]
    Securebits(std::io::Error),
    /// A capability set could not be emptied.
    #[error("clear {set} set: {source}")]
    Clear {
        set: &'static str,
        source: caps::errors::CapsError,
    },
    /// `PR_SET_NO_NEW_PRIVS` failed.
    #[error("PR_SET_NO_NEW_PRIVS: {0}")]
    NoNewPrivs(nix::Error),
    /// `PR_SET_DUMPABLE` failed.
    #[error("PR_SET_DUMPABLE: {0}")]
    Dumpable(nix::Error),
}

/// Drops every capability from every set, bounding and ambient included, and
/// locks the securebits when the process may still change them.
pub(crate) fn drop_all() -> Result<String, CapsError> {
    let mut locked = false;
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        for cap in caps::all() {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|source| CapsError::Bounding { cap, source })?;
        }
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS_LOCKED, 0, 0, 0) } != 0 {
            return Err(CapsError::Securebits(std::io::Error::last_os_error()));
        }
        locked = true;
    }
    caps::clear(None, CapSet::Ambient).map_err(clear("ambient"))?;
    caps::clear(None, CapSet::Inheritable).map_err(clear("inheritable"))?;
    caps::clear(None, CapSet::Effective).map_err(clear("effective"))?;
    caps::clear(None, CapSet::Permitted).map_err(clear("permitted"))?;
    let bounding = caps::read(None, CapSet::Bounding)
        .map(|s| s.len())
        .unwrap_or(usize::MAX);
    Ok(format!(
        "all sets empty (bounding: {bounding} left){}",
        if locked { ", securebits locked" } else { "" }
    ))
}

/// Sets `no_new_privs`.
pub(crate) fn set_no_new_privs() -> Result<(), CapsError> {
    nix::sys::prctl::set_no_new_privs().map_err(CapsError::NoNewPrivs)
}

/// Makes the process non-dumpable: its /proc entries become root-owned and it
/// cannot be ptraced by same-uid processes.
pub(crate) fn set_nondumpable() -> Result<(), CapsError> {
    nix::sys::prctl::set_dumpable(false).map_err(CapsError::Dumpable)
}

/// The error of clearing `set`.
fn clear(set: &'static str) -> impl FnOnce(caps::errors::CapsError) -> CapsError {
    move |source| CapsError::Clear { set, source }
}
