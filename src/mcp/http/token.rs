//! The Bearer token of `serve --http`: read from `--token-file` (a file only
//! its owner can read or write), or, for a loopback bind only, generated into
//! the instance's runtime directory (0700, shown by `sandmux ps`). Compared in
//! constant time; audit records name it by a short digest, never itself.

use sha2::{Digest, Sha256};
use std::os::unix::fs::OpenOptionsExt;
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
    /// The file it was read from, as the open file was (see [`Current`]).
    stamp: Option<Stamp>,
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
            stamp: None,
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

/// Why a token could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    /// The token file (its checks and reading).
    #[error(transparent)]
    File(#[from] crate::secretfile::SecretFileError),
    /// A given token's length (the bytes it has).
    #[error("the token must be {MIN_LEN}-{MAX_LEN} bytes (it has {0})")]
    Length(usize),
    /// A given token with other than printable ASCII.
    #[error("the token must be one line of printable ASCII without spaces")]
    NotPrintable,
    /// The generated token could not be written.
    #[error("writing the token to {}: {source}", path.display())]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// `sandmux token set` on an instance not started `--unclaimed`.
    #[error("this instance was not started --unclaimed: its token comes from --token-file (replace that file) or was generated")]
    NotSettable,
}

/// Reads `--token-file` (see `crate::secretfile`: owned by this user or
/// root, mode 0400 or stricter, one line of 16–4096 printable bytes).
pub(crate) fn read(path: &Path) -> Result<Token, TokenError> {
    let what = format!("--token-file {}", path.display());
    let (secret, stamp) = crate::secretfile::read(path, &what, (MIN_LEN, MAX_LEN))?;
    let mut token = Token::new(secret);
    token.stamp = Some(stamp);
    Ok(token)
}

/// A token the operator gave (`sandmux token set`, read from its stdin):
/// the same rules as a token file's line (16–4096 printable bytes, no
/// spaces; surrounding white space trimmed).
pub(crate) fn given(secret: &[u8]) -> Result<Token, TokenError> {
    let t = secret.trim_ascii();
    if t.len() < MIN_LEN || t.len() > MAX_LEN {
        return Err(TokenError::Length(t.len()));
    }
    if !t.iter().all(|b| b.is_ascii_graphic()) {
        return Err(TokenError::NotPrintable);
    }
    Ok(Token::new(t.to_vec()))
}

/// A fresh random token, written 0600 to `path` (in the instance's 0700
/// runtime directory); the file must not exist yet.
pub(crate) fn generate(path: &Path) -> Result<Token, TokenError> {
    let secret = format!("{}{}", crate::nonce::hex(), crate::nonce::hex());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| TokenError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    use std::io::Write;
    writeln!(f, "{secret}").map_err(|source| TokenError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Token::new(secret.into_bytes()))
}

use crate::secretfile::{stamp, Stamp};

/// What a look at the token file found.
#[derive(Debug, PartialEq)]
pub(crate) enum Change {
    /// The same file as before (or still the same trouble).
    None,
    /// A new token is in force (its digest).
    Replaced(String),
    /// The file cannot be used: no token admits anything until it can.
    Unusable(String),
}

/// The token in force. From `--token-file`, the file is looked at (one
/// `stat`) before every request and read again when it changed (a rotated
/// Secret): the old token stops working at once, and a file that cannot be
/// used (gone, a wrong mode, a bad token) admits nothing until it can (fail
/// closed; read again at every request until then, so a passing error such
/// as too many open files does not lock clients out). The stamp kept is the
/// opened file's, so a change between the look and the read is seen at the
/// next request. A generated token never changes.
pub(crate) struct Current {
    path: Option<std::path::PathBuf>,
    held: std::sync::Mutex<Held>,
    /// Started `--unclaimed`: no token until the operator sets one.
    settable: bool,
}

struct Held {
    token: Option<std::sync::Arc<Token>>,
    /// The last reason the file could not be used, said once.
    unusable: Option<String>,
}

impl Current {
    /// A token that never changes (generated into the runtime directory).
    pub(crate) fn fixed(t: Token) -> Current {
        Current {
            settable: false,
            path: None,
            held: std::sync::Mutex::new(Held {
                token: Some(std::sync::Arc::new(t)),
                unusable: None,
            }),
        }
    }

    /// The token read from `path` at start.
    pub(crate) fn from_file(path: &Path, t: Token) -> Current {
        Current {
            held: std::sync::Mutex::new(Held {
                token: Some(std::sync::Arc::new(t)),
                unusable: None,
            }),
            path: Some(path.to_path_buf()),
            settable: false,
        }
    }

    /// No token yet (`--unclaimed`, a warm pool's pod): nothing is admitted
    /// until [`Current::set`].
    pub(crate) fn unclaimed() -> Current {
        Current {
            path: None,
            held: std::sync::Mutex::new(Held {
                token: None,
                unusable: None,
            }),
            settable: true,
        }
    }

    /// Puts a token the operator gave in force (the first claims the
    /// instance, a later one replaces it: the old one is refused from the
    /// next request on). Only for an instance started `--unclaimed`.
    pub(crate) fn set(&self, t: Token) -> Result<Change, TokenError> {
        if !self.settable {
            return Err(TokenError::NotSettable);
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let same = held.token.as_ref().is_some_and(|old| old.id == t.id);
        let id = t.id.clone();
        held.token = Some(std::sync::Arc::new(t));
        Ok(if same {
            Change::None
        } else {
            Change::Replaced(id)
        })
    }

    /// Started `--unclaimed` and no token set yet.
    pub(crate) fn waiting(&self) -> bool {
        self.settable
            && self
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .token
                .is_none()
    }

    /// The token in force now, and what changed since the last look.
    pub(crate) fn get(&self) -> (Option<std::sync::Arc<Token>>, Change) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(path) = &self.path else {
            return (held.token.clone(), Change::None);
        };
        if let Some(t) = &held.token {
            if t.stamp.is_some() && stamp(path) == t.stamp {
                return (held.token.clone(), Change::None);
            }
        }
        let change = match read(path) {
            Ok(t) => {
                let same = held.token.as_ref().is_some_and(|old| old.id == t.id);
                let id = t.id.clone();
                held.token = Some(std::sync::Arc::new(t));
                held.unusable = None;
                if same {
                    Change::None
                } else {
                    Change::Replaced(id)
                }
            }
            Err(e) => {
                held.token = None;
                // Said once: the same words again are no news.
                let e = e.to_string();
                if held.unusable.as_deref() == Some(e.as_str()) {
                    Change::None
                } else {
                    held.unusable = Some(e.clone());
                    Change::Unusable(e)
                }
            }
        };
        (held.token.clone(), change)
    }
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
    fn a_replaced_file_replaces_the_token_and_an_unusable_one_admits_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let (p, new) = (d.path().join("token"), d.path().join("new"));
        let put = |text: &str, mode: u32| {
            std::fs::write(&new, text).unwrap();
            std::fs::set_permissions(&new, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::rename(&new, &p).unwrap();
        };
        put("aaaaaaaaaaaaaaaaaaaa\n", 0o600);
        let c = Current::from_file(&p, read(&p).unwrap());
        let admits = |c: &Current, t: &[u8]| c.get().0.is_some_and(|k| k.admits(Some(t)));
        assert!(admits(&c, b"Bearer aaaaaaaaaaaaaaaaaaaa"));
        assert_eq!(c.get().1, Change::None);
        put("bbbbbbbbbbbbbbbbbbbb\n", 0o600);
        assert!(matches!(c.get().1, Change::Replaced(_)));
        assert!(!admits(&c, b"Bearer aaaaaaaaaaaaaaaaaaaa"));
        assert!(admits(&c, b"Bearer bbbbbbbbbbbbbbbbbbbb"));
        // Others may read the new file: nothing is admitted, said once.
        put("cccccccccccccccccccc\n", 0o644);
        assert!(matches!(c.get().1, Change::Unusable(e) if e.contains("0644")));
        assert_eq!(c.get().1, Change::None);
        assert!(!admits(&c, b"Bearer bbbbbbbbbbbbbbbbbbbb"));
        assert!(!admits(&c, b"Bearer cccccccccccccccccccc"));
        // Gone: still nothing; back: in force again.
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(c.get().1, Change::Unusable(_)));
        assert!(!admits(&c, b"Bearer cccccccccccccccccccc"));
        put("dddddddddddddddddddd\n", 0o400);
        assert!(admits(&c, b"Bearer dddddddddddddddddddd"));
        // The same token written again is no change.
        put("dddddddddddddddddddd\n", 0o600);
        assert_eq!(c.get().1, Change::None);
        assert!(admits(&c, b"Bearer dddddddddddddddddddd"));
        // A generated token is never looked up again.
        let f = Current::fixed(Token::new(b"eeeeeeeeeeeeeeee".to_vec()));
        assert!(admits(&f, b"Bearer eeeeeeeeeeeeeeee"));
    }

    #[test]
    fn an_unclaimed_instance_admits_nothing_until_set_and_then_only_the_last() {
        let c = Current::unclaimed();
        assert!(c.waiting() && c.get().0.is_none());
        let a = given(b"aaaaaaaaaaaaaaaaaaaa\n").unwrap();
        assert!(matches!(c.set(a), Ok(Change::Replaced(_))));
        assert!(!c.waiting());
        let admits = |t: &[u8]| c.get().0.is_some_and(|k| k.admits(Some(t)));
        assert!(admits(b"Bearer aaaaaaaaaaaaaaaaaaaa"));
        c.set(given(b"bbbbbbbbbbbbbbbbbbbb").unwrap()).unwrap();
        assert!(!admits(b"Bearer aaaaaaaaaaaaaaaaaaaa"));
        assert!(admits(b"Bearer bbbbbbbbbbbbbbbbbbbb"));
        assert!(given(b"short").is_err() && given(b"has a space in it here").is_err());
        let fixed = Current::fixed(Token::new(b"eeeeeeeeeeeeeeee".to_vec()));
        assert!(fixed.set(given(b"bbbbbbbbbbbbbbbbbbbb").unwrap()).is_err());
        assert!(!fixed.waiting());
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
        assert!(read(&p).err().unwrap().to_string().contains("16-4096"));
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
