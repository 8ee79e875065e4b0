//! Approvals (`[network] ask`): a request the profile does not allow is
//! held while a human is asked, through the operator's endpoint (`sandmux
//! approvals`, `approve`, `deny`). Every question and answer is an audit
//! record; at most [`MAX_OPEN`] questions are open at once (more are
//! refused at once, saying why); silence past `[mcp] ask_seconds`, a
//! freeze, a stop or the instance's end deny. What an approval grants is
//! exactly what was asked: one name and port, once (that connection, and
//! others to it within [`ONCE_WINDOW`]: a client that gave up and retried
//! is not asked again) or for the instance; it never outlives the instance.
//! One question per name: further connections to it wait on the same
//! answer, and a name a human declined is refused without asking again
//! for [`DENY_WINDOW`]. A question whose connections all went away is
//! withdrawn.

mod by;
pub(crate) mod shown;

pub(crate) use by::By;
use by::{Asked, Share};

use crate::audit::{Audit, Entry};
use crate::proxy::ask::{Asker, Verdict};
use serde_json::{json, Value};
use shown::Detail;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// Questions open at once; more are refused at once.
pub(crate) const MAX_OPEN: usize = 8;
/// How long "once" also covers the next connections to the same name.
pub(crate) const ONCE_WINDOW: Duration = Duration::from_secs(10);
/// How long a declined name is refused without asking again.
pub(crate) const DENY_WINDOW: Duration = Duration::from_secs(10);

/// Why a question grants nothing, or an answer was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApprovalError {
    /// A human declined the name within [`DENY_WINDOW`].
    #[error("a human declined it a moment ago (asked again in a few seconds)")]
    DeclinedRecently,
    /// Questions are closed (a freeze, a stop): why.
    #[error("no question can be asked now ({0})")]
    Closed(String),
    /// [`MAX_OPEN`] questions are open.
    #[error("{MAX_OPEN} questions are already waiting for a human; this one was not asked")]
    Full,
    /// Neither the client nor the operator may answer.
    #[error("no one can be asked: the client did not declare elicitation, and [mcp] ask_via leaves the operator out")]
    NoOneToAsk,
    /// A human said no.
    #[error("a human declined ({0})")]
    Declined(By),
    /// Denied without a human (withdrawn, frozen, stopped).
    #[error("the question was withdrawn ({0})")]
    Withdrawn(By),
    /// No answer within the deadline (its seconds).
    #[error("no human answered within {0} s (silence denies)")]
    Silence(u64),
    /// An answer to a question that is not open.
    #[error("no open question {0} (answered, timed out, withdrawn, or never asked)")]
    NotOpen(u64),
    /// The operator answering a question only the client may answer.
    #[error("question {0} is the MCP client's to answer ([mcp] ask_via)")]
    ClientsToAnswer(u64),
    /// The question went between the check and the answer.
    #[error("no open question {0}")]
    Gone(u64),
}

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
    /// `https://host:port` or `http://host:port`, or `tool NAME`.
    name: String,
    /// A name or a tool.
    kind: Asked,
    /// Whether the operator may answer it (`[mcp] ask_via`).
    operator: bool,
    /// How long "once" also covers what comes next (none for a tool: the
    /// next call asks again).
    window: Duration,
    asked: SystemTime,
    deadline: Instant,
    /// What the human is shown besides the name (a tool's arguments), the
    /// agent's words: shown only in their container (`shown`).
    detail: Option<Detail>,
    /// The connections (or the call) waiting on the answer.
    waiters: Vec<oneshot::Sender<(Answer, By)>>,
    /// For the instance counts as once (a tool that always asks).
    every_call: bool,
}

#[derive(Default)]
struct State {
    next: u64,
    open: BTreeMap<u64, Open>,
    /// Names granted for the instance.
    instance: BTreeSet<String>,
    /// Names granted once, until when.
    once: BTreeMap<String, Instant>,
    /// Names a human declined, until when they are refused unasked.
    declined: BTreeMap<String, Instant>,
    /// New questions are refused (frozen or stopping), and why.
    closed: Option<String>,
    /// Tools the operator revoked at runtime: a standing no, never asked.
    revoked_tools: BTreeSet<String>,
}

impl State {
    /// Forgets what expired and withdraws questions nobody waits on any
    /// more; the withdrawn, for the record.
    fn tidy(&mut self) -> Vec<(u64, String, Asked)> {
        let now = Instant::now();
        self.once.retain(|_, until| *until > now);
        self.declined.retain(|_, until| *until > now);
        let gone: Vec<u64> = self
            .open
            .iter_mut()
            .filter_map(|(id, o)| {
                o.waiters.retain(|w| !w.is_closed());
                o.waiters.is_empty().then_some(*id)
            })
            .collect();
        gone.into_iter()
            .filter_map(|id| self.open.remove(&id).map(|o| (id, o.name, o.kind)))
            .collect()
    }
}

/// The instance's questions and grants.
pub(crate) struct Approvals {
    state: Mutex<State>,
    wait: Duration,
    audit: Arc<Audit>,
}

/// What is asked, and who may answer.
struct Ask<'a> {
    name: &'a str,
    kind: Asked,
    operator: bool,
    window: Duration,
    /// A tool's question: the call's request id (its audit record has the
    /// same), so the record of a call run under a once names its question.
    call: Option<&'a str>,
    /// A tool's question: its arguments as the human is shown them.
    detail: Option<&'a Detail>,
    /// No grant outlives this question (a tool that always asks).
    every_call: bool,
}

/// The client's answer to a tool's question, if it gives one.
pub(crate) type ClientAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<Answer>> + Send>>;

/// What a request does about its question.
enum Step {
    Now(Result<Grant, ApprovalError>),
    Wait(u64, Instant, oneshot::Receiver<(Answer, By)>),
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

    /// A question from a pane (a name), and what becomes of it without a
    /// human (asked, timed out, withdrawn), is written in the proxy's share
    /// of the audit budget: a pane opening and dropping connections to new
    /// names cannot spend the budget tool calls need (past the share they
    /// are counted in the seal). A human's answer, and a tool's question
    /// (one per audited call), are events.
    fn record(&self, kind: &str, args: Value, share: Share) {
        let e = Entry::event("(approvals)", Some(kind), &args);
        let _ = match share {
            Share::Pane => self.audit.proxy(e),
            Share::Event => self.audit.event(e),
        };
    }

    fn withdrawn(&self, gone: Vec<(u64, String, Asked)>) {
        for (id, name, asked) in gone {
            let by = By::Gone;
            let share = Share::of(asked, Some(&by));
            self.record(
                "question_answered",
                json!({"question": id, "name": name, "answer": "deny", "by": by.to_string()}),
                share,
            );
        }
    }

    /// The proxy's asker.
    pub(crate) fn asker(self: &Arc<Approvals>) -> Asker {
        let me = self.clone();
        Arc::new(move |scheme, host, port| {
            let me = me.clone();
            Box::pin(async move { me.ask_name(&format!("{scheme}://{host}:{port}")).await })
        })
    }

    /// A grant, a refusal without asking, or the question to wait on
    /// (joined, or asked now).
    fn step(&self, a: &Ask<'_>) -> Step {
        let name = a.name;
        let mut s = self.lock();
        let gone = s.tidy();
        let step = if s.instance.contains(name) {
            Step::Now(Ok(Grant::Instance))
        } else if s.once.contains_key(name) {
            Step::Now(Ok(Grant::Once))
        } else if s.declined.contains_key(name) {
            Step::Now(Err(ApprovalError::DeclinedRecently))
        } else if let Some(why) = &s.closed {
            Step::Now(Err(ApprovalError::Closed(why.clone())))
        } else if let Some((id, o)) = s
            .open
            .iter_mut()
            // A tool's question is one call's: its once runs that call only.
            .find(|(_, o)| o.name == name && a.kind == Asked::Network)
        {
            let (tx, rx) = oneshot::channel();
            o.waiters.push(tx);
            Step::Wait(*id, o.deadline, rx)
        } else if s.open.len() >= MAX_OPEN {
            // Counted in the proxy's own (aggregated) record, not one
            // record each: a flood cannot spend the audit budget.
            Step::Now(Err(ApprovalError::Full))
        } else {
            s.next += 1;
            let id = s.next;
            let (tx, rx) = oneshot::channel();
            let deadline = Instant::now() + self.wait;
            let open = Open {
                name: name.to_string(),
                kind: a.kind,
                operator: a.operator,
                window: a.window,
                asked: SystemTime::now(),
                deadline,
                detail: a.detail.cloned(),
                waiters: vec![tx],
                every_call: a.every_call,
            };
            s.open.insert(id, open);
            drop(s);
            self.record(
                "question_asked",
                json!({"question": id, "kind": a.kind.word(), "name": name, "operator": a.operator, "request_id": a.call}),
                Share::of(a.kind, None),
            );
            // Debug only: a pane asking in a loop must not flood the log
            // (`sandmux ps` shows the instance as asking).
            tracing::debug!(question = id, %name, "approval asked: `sandmux approvals` lists it, `sandmux approve ID {id}` or `sandmux deny ID {id}` answers");
            return Step::Wait(id, deadline, rx);
        };
        drop(s);
        self.withdrawn(gone);
        step
    }

    /// Asks about a name (`scheme://host:port`, canonical: the proxy's
    /// parser admits nothing else) and waits for the operator's answer.
    async fn ask_name(&self, name: &str) -> Verdict {
        let a = Ask {
            name,
            kind: Asked::Network,
            operator: true,
            window: ONCE_WINDOW,
            call: None,
            detail: None,
            every_call: false,
        };
        match self.ask(&a, None).await {
            Ok(_) => Verdict::Allow,
            Err(why) => Verdict::Deny(why.to_string()),
        }
    }

    /// Asks whether `tool` (of a toolset `[mcp] ask_toolsets` names) may
    /// run: the client's answer (`client`, elicitation) and the operator's
    /// (when `operator`), the first wins. Once is this call only;
    /// `every_call` (a tool that always asks): for the instance is taken as
    /// once, so no answer makes a later call silent.
    pub(crate) async fn ask_tool(
        &self,
        tool: &str,
        call: &str,
        detail: &Detail,
        client: Option<ClientAnswer>,
        (operator, every_call): (bool, bool),
    ) -> Result<Grant, ApprovalError> {
        if client.is_none() && !operator {
            return Err(ApprovalError::NoOneToAsk);
        }
        let name = format!("tool {tool}");
        let a = Ask {
            name: &name,
            kind: Asked::Tool,
            operator,
            window: Duration::ZERO,
            call: Some(call),
            detail: Some(detail),
            every_call,
        };
        self.ask(&a, client).await
    }

    /// Asks `a` (or joins its open question) and waits for the first
    /// answer, the client's included; silence past the deadline denies.
    async fn ask(&self, a: &Ask<'_>, client: Option<ClientAnswer>) -> Result<Grant, ApprovalError> {
        let (id, deadline, mut rx) = match self.step(a) {
            Step::Now(v) => return v,
            Step::Wait(id, d, rx) => (id, d, rx),
        };
        if let Some(c) = client {
            let wait = tokio::time::timeout_at(deadline.into(), c);
            tokio::pin!(wait);
            tokio::select! {
                biased;
                r = &mut rx => return self.outcome(r.ok()),
                r = &mut wait => match r {
                    // One more answer to the question: the first wins.
                    Ok(Some(ans)) => {
                        let _ = self.answer_as(id, ans, By::Client, true);
                    }
                    // The client gave none, and no one else may answer.
                    Ok(None) if !a.operator => {
                        let _ = self.answer_as(id, Answer::Deny, By::ClientSilent, true);
                    }
                    _ => {}
                }
            }
        }
        let got = match tokio::time::timeout_at(deadline.into(), &mut rx).await {
            Ok(r) => r.ok(),
            Err(_) => {
                let timed_out = self.lock().open.remove(&id).is_some();
                if timed_out {
                    let by = By::Timeout;
                    self.record(
                        "question_answered",
                        json!({"question": id, "name": a.name, "answer": "deny", "by": by.to_string()}),
                        Share::of(a.kind, Some(&by)),
                    );
                }
                // An answer that came as the time ran out still counts.
                rx.try_recv().ok()
            }
        };
        self.outcome(got)
    }

    fn outcome(&self, got: Option<(Answer, By)>) -> Result<Grant, ApprovalError> {
        match got {
            Some((Answer::Allow(g), _)) => Ok(g),
            Some((Answer::Deny, by)) if by.human() => Err(ApprovalError::Declined(by)),
            Some((Answer::Deny, why)) => Err(ApprovalError::Withdrawn(why)),
            None => Err(ApprovalError::Silence(self.wait.as_secs())),
        }
    }

    /// Answers question `id` (the operator); the first answer wins, and it
    /// is recorded once it reached the waiting connections. The question's
    /// name, and what the answer granted (a tool that always asks takes
    /// "for the instance" as once).
    pub(crate) fn answer(
        &self,
        id: u64,
        a: Answer,
        by: By,
    ) -> Result<(String, Answer), ApprovalError> {
        self.answer_as(id, a, by, false)
    }

    fn answer_as(
        &self,
        id: u64,
        a: Answer,
        by: By,
        client: bool,
    ) -> Result<(String, Answer), ApprovalError> {
        let (name, asked, reached, a) = {
            let mut s = self.lock();
            match s.open.get(&id) {
                None => return Err(ApprovalError::NotOpen(id)),
                Some(o) if !client && !o.operator => {
                    return Err(ApprovalError::ClientsToAnswer(id))
                }
                Some(_) => {}
            }
            let Some(open) = s.open.remove(&id) else {
                return Err(ApprovalError::Gone(id));
            };
            // A tool that always asks keeps no grant: the next call asks.
            let a = match a {
                Answer::Allow(Grant::Instance) if open.every_call => Answer::Allow(Grant::Once),
                a => a,
            };
            match a {
                Answer::Allow(Grant::Instance) => {
                    s.instance.insert(open.name.clone());
                }
                Answer::Allow(Grant::Once) if !open.window.is_zero() => {
                    s.once
                        .insert(open.name.clone(), Instant::now() + open.window);
                }
                Answer::Allow(Grant::Once) => {}
                Answer::Deny => {
                    s.declined
                        .insert(open.name.clone(), Instant::now() + DENY_WINDOW);
                }
            }
            let reached = open
                .waiters
                .into_iter()
                .map(|w| w.send((a.clone(), by.clone())).is_ok())
                .filter(|ok| *ok)
                .count();
            (open.name, open.kind, reached, a)
        };
        let (word, grant) = match &a {
            Answer::Allow(Grant::Once) => ("approve", "once"),
            Answer::Allow(Grant::Instance) => ("approve", "for the instance"),
            Answer::Deny => ("deny", "nothing"),
        };
        let share = Share::of(asked, Some(&by));
        self.record("question_answered", json!({"question": id, "name": name, "answer": word, "granted": grant, "by": by.to_string(), "connections": reached}), share);
        Ok((name, a))
    }

    /// Denies every open question and asks no more (a freeze, a stop).
    pub(crate) fn close(&self, why: &str) {
        let open: Vec<(u64, Open)> = {
            let mut s = self.lock();
            s.closed = Some(why.to_string());
            std::mem::take(&mut s.open).into_iter().collect()
        };
        self.deny_all(open, &By::Withdrawn(why.to_string()));
    }

    /// Denies questions taken out of the open ones, on the record.
    fn deny_all(&self, open: Vec<(u64, Open)>, by: &By) {
        for (id, o) in open {
            self.record(
                "question_answered",
                json!({"question": id, "name": o.name, "answer": "deny", "by": by.to_string()}),
                Share::of(o.kind, Some(by)),
            );
            for w in o.waiters {
                let _ = w.send((Answer::Deny, by.clone()));
            }
        }
    }

    /// Takes back a grant of `name` (`scheme://host:port`), once or for the
    /// instance; false when there is none. Connections already open go on.
    pub(crate) fn revoke(&self, name: &str, by: &By) -> bool {
        let had = {
            let mut s = self.lock();
            let a = s.instance.remove(name);
            let b = s.once.remove(name).is_some();
            a || b
        };
        if had {
            self.record(
                "grant_revoked",
                json!({"name": name, "by": by.to_string()}),
                Share::Event,
            );
        }
        had
    }

    /// The operator revoked `tools` at runtime: their grants are gone and
    /// they are not asked about until granted again (`on`: granted).
    pub(crate) fn tools_revoked(&self, tools: &[&str], on: bool, by: &By) {
        for t in tools {
            if on {
                self.lock().revoked_tools.remove(*t);
                continue;
            }
            let name = format!("tool {t}");
            self.revoke(&name, by);
            // A revoke is a standing no: a question still open about the
            // tool is denied now, so no later yes can undo the revoke.
            let open: Vec<(u64, Open)> = {
                let mut s = self.lock();
                s.revoked_tools.insert(t.to_string());
                let ids: Vec<u64> = s
                    .open
                    .iter()
                    .filter(|(_, o)| o.name == name)
                    .map(|(id, _)| *id)
                    .collect();
                ids.into_iter()
                    .filter_map(|id| s.open.remove(&id).map(|o| (id, o)))
                    .collect()
            };
            self.deny_all(open, &By::Withdrawn(format!("revoked by {by}")));
        }
    }

    /// Protocol 2026-07-28: the retry `retry` brought the answer to the
    /// question call `first` asked (the call runs under the retry's id).
    pub(crate) fn redeemed(&self, tool: &str, first: &str, retry: &str) {
        self.record(
            "question_redeemed",
            json!({"name": format!("tool {tool}"), "request_id": first, "retry_request_id": retry}),
            Share::Event,
        );
    }

    /// Whether the operator revoked `tool` at runtime.
    pub(crate) fn tool_revoked(&self, tool: &str) -> bool {
        self.lock().revoked_tools.contains(tool)
    }

    /// How many questions wait for a human (`sandmux ps`).
    pub(crate) fn open_count(&self) -> usize {
        self.lock().open.len()
    }

    /// Asks again after a thaw.
    pub(crate) fn reopen(&self) {
        self.lock().closed = None;
    }

    /// The open questions and the grants in force (`sandmux approvals`,
    /// `sandbox_status`).
    pub(crate) fn list(&self) -> Value {
        let (v, gone) = {
            let mut s = self.lock();
            let gone = s.tidy();
            let now = SystemTime::now();
            let open: Vec<Value> = s
                .open
                .iter()
                .map(|(id, o)| {
                    let waited = now.duration_since(o.asked).unwrap_or_default().as_secs();
                    let left = o.deadline.saturating_duration_since(Instant::now()).as_secs();
                    let (detail, cut) = o.detail.as_ref().map(|d| (&d.text, d.cut_from)).unzip();
                    json!({"question": id, "kind": o.kind.word(), "name": o.name, "detail": detail, "detail_cut_from": cut.flatten(), "operator": o.operator, "connections": o.waiters.len(), "waiting_s": waited, "deny_in_s": left})
                })
                .collect();
            let v = json!({
                "open": open,
                "granted_for_instance": s.instance,
                "granted_once": s.once.keys().collect::<Vec<_>>(),
            });
            (v, gone)
        };
        self.withdrawn(gone);
        v
    }
}
