//! `from_command` credentials: short-lived values a host-side command
//! prints (`crate::secretcmd`), refreshed by one thread of the supervisor
//! at [`AT`] of their lifetime and after a 401 from a credential host (once
//! per value: an agent cannot make the proxy ask again and again). The
//! command itself runs where the host is still reachable: in the broker
//! under `serve` (a request names the credential's index in the profile,
//! fixed at start, never a command), on this thread under `run` and
//! `shell`. A failed refresh makes the credential unusable at once (503,
//! with the reason) until a later one succeeds (tried again after
//! [`RETRY`]); each refresh and each failure is an event (audited under
//! `serve`), with names and reasons only.

use super::{check_value, contains, Held, Refused, Value, Vault, PAST};
use crate::profile::credentials::{Credential, From};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Runs credential N's command (N: its index in the profile), returning its
/// output.
pub(crate) type Runner = Arc<dyn Fn(usize) -> Result<Vec<u8>, FetchError> + Send + Sync>;

/// Why a `from_command` credential has no new value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// The command, run here, failed or printed no value.
    #[error(transparent)]
    Command(#[from] crate::secretcmd::SecretCmdError),
    /// The credential has no command.
    #[error("credential {0} has no from_command")]
    NoCommand(usize),
    /// Whoever runs the command elsewhere (`serve`'s broker) failed.
    #[error(transparent)]
    Elsewhere(Box<dyn std::error::Error + Send + Sync>),
    /// The value it printed cannot be used: why.
    #[error("{0}")]
    Unusable(String),
}
/// Where refresh events go: the kind and its arguments (names only).
pub(crate) type Events = Arc<dyn Fn(&str, serde_json::Value) + Send + Sync>;

/// Refreshes 401s may ask for: this many within this window (an agent
/// that causes 401s on purpose makes the token endpoint be asked at most
/// this often).
pub(super) const FORCED: (usize, Duration) = (3, Duration::from_secs(90));

/// The share of a value's lifetime after which it is refreshed.
pub(super) const AT: f64 = 0.8;
/// A failed refresh is tried again after this many seconds, doubled at
/// each failure up to the second figure.
const RETRY: (u64, u64) = (5, 60);

/// The refresher's wake-up: the credentials a 401 asked to refresh.
#[derive(Default)]
pub(super) struct Wake {
    forced: Mutex<Vec<usize>>,
    cv: Condvar,
    started: AtomicBool,
}

/// A runner that runs the command on the calling thread (`run`, `shell`,
/// the first value at start).
pub(super) fn here(creds: &[Credential]) -> Runner {
    let creds = creds.to_vec();
    Arc::new(move |i| match creds.get(i).map(|c| (c, c.from())) {
        Some((c, From::Command(argv))) => Ok(crate::secretcmd::run(
            argv,
            &c.command_env,
            c.command_timeout(),
        )?),
        _ => Err(FetchError::NoCommand(i)),
    })
}

/// Events to the log only (`run`, `shell`: no audit log).
pub(super) fn logged() -> Events {
    Arc::new(|kind, args| tracing::info!(event = kind, %args, "credential"))
}

/// Runs credential `c` (index `i`) and checks its value.
pub(super) fn fetch(
    c: &Credential,
    run: &Runner,
    i: usize,
) -> Result<(Vec<u8>, Option<Duration>), FetchError> {
    let out = run(i)?;
    let (v, life) = crate::secretcmd::parse(&out, c.lifetime_seconds)?;
    check_value(&c.name, &v).map_err(|e| match e {
        super::CredError::Unusable { why, .. } => FetchError::Unusable(why),
        e => FetchError::Unusable(e.to_string()),
    })?;
    Ok((v, life))
}

impl Vault {
    /// Starts the refresher of the `from_command` credentials (none: does
    /// nothing), once. `serve` calls it after confining itself, so the
    /// thread is confined too, with the broker as `run`.
    pub(crate) fn start(self: &Arc<Self>, run: Runner, events: Events) {
        if !self.held.iter().any(|h| h.command.is_some())
            || self.wake.started.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let v = self.clone();
        let spawned = std::thread::Builder::new()
            .name("sandmux-cred-refresh".into())
            .spawn(move || loop {
                let (due, next) = v.due();
                for (k, why) in &due {
                    v.refresh_one(*k, &run, &events, why);
                }
                if due.is_empty() {
                    v.sleep(next);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("credentials: the refresher thread: {e}; from_command values end with their lifetime");
        }
    }

    /// A credential host answered 401 to a request that carried these
    /// (sent, as the sandbox wrote it) header values: each `from_command`
    /// value among them is refreshed, once per value.
    pub(crate) fn rejected(&self, sent: &[(Vec<u8>, Vec<u8>)]) {
        use base64::Engine;
        let e = base64::engine::general_purpose::STANDARD;
        let decoded = |b: &[u8]| crate::proxy::shape::basic(b).and_then(|x| e.decode(x).ok());
        for (new, old) in sent {
            let h = self
                .found_in(old)
                .or_else(|| decoded(old).and_then(|d| self.found_in(&d)));
            let Some(k) = h.and_then(|h| self.held.iter().position(|x| std::ptr::eq(x, h))) else {
                continue;
            };
            let h = &self.held[k];
            if h.command.is_none() {
                continue;
            }
            let mut v = h.value.write().unwrap_or_else(|p| p.into_inner());
            let carried =
                contains(new, &v.bytes) || decoded(new).is_some_and(|d| contains(&d, &v.bytes));
            // Once per value, and a few at most per window: each refresh
            // makes a new value, and 401s are the agent's to cause.
            if carried && !v.rejected && h.may_force() {
                v.rejected = true;
                drop(v);
                let mut f = self.wake.forced.lock().unwrap_or_else(|p| p.into_inner());
                f.push(k);
                self.wake.cv.notify_all();
            }
        }
    }

    /// The refusal for a value past its lifetime (the refresher is late or
    /// failing); it is woken.
    pub(super) fn expired(&self, h: &Held, v: &Value) -> Option<Refused> {
        let end = v.expires?;
        if v.unusable.is_some() || Instant::now() < end {
            return None;
        }
        self.wake.cv.notify_all();
        Some(Refused {
            code: 503,
            why: format!("sandmux proxy: credential {} cannot be used now: its value outlived its lifetime and no refresh has succeeded yet (from_command; sandmux is refreshing it)", h.name),
            exfiltration: false,
        })
    }

    /// Whether a credential's value may be sent now.
    pub(super) fn usable(&self, h: &Held) -> bool {
        let v = h.value.read().unwrap_or_else(|p| p.into_inner());
        v.unusable.is_none() && v.expires.is_none_or(|e| Instant::now() < e)
    }

    /// The credentials to refresh now (and why), and when the next one is due.
    fn due(&self) -> (Vec<(usize, &'static str)>, Option<Instant>) {
        let now = Instant::now();
        let forced =
            std::mem::take(&mut *self.wake.forced.lock().unwrap_or_else(|p| p.into_inner()));
        let (mut due, mut next) = (Vec::new(), None::<Instant>);
        for (k, h) in self
            .held
            .iter()
            .enumerate()
            .filter(|(_, h)| h.command.is_some())
        {
            if forced.contains(&k) {
                due.push((k, "a 401 from a credential host"));
                continue;
            }
            let v = h.value.read().unwrap_or_else(|p| p.into_inner());
            let at = match v.unusable {
                Some(_) => v.retry_at.map(|t| (t, "a retry after a failure")),
                None => v.refresh_at.map(|t| (t, "its lifetime")),
            };
            match at {
                Some((t, why)) if t <= now => due.push((k, why)),
                Some((t, _)) => next = Some(next.map_or(t, |n| n.min(t))),
                None => {}
            }
        }
        (due, next)
    }

    /// Waits until `next` or a 401.
    fn sleep(&self, next: Option<Instant>) {
        let g = self.wake.forced.lock().unwrap_or_else(|p| p.into_inner());
        if !g.is_empty() {
            return;
        }
        let wait = next.map_or(Duration::from_secs(3600), |n| {
            n.saturating_duration_since(Instant::now())
        });
        let _ = self.wake.cv.wait_timeout(g, wait);
    }

    fn refresh_one(&self, k: usize, run: &Runner, events: &Events, why: &str) {
        let h = &self.held[k];
        let Some((i, c)) = &h.command else { return };
        let got = fetch(c, run, *i);
        let mut v = h.value.write().unwrap_or_else(|p| p.into_inner());
        match got {
            Ok((b, life)) => {
                if b != *v.bytes {
                    let mut past = h.past.lock().unwrap_or_else(|p| p.into_inner());
                    past.push(v.bytes.clone());
                    let extra = past.len().saturating_sub(PAST);
                    past.drain(..extra);
                }
                *v = Value::new(b, None, life);
                let args = serde_json::json!({"name": h.name, "why": why, "expires_in": life.map(|l| l.as_secs())});
                events("credential_refreshed", args);
            }
            Err(e) => {
                v.failures += 1;
                let wait = (RETRY.0 << (v.failures - 1).min(6)).min(RETRY.1);
                v.unusable = Some(format!(
                    "its from_command failed: {e} (sandmux tries again in {wait} s)"
                ));
                v.retry_at = Some(Instant::now() + Duration::from_secs(wait));
                tracing::warn!(credential = %h.name, "credential: from_command failed ({why}): {e}; nothing is sent until a refresh succeeds");
                let args = serde_json::json!({"name": h.name, "why": why, "error": e.to_string()});
                events("credential_refresh_failed", args);
            }
        }
    }
}

impl Held {
    /// Whether a 401 may ask for one more refresh now ([`FORCED`]); counts it.
    fn may_force(&self) -> bool {
        let mut f = self.forced.lock().unwrap_or_else(|p| p.into_inner());
        while f.front().is_some_and(|t| t.elapsed() > FORCED.1) {
            f.pop_front();
        }
        let ok = f.len() < FORCED.0;
        if ok {
            f.push_back(Instant::now());
        }
        ok
    }
}
