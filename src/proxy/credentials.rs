//! Credentials the agent uses but never holds (`[[credentials]]`): the
//! supervisor reads each real value on the host when the instance starts,
//! the sandbox sees only a placeholder made for this instance
//! (`sandmux-cred-` and 32 hex digits), and the proxy puts the real value in
//! place of the placeholder in the headers of a request it intercepts for
//! one of the credential's hosts (inside `Authorization: Basic` too). A
//! placeholder anywhere else the proxy reads (another host, a URL, a body,
//! plain HTTP) is refused as an exfiltration attempt; a real value in an
//! answer reaches the sandbox as its placeholder. Values are never printed,
//! logged or audited: names, hosts and counts only.

use crate::profile::credentials::{Credential, From};
use crate::profile::Policy;
use crate::secretfile::{self, Stamp};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

#[path = "credentials_where.rs"]
mod place;
#[path = "credentials_refresh.rs"]
mod refresh;
use super::shape::{basic, Shape};
use place::{runnable, visible};
pub(crate) use refresh::FetchError;

/// What every placeholder starts with.
pub(crate) const PREFIX: &str = "sandmux-cred-";
/// A placeholder's length (the prefix and 32 hex digits).
pub(crate) const PLACEHOLDER_LEN: usize = PREFIX.len() + 32;
/// Shortest real value accepted (a shorter one would be found in answers by
/// chance).
pub(crate) const MIN_VALUE: usize = 8;
/// Longest real value accepted.
pub(crate) const MAX_VALUE: usize = 4096;
/// Values replaced by a rotation that answers are still masked for.
const PAST: usize = 8;

/// Why the credentials cannot be had: the instance does not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CredError {
    /// `from_env` names a variable the supervisor does not have.
    #[error("credential {name}: the variable {var} is not set in sandmux's environment (from_env); set it where sandmux starts, or take the credential out of the profile")]
    Missing {
        /// The credential.
        name: String,
        /// The variable.
        var: String,
    },
    /// The value cannot be used.
    #[error("credential {name}: {why}")]
    Unusable {
        /// The credential.
        name: String,
        /// Why.
        why: String,
    },
    /// The credential `name`'s `from_file` was refused.
    #[error("credential {name}: {source}")]
    File {
        name: String,
        source: secretfile::SecretFileError,
    },
    /// The credential `name`'s `from_command` gave no value.
    #[error("credential {name}: from_command: {source}")]
    Command {
        name: String,
        source: refresh::FetchError,
    },
    /// Its source is where the sandbox could reach it.
    #[error("credential {name}: {source}")]
    Place {
        /// The credential.
        name: String,
        /// Where and why.
        source: place::PlaceError,
    },
    /// The TLS settings.
    #[error(transparent)]
    Tls(#[from] super::ca::CaError),
}

/// One credential as the supervisor holds it.
struct Held {
    name: String,
    hosts: Vec<String>,
    /// The headers it is put into (lowercase).
    headers: Vec<String>,
    /// Values replaced by a rotation (the last [`PAST`]): still masked.
    past: std::sync::Mutex<Vec<Arc<Vec<u8>>>>,
    placeholder: String,
    file: Option<PathBuf>,
    /// `from_command`: its entry (the index is the profile's).
    command: Option<(usize, Credential)>,
    /// When 401s asked for a refresh lately (bounded: `refresh::FORCED`).
    forced: std::sync::Mutex<std::collections::VecDeque<Instant>>,
    value: RwLock<Value>,
    revoked: AtomicBool,
    used: AtomicU64,
    refused: AtomicU64,
}

/// The value in force, and what the file was when it was read.
struct Value {
    bytes: Arc<Vec<u8>>,
    stamp: Option<Stamp>,
    /// The file changed and cannot be used, or the command failed: nothing
    /// is sent until it can.
    unusable: Option<String>,
    /// `from_command`: when the value ends, when it is refreshed, when a
    /// failed refresh is tried again, and whether a 401 already asked for
    /// this value's refresh (one per value).
    expires: Option<Instant>,
    refresh_at: Option<Instant>,
    retry_at: Option<Instant>,
    rejected: bool,
    /// Failed refreshes in a row.
    failures: u32,
}

impl Value {
    fn new(bytes: Vec<u8>, stamp: Option<Stamp>, life: Option<std::time::Duration>) -> Value {
        let now = Instant::now();
        Value {
            bytes: Arc::new(bytes),
            stamp,
            unusable: None,
            expires: life.map(|l| now + l),
            refresh_at: life.map(|l| now + l.mul_f64(refresh::AT)),
            retry_at: None,
            rejected: false,
            failures: 0,
        }
    }
}

/// The instance's credentials and the TLS settings of the connections the
/// proxy intercepts for them.
pub(crate) struct Vault {
    held: Vec<Held>,
    /// Wakes the `from_command` refresher.
    wake: refresh::Wake,
    /// The credential headers sent lately: every answer masks their cuts
    /// (`super::echo`).
    pub(crate) sent: super::echo::Remembered,
    /// The CA and both TLS sides.
    pub(crate) tls: super::ca::Tls,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.held.iter().map(|h| h.name.as_str()).collect();
        f.debug_struct("Vault").field("names", &names).finish()
    }
}

/// A request the proxy refuses for a credential's sake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// What to answer.
    pub code: u16,
    /// Why, in sandmux's words (names and hosts only).
    pub why: String,
    /// An exfiltration attempt (a placeholder where it does not belong).
    pub exfiltration: bool,
}

fn check_value(name: &str, v: &[u8]) -> Result<(), CredError> {
    let bad = |why: String| CredError::Unusable {
        name: name.to_string(),
        why,
    };
    if v.len() < MIN_VALUE || v.len() > MAX_VALUE {
        return Err(bad(format!(
            "the value must be {MIN_VALUE}-{MAX_VALUE} bytes (it has {})",
            v.len()
        )));
    }
    if !v.iter().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "the value must be printable ASCII without spaces (it goes into HTTP headers)".into(),
        ));
    }
    if v.windows(PREFIX.len()).any(|w| w == PREFIX.as_bytes()) {
        return Err(bad(format!("the value contains {PREFIX}")));
    }
    Ok(())
}

fn read_file(path: &std::path::Path) -> Result<(Vec<u8>, Stamp), secretfile::SecretFileError> {
    let what = format!("from_file {}", path.display());
    secretfile::read(path, &what, (MIN_VALUE, MAX_VALUE))
}

impl Vault {
    /// Reads every credential of `creds` (None when there are none), makes
    /// the placeholders and the CA. A `from_env` variable, and every other
    /// variable holding a credential's value, is taken out of this process's
    /// environment, so that no sandbox started later can inherit it.
    pub(crate) fn open(
        creds: &[Credential],
        upstream_ca: &[PathBuf],
    ) -> Result<Option<Vault>, CredError> {
        if creds.is_empty() {
            return Ok(None);
        }
        let mut held = Vec::new();
        for (i, c) in creds.iter().enumerate() {
            held.push(read_one(i, c)?);
        }
        let values: Vec<Arc<Vec<u8>>> = held.iter().map(|h| h.current()).collect();
        for (k, v) in std::env::vars_os() {
            let v = v.as_encoded_bytes();
            if values.iter().any(|s| contains(v, s)) {
                std::env::remove_var(k);
            }
        }
        let mut hosts: Vec<String> = held.iter().flat_map(|h| h.hosts.clone()).collect();
        hosts.sort();
        hosts.dedup();
        let tls = super::ca::Tls::new(&hosts, upstream_ca)?;
        Ok(Some(Vault {
            held,
            tls,
            wake: Default::default(),
            sent: Default::default(),
        }))
    }

    /// The variables every process inside gets: each credential's
    /// placeholder, and git's credential helper for its hosts (git sends
    /// the placeholder as the password, which the proxy replaces).
    pub(crate) fn inside_env(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .held
            .iter()
            .map(|h| (h.name.clone(), h.placeholder.clone()))
            .collect();
        // One helper per credential: it answers for its hosts on any port
        // (git's per-URL keys would need the port written out).
        let git: Vec<(String, String)> = self
            .held
            .iter()
            .map(|h| {
                let hosts = h.hosts.join("|");
                (
                    "credential.helper".to_string(),
                    format!(
                        "!f() {{ test \"$1\" = get || return 0; h=; while IFS== read -r k v; do test \"$k\" = host && h=\"${{v%%:*}}\"; done; case \"$h\" in {hosts}) echo username=x-access-token; echo \"password=${}\";; esac; }}; f",
                        h.name
                    ),
                )
            })
            .collect();
        v.push(("GIT_CONFIG_COUNT".into(), git.len().to_string()));
        for (i, (k, val)) in git.into_iter().enumerate() {
            v.push((format!("GIT_CONFIG_KEY_{i}"), k));
            v.push((format!("GIT_CONFIG_VALUE_{i}"), val));
        }
        v
    }

    /// Every host a credential may be sent to (sorted, once each).
    pub(crate) fn hosts(&self) -> Vec<String> {
        let mut v: Vec<String> = self.held.iter().flat_map(|h| h.hosts.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Whether the proxy intercepts connections to `host` (a credential
    /// may be sent there).
    pub(crate) fn intercepts(&self, host: &str) -> bool {
        self.held.iter().any(|h| h.hosts.iter().any(|x| x == host))
    }

    /// Reads again each `from_file` value whose file changed (one `stat`
    /// each): the old value stops at once; a file that cannot be used sends
    /// nothing until it can.
    fn refresh(&self) {
        for h in &self.held {
            let Some(path) = &h.file else { continue };
            let now = secretfile::stamp(path);
            let same = {
                let v = h.value.read().unwrap_or_else(|p| p.into_inner());
                now.is_some() && now == v.stamp && v.unusable.is_none()
            };
            if same {
                continue;
            }
            let mut v = h.value.write().unwrap_or_else(|p| p.into_inner());
            // What the value's users are told (a message, kept as shown).
            let read = read_file(path).map_err(|e| e.to_string());
            match read.and_then(|(b, s)| {
                check_value(&h.name, &b).map_err(|e| e.to_string())?;
                Ok((b, s))
            }) {
                Ok((b, s)) => {
                    if b != *v.bytes || v.unusable.is_some() {
                        tracing::info!(credential = %h.name, "credential: the file changed; its new value is in force");
                    }
                    if b != *v.bytes {
                        let mut past = h.past.lock().unwrap_or_else(|p| p.into_inner());
                        past.push(v.bytes.clone());
                        let extra = past.len().saturating_sub(PAST);
                        past.drain(..extra);
                    }
                    *v = Value::new(b, Some(s), None);
                }
                Err(why) => {
                    if v.unusable.as_deref() != Some(why.as_str()) {
                        tracing::warn!(credential = %h.name, "credential: {why}; nothing is sent until the file can be used");
                    }
                    v.unusable = Some(why);
                    v.stamp = now;
                }
            }
        }
    }

    /// The credential whose placeholder is in `b`, if any.
    fn found_in(&self, b: &[u8]) -> Option<&Held> {
        memchr::memmem::find_iter(b, PREFIX.as_bytes()).find_map(|at| {
            let p = b.get(at..at + PLACEHOLDER_LEN)?;
            self.held.iter().find(|h| h.placeholder.as_bytes() == p)
        })
    }

    /// Refuses `b` (a URL, a plain request's head or body, an intercepted
    /// body) when it carries a placeholder: `where_` says where.
    pub(crate) fn refuse_in(&self, b: &[u8], host: &str, where_: &str) -> Result<(), Refused> {
        match self.found_in(b) {
            None => Ok(()),
            Some(h) => Err(self.exfiltration(h, host, where_)),
        }
    }

    fn exfiltration(&self, h: &Held, host: &str, where_: &str) -> Refused {
        h.refused.fetch_add(1, Ordering::Relaxed);
        Refused {
            code: 403,
            why: format!("sandmux proxy: exfiltration refused: the placeholder of credential {} was sent to {host} {where_}; it is only ever replaced in the headers of HTTPS requests to {}", h.name, h.hosts.join(", ")),
            exfiltration: true,
        }
    }

    /// Puts the real value into one header bound for `host`, in exactly
    /// these shapes: the whole value (`X-Api-Key: <placeholder>`), after
    /// `Bearer ` or `token ` (sent in that spelling), or as the password of
    /// `Basic` (`user:<placeholder>`, base64), and only in a header the
    /// credential names (`headers`, `Authorization` by default). A
    /// placeholder anywhere else in a header is refused: a header of the
    /// agent's choosing could be one the host echoes, logs or forwards.
    pub(crate) fn header(
        &self,
        name: &str,
        value: &[u8],
        host: &str,
    ) -> Result<Option<Vec<u8>>, Refused> {
        use base64::Engine;
        let e = base64::engine::general_purpose::STANDARD;
        let decoded = basic(value).and_then(|b| e.decode(b).ok());
        let (h, shape) = match (self.found_in(value), &decoded) {
            (Some(h), _) => (h, Shape::of(value, &h.placeholder)),
            (None, Some(d)) => match self.found_in(d) {
                Some(h) => (h, Shape::basic(d, &h.placeholder)),
                None => return Ok(None),
            },
            (None, None) => return Ok(None),
        };
        let place = format!("in header {name}");
        if !h.hosts.iter().any(|x| x == host) {
            return Err(self.exfiltration(h, host, &place));
        }
        if !h.headers.iter().any(|x| x.eq_ignore_ascii_case(name)) || shape.is_none() {
            let mut r = self.exfiltration(h, host, &place);
            r.why = format!("sandmux proxy: exfiltration refused: the placeholder of credential {} is put in only as the whole value of {}, after `Bearer ` or `token `, or as Basic's password; {place} it is refused", h.name, h.headers.join(", "));
            return Err(r);
        }
        self.refresh();
        if h.revoked.load(Ordering::Relaxed) {
            return Err(Refused {
                code: 403,
                why: format!("sandmux proxy: credential {} is revoked by the operator (sandmux grant ID --credential {} restores it)", h.name, h.name),
                exfiltration: false,
            });
        }
        let v = h.value.read().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = self.expired(h, &v) {
            return Err(r);
        }
        if let Some(why) = &v.unusable {
            return Err(Refused {
                code: 503,
                why: format!(
                    "sandmux proxy: credential {} cannot be used now: {why}",
                    h.name
                ),
                exfiltration: false,
            });
        }
        h.used.fetch_add(1, Ordering::Relaxed);
        Ok(Some(match shape {
            Some(Shape::Whole) => v.bytes.to_vec(),
            Some(Shape::Scheme(s)) => [s.as_bytes(), b" ", &v.bytes[..]].concat(),
            Some(Shape::Basic(n)) => {
                let user = decoded.as_deref().map(|d| &d[..n]).unwrap_or_default();
                let plain = [user, &v.bytes[..]].concat();
                [&b"Basic "[..], e.encode(plain).as_bytes()].concat()
            }
            None => unreachable!("refused above"),
        }))
    }

    /// The (what is masked, its mask) pairs answers are masked with: each
    /// real value as it is, in hex and in base64 (standard and URL-safe, at
    /// each of the three alignments, so any base64 text that holds the
    /// value, a `Basic` header's included, is caught), and `sent`: the
    /// header values this exchange's request carried after substitution
    /// (masked back to what the sandbox wrote).
    pub(crate) fn masks(&self, sent: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Arc<Vec<u8>>, Vec<u8>)> {
        let mut out: Vec<(Arc<Vec<u8>>, Vec<u8>)> = sent
            .iter()
            .map(|(new, old)| (Arc::new(new.clone()), old.clone()))
            .collect();
        for h in &self.held {
            let p = h.placeholder.clone().into_bytes();
            let past = h.past.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for v in past.into_iter().chain([h.current()]) {
                for e in encodings(&v) {
                    out.push((Arc::new(e), p.clone()));
                }
                out.push((v, p.clone()));
            }
        }
        out
    }

    /// Revokes (`on` false) or grants again one credential; false when no
    /// credential has that name.
    pub(crate) fn set_granted(&self, name: &str, on: bool) -> bool {
        match self.held.iter().find(|h| h.name == name) {
            Some(h) => {
                h.revoked.store(!on, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// What `sandbox_status` says of each credential (never a value).
    pub(crate) fn status(&self) -> serde_json::Value {
        let v: Vec<serde_json::Value> = self
            .held
            .iter()
            .map(|h| {
                serde_json::json!({
                    "name": h.name,
                    "send_to": h.hosts,
                    "revoked": h.revoked.load(Ordering::Relaxed),
                    "times_used": h.used.load(Ordering::Relaxed),
                    "exfiltration_refused": h.refused.load(Ordering::Relaxed),
                    "source": match (&h.file, &h.command) {
                        (Some(_), _) => "from_file",
                        (_, Some(_)) => "from_command",
                        _ => "from_env",
                    },
                    "usable": self.usable(h),
                })
            })
            .collect();
        serde_json::Value::Array(v)
    }
}

impl Held {
    fn current(&self) -> Arc<Vec<u8>> {
        self.value
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .bytes
            .clone()
    }
}

impl Vault {
    /// Starts the `from_command` refresher in this process, for `run` and
    /// `shell` (whose supervisor is not confined).
    pub(crate) fn start_here(self: &Arc<Self>, creds: &[Credential]) {
        self.start(refresh::here(creds), refresh::logged());
    }
}

/// Opens the credentials of `policy` (None without credentials): what the
/// sandbox gets of them (placeholders, git's helper, the instance's CA)
/// the vault gives as values ([`Vault::inside_env`], its CA), which
/// `supervisor::launch` puts into the policy the sandbox is built from.
/// A `from_command` is refreshed once [`Vault::start`] is called: by `run`
/// and `shell` at once, by `serve` once it has confined itself.
pub(crate) fn open(policy: &Policy) -> Result<Option<Arc<Vault>>, CredError> {
    for c in &policy.credentials {
        let seen = match c.from() {
            From::File(path) => visible(policy, path),
            From::Command(argv) => runnable(policy, argv),
            From::Env(_) => Ok(()),
        };
        seen.map_err(|source| CredError::Place {
            name: c.name.clone(),
            source,
        })?;
    }
    let Some(v) = Vault::open(&policy.credentials, &policy.network.upstream_ca)? else {
        return Ok(None);
    };
    Ok(Some(Arc::new(v)))
}

fn read_one(index: usize, c: &Credential) -> Result<Held, CredError> {
    let name = c.name.clone();
    let (mut life, mut command) = (None, None);
    let (bytes, stamp, file) = match c.from() {
        From::Env(var) => {
            let v = std::env::var_os(var).ok_or_else(|| CredError::Missing {
                name: name.clone(),
                var: var.to_string(),
            })?;
            (v.into_encoded_bytes(), None, None)
        }
        From::File(path) => {
            let (b, s) = read_file(path).map_err(|source| CredError::File {
                name: name.clone(),
                source,
            })?;
            (b, Some(s), Some(path.to_path_buf()))
        }
        From::Command(_) => {
            let (b, l) = refresh::fetch(c, &refresh::here(std::slice::from_ref(c)), 0).map_err(
                |source| CredError::Command {
                    name: name.clone(),
                    source,
                },
            )?;
            (life, command) = (l, Some((index, c.clone())));
            (b, None, None)
        }
    };
    check_value(&name, &bytes)?;
    Ok(Held {
        command,
        forced: Default::default(),
        placeholder: format!("{PREFIX}{}", crate::nonce::hex()),
        hosts: c.hosts(),
        headers: c.headers(),
        past: Default::default(),
        name,
        file,
        value: RwLock::new(Value::new(bytes, stamp, life)),
        revoked: AtomicBool::new(false),
        used: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    })
}

/// `v` in hex (both cases) and the parts of its base64 that any base64 text
/// holding it contains, whatever comes before it (both alphabets).
fn encodings(v: &[u8]) -> Vec<Vec<u8>> {
    use base64::Engine;
    let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = vec![
        hex.clone().into_bytes(),
        hex.to_ascii_uppercase().into_bytes(),
    ];
    for skip in 0..3usize {
        let rest = &v[skip.min(v.len())..];
        let whole = &rest[..rest.len() / 3 * 3];
        if whole.len() < 6 {
            continue;
        }
        let std = base64::engine::general_purpose::STANDARD_NO_PAD.encode(whole);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(whole);
        if url != std {
            out.push(url.into_bytes());
        }
        out.push(std.into_bytes());
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

#[cfg(test)]
#[path = "credentials_tests.rs"]
mod tests;
