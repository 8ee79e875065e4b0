//! The keyring layer (E8): the sandbox joins a fresh, empty session keyring,
//! so keys of the caller's session are not attached to anything inside (the
//! seccomp filter also denies every keyring call inside). A container
//! runtime's seccomp profile may refuse `keyctl`; the layer is then dropped
//! where the profile allows it (the `container` built-in does) and refused
//! otherwise.

/// Why no fresh session keyring was joined.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyringError {
    /// `keyctl(KEYCTL_JOIN_SESSION_KEYRING)` failed.
    #[error("keyctl(KEYCTL_JOIN_SESSION_KEYRING): {0}")]
    Join(std::io::Error),
}

/// Joins a new anonymous session keyring; says which.
pub(crate) fn fresh_session() -> Result<String, KeyringError> {
    // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) passes no pointers we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            1, /* KEYCTL_JOIN_SESSION_KEYRING */
            std::ptr::null::<u8>(),
        )
    };
    if r < 0 {
        Err(KeyringError::Join(std::io::Error::last_os_error()))
    } else {
        Ok(format!("a new, empty session keyring (serial {r})"))
    }
}
