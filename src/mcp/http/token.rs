//! The Bearer token of `serve --http`: read from `--token-file` (a file only
//! its owner can read or write), or, for a loopback bind only, generated into
//! the instance's runtime directory (0700, shown by `sandmux ps`). Compared in
//! constant time; audit records name it by a short digest, never itself.

use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Shortest token accepted from a file, in bytes.
pub(crate) const MIN_LEN: usize = 16;
/// Longest token accepted from a file, in bytes.
pub(crate) const MAX_LEN: usize = 4096;

/// A token and the digest that names it.
pub(crate) struct Token {
    secret: Vec<u8>,
    /// `sha256:` and the first 12 hex digits of its digest (audit records).
    pub(crate) id: String,
}

impl Token {
    fn new(secret: Vec<u8>) -> Token {
        let d = Sha256::digest(&secret);
        let id = d[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        Token {
            secret,
            id: format!("sha256:{id}"),
        }
    }

    /// Whether an `Authorization` header value is `Bearer <this token>`; the
    /// comparison takes the same time wherever the first difference is.
    pub(crate) fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(h) = header else { return false };
        let Some(given) = h
            .strip_prefix(b"Bearer ")
            .or_else(|| h.strip_prefix(b"bearer "))
        else {
            return false;
        };
        ct_eq(given, &self.secret)
    }
}

/// Constant-time equality (the length is not secret: a wrong length is
/// still compared over the whole expected token).
pub(crate) fn ct_eq(given: &[u8], want: &[u8]) -> bool {
    let mut diff = (given.len() != want.len()) as u8;
    for (i, w) in want.iter().enumerate() {
        diff |= w ^ given.get(i).copied().unwrap_or(!w);
    }
    std::hint::black_box(diff) == 0
}

/// Reads `--token-file`: a regular file owned by this user (or root) that
/// neither group nor others can read or write (a Kubernetes Secret mounted
/// with `defaultMode: 0400` and the pod's `runAsUser` passes); one line of
/// 16–4096 printable bytes, surrounding whitespace trimmed. A FIFO or device
/// is refused without waiting on it.
pub(crate) fn read(path: &Path) -> Result<Token, String> {
    let shown = path.display();
    // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of
    // waiting for a writer. Links are followed: Secret files are symlinks.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("--token-file {shown}: {e}"))?;
    let m = f
        .metadata()
        .map_err(|e| format!("--token-file {shown}: {e}"))?;
    if !m.is_file() {
        return Err(format!("--token-file {shown}: not a regular file"));
    }
    let me = nix::unistd::geteuid().as_raw();
    if m.uid() != me && m.uid() != 0 {
        return Err(format!(
            "--token-file {shown}: owned by uid {}, not by this user ({me}) or root",
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return Err(format!("--token-file {shown}: mode {:04o} lets group or others read or write it; chmod 0400 (Kubernetes: the Secret volume's defaultMode: 0400)", m.mode() & 0o7777));
    }
    let mut buf = Vec::new();
    use std::io::Read;
    f.take(MAX_LEN as u64 + 2)
        .read_to_end(&mut buf)
        .map_err(|e| format!("--token-file {shown}: {e}"))?;
    let t = buf.trim_ascii();
    if t.len() < MIN_LEN || t.len() > MAX_LEN {
        return Err(format!(
            "--token-file {shown}: the token must be {MIN_LEN}-{MAX_LEN} bytes (it has {})",
            t.len()
        ));
    }
    if !t.iter().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "--token-file {shown}: the token must be one line of printable ASCII without spaces"
        ));
    }
    Ok(Token::new(t.to_vec()))
}

/// A fresh random token, written 0600 to `path` (in the instance's 0700
/// runtime directory); the file must not exist yet.
pub(crate) fn generate(path: &Path) -> Result<Token, String> {
    let secret = format!("{}{}", crate::nonce::hex(), crate::nonce::hex());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("writing the token to {}: {e}", path.display()))?;
    use std::io::Write;
    writeln!(f, "{secret}").map_err(|e| format!("writing the token to {}: {e}", path.display()))?;
    Ok(Token::new(secret.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_whole_tokens_only() {
        let t = Token::new(b"0123456789abcdef".to_vec());
        assert!(t.admits(Some(b"Bearer 0123456789abcdef")));
        assert!(!t.admits(Some(b"Bearer 0123456789abcde")));
        assert!(!t.admits(Some(b"Bearer 0123456789abcdef0")));
        assert!(!t.admits(Some(b"Basic 0123456789abcdef")));
        assert!(!t.admits(Some(b"Bearer ")));
        assert!(!t.admits(None));
        assert!(t.id.starts_with("sha256:") && !t.id.contains("0123"));
    }

    #[test]
    fn refuses_a_file_others_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        for (mode, ok) in [
            (0o644, false),
            (0o640, false),
            (0o602, false),
            (0o600, true),
            (0o400, true),
        ] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(read(&p).is_ok(), ok, "mode {mode:o}");
        }
        // The loop left it 0400: writable again (only root writes it anyway).
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&p, "short").unwrap();
        assert!(read(&p).err().unwrap().contains("16-4096"));
    }

    #[test]
    fn generated_tokens_are_private_and_fresh() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("token");
        let t = generate(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read(&p).unwrap().id, t.id);
        assert!(generate(&p).is_err(), "never over an existing file");
    }
}
