//! Approvals (`[network] ask`): a request the profile does not allow is
//! held while a human is asked, through the operator's endpoint (`sandmux
//! approvals`, `approve`, `deny`). Every question and answer is an audit
//! record; at most [`MAX_OPEN`] questions are open at once (more are
//! refused at once, saying why); silence past `[mcp] ask_seconds`, a
//! freeze, a stop or the instance's end deny. What an approval grants is
//! exactly what was asked: one name and port, once (that connection, and
//! others to it within [`ONCE_WINDOW`]: a client that gave up and retried
//! is not asked again) or for the instance; it never outlives the instance.

use super::audit::{Audit, Entry};
use crate::proxy::ask::{Asker, Verdict};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// Questions open at once; more are refused at once.
pub(crate) const MAX_OPEN: usize = 8;
/// How long "once" also covers the next connections to the same name.
pub(crate) const ONCE_WINDOW: Duration = Duration::from_secs(10);

/// What an answer grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// This request (and, for a name, the next ones within [`ONCE_WINDOW`]).
    Once,
    /// For the rest of the instance.
    Instance,
}

/// An answer: a grant, or a denial with who said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Allowed.
    Allow(Grant),
    /// Denied by a human.
    Deny,
}

struct Open {
    /// `host:port`.
    name: String,
    asked: SystemTime,
    tx: oneshot::Sender<(Answer, String)>,
}

#[derive(Default)]
struct State {
    next: u64,
    open: BTreeMap<u64, Open>,
    /// Names granted for the instance.
    instance: BTreeSet<String>,
    /// Names granted once, until when.
    once: BTreeMap<String, Instant>,
    /// New questions are refused (frozen or stopping), and why.
    closed: Option<String>,
}

/// The instance's questions and grants.
pub(crate) struct Approvals {
    state: Mutex<State>,
    wait: Duration,
    audit: Arc<Audit>,
}

impl Approvals {
    /// Questions answered within `wait`, recorded in `audit`.
    pub(crate) fn new(wait: Duration, audit: Arc<Audit>) -> Arc<Approvals> {
        Arc::new(Approvals {
            state: Mutex::default(),
            wait,
            audit,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, kind: &str, args: Value) {
        self.audit
            .event(Entry::event("(approvals)", Some(kind), &args));
    }

    /// The proxy's asker.
    pub(crate) fn asker(self: &Arc<Approvals>) -> Asker {
        let me = self.clone();
        Arc::new(move |host, port| {
            let me = me.clone();
            Box::pin(async move { me.ask_name(&format!("{host}:{port}")).await })
        })
    }

    /// Asks about a name (`host:port`, canonical: the proxy's parser
    /// admits nothing else) and waits for the answer.
    async fn ask_name(&self, name: &str) -> Verdict {
        let (id, rx) = {
            let mut s = self.lock();
            if s.instance.contains(name) {
                return Verdict::Allow;
            }
            let now = Instant::now();
            s.once.retain(|_, until| *until > now);
            if s.once.contains_key(name) {
                return Verdict::Allow;
            }
            if let Some(why) = &s.closed {
                return Verdict::Deny(format!("no question can be asked now ({why})"));
            }
            if s.open.len() >= MAX_OPEN {
                drop(s);
                self.record(
                    "question_refused",
                    json!({"name": name, "reason": "too many open questions"}),
                );
                return Verdict::Deny(format!(
                    "{MAX_OPEN} questions are already waiting for a human; this one was not asked"
                ));
            }
            s.next += 1;
            let id = s.next;
            let (tx, rx) = oneshot::channel();
            s.open.insert(
                id,
                Open {
                    name: name.to_string(),
                    asked: SystemTime::now(),
                    tx,
                },
            );
            (id, rx)
        };
        self.record(
            "question_asked",
            json!({"question": id, "kind": "network", "name": name, "via": "operator"}),
        );
        tracing::warn!(question = id, %name, "approval asked: `sandmux approvals` lists it, `sandmux approve ID {id}` or `sandmux deny ID {id}` answers");
        let got = tokio::time::timeout(self.wait, rx).await;
        let (answer, by) = match got {
            Ok(Ok(a)) => a,
            Ok(Err(_)) => (Answer::Deny, "the instance".to_string()),
            Err(_) => {
                self.lock().open.remove(&id);
                self.record(
                    "question_answered",
                    json!({"question": id, "name": name, "answer": "deny", "by": "timeout"}),
                );
                return Verdict::Deny(format!(
                    "no human answered within {} s (silence denies)",
                    self.wait.as_secs()
                ));
            }
        };
        match answer {
            Answer::Allow(g) => {
                let mut s = self.lock();
                match g {
                    Grant::Instance => {
                        s.instance.insert(name.to_string());
                    }
                    Grant::Once => {
                        s.once
                            .insert(name.to_string(), Instant::now() + ONCE_WINDOW);
                    }
                }
                Verdict::Allow
            }
            Answer::Deny if by == "the instance" => Verdict::Deny(
                "the question was withdrawn (the instance is stopping or frozen)".into(),
            ),
            Answer::Deny => Verdict::Deny(format!("a human declined ({by})")),
        }
    }

    /// Answers question `id` (the operator); the first answer wins.
    pub(crate) fn answer(&self, id: u64, a: Answer, by: &str) -> Result<String, String> {
        let open = self.lock().open.remove(&id).ok_or_else(|| {
            format!("no open question {id} (answered, timed out, or never asked)")
        })?;
        let (word, grant) = match &a {
            Answer::Allow(Grant::Once) => ("approve", "once"),
            Answer::Allow(Grant::Instance) => ("approve", "for the instance"),
            Answer::Deny => ("deny", "nothing"),
        };
        self.record(
            "question_answered",
            json!({"question": id, "name": open.name, "answer": word, "granted": grant, "by": by}),
        );
        let name = open.name.clone();
        // The asker may have timed out meanwhile: then nothing is granted.
        if open.tx.send((a, by.to_string())).is_err() {
            return Err(format!("question {id} timed out before the answer"));
        }
        Ok(name)
    }

    /// Denies every open question and asks no more (a freeze, a stop).
    pub(crate) fn close(&self, why: &str) {
        let open: Vec<(u64, Open)> = {
            let mut s = self.lock();
            s.closed = Some(why.to_string());
            std::mem::take(&mut s.open).into_iter().collect()
        };
        for (id, o) in open {
            self.record(
                "question_answered",
                json!({"question": id, "name": o.name, "answer": "deny", "by": why}),
            );
            let _ = o.tx.send((Answer::Deny, "the instance".into()));
        }
    }

    /// Asks again after a thaw.
    pub(crate) fn reopen(&self) {
        self.lock().closed = None;
    }

    /// The open questions and the grants (`sandmux approvals`,
    /// `sandbox_status`).
    pub(crate) fn list(&self) -> Value {
        let s = self.lock();
        let now = SystemTime::now();
        let open: Vec<Value> = s
            .open
            .iter()
            .map(|(id, o)| {
                let waited = now.duration_since(o.asked).unwrap_or_default().as_secs();
                json!({"question": id, "kind": "network", "name": o.name, "waiting_s": waited, "deny_in_s": self.wait.as_secs().saturating_sub(waited)})
            })
            .collect();
        json!({
            "open": open,
            "granted_for_instance": s.instance,
            "granted_once": s.once.keys().collect::<Vec<_>>(),
        })
    }
}
