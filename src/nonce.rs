//! Randomness from the kernel (`getrandom(2)`): instance ids, the separators
//! and sentinels tmux output is framed with, command nonces, the audit log's
//! digest key. They must be unguessable, so there is no fallback to a weak
//! source: if the kernel cannot give randomness, sandmux stops here.

/// `N` random bytes.
pub(crate) fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
        match n {
            n if n > 0 => filled += n as usize,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => panic!(
                "getrandom(2) failed: {} (sandmux needs kernel randomness)",
                std::io::Error::last_os_error()
            ),
        }
    }
    b
}

/// 16 random bytes as 32 hex digits.
pub(crate) fn hex() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    bytes::<16>()
        .iter()
        .flat_map(|x| {
            [
                HEX[usize::from(x >> 4)] as char,
                HEX[usize::from(x & 15)] as char,
            ]
        })
        .collect()
}
