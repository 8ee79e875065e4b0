//! `sandmux check`'s network part: the mode, and in proxy mode each allowed
//! name dialled as the proxy would (`proxy::reach`) and resolved and judged
//! ([`super::mirror`]). A name refused by its address's range is a failure
//! that comes with its fix (the entries to paste and the one command that
//! writes them); a name this network does not have (it does not resolve, or
//! resolves but does not answer) is a warning: the sandbox is not at fault,
//! and `check` exits [`EXIT_WARNED`] when nothing else failed.

use super::mirror::{self, Seen, Verdict};
use crate::profile::Policy;
use serde::Serialize;
use std::io::Write;

/// `check`'s exit status when every probe matched but some allowed name
/// cannot be reached from this network (each said in a warning).
pub(crate) const EXIT_WARNED: u8 = 4;

/// The profile's network, as `check` reports it.
#[derive(Debug, Serialize)]
pub(crate) struct NetworkView {
    /// none | loopback | host | proxy.
    pub mode: String,
    /// `proxy` mode: the names that may be reached, canonical.
    pub allow: Vec<String>,
    /// `proxy` mode: each name dialled as the proxy would (`proxy::reach`).
    pub reach: Vec<crate::proxy::reach::Reach>,
    /// `proxy` mode: each exact name resolved and judged as the proxy would.
    pub resolved: Vec<Seen>,
    /// Names this network cannot reach (`name:port`): warnings, not failures.
    pub unreachable: Vec<String>,
    /// The command that writes a local profile opening the names refused
    /// by their addresses' ranges, when any can be opened.
    pub fix: Option<String>,
    /// The same as `[network] allow` entries to paste in place of theirs.
    pub paste: Vec<String>,
}

impl NetworkView {
    /// Whether every allowed name could be reached, or is only a warning.
    pub(super) fn reached(&self) -> bool {
        self.reach
            .iter()
            .all(|r| r.ok || self.unreachable.contains(&r.name))
    }

    /// Whether some name is refused by its address's range.
    pub(super) fn refused(&self) -> bool {
        self.resolved
            .iter()
            .any(|s| matches!(s.verdict, Verdict::Refused { .. }))
    }

    /// One warning line per name this network cannot reach.
    pub(super) fn warnings(&self) -> Vec<String> {
        self.reach
            .iter()
            .filter(|r| !r.ok && self.unreachable.contains(&r.name))
            .map(|r| format!("{}: {}", r.name, r.detail))
            .collect()
    }
}

pub(super) fn network_of(policy: &Policy) -> NetworkView {
    let cfg = (policy.network.mode == crate::profile::NetMode::Proxy)
        .then(|| crate::proxy::Config::of(&policy.network).ok())
        .flatten();
    let Some(cfg) = cfg else {
        return NetworkView {
            mode: policy.network.mode.name().into(),
            allow: vec![],
            reach: vec![],
            resolved: vec![],
            unreachable: vec![],
            fix: None,
            paste: vec![],
        };
    };
    let (mut reach, resolved) = std::thread::scope(|s| {
        let r = s.spawn(|| crate::proxy::reach::reach_all(&cfg));
        let seen = mirror::survey(&cfg);
        (r.join().unwrap_or_default(), seen)
    });
    reach.extend(credentials(policy, &cfg));
    // A name that failed but whose addresses the proxy would dial (or that
    // has none) is this network's lack, not the profile's.
    let unreachable = reach
        .iter()
        .filter(|r| !r.ok)
        .filter(|r| {
            resolved.iter().any(|s| {
                s.name == r.name
                    && matches!(s.verdict, Verdict::Allowed | Verdict::Unresolved { .. })
            })
        })
        .map(|r| r.name.clone())
        .collect();
    let spec = match &policy.source {
        crate::profile::Source::Builtin(n) => n.clone(),
        crate::profile::Source::File(p) => p.display().to_string(),
    };
    let paste = super::mirror_profile::entries(&policy.network.allow, &resolved)
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(e, _)| super::mirror_profile::toml_entry(&e))
        .collect();
    NetworkView {
        mode: policy.network.mode.name().into(),
        allow: cfg.list(),
        paste,
        fix: (mirror::fixable(&resolved).count() > 0).then(|| mirror::command(&spec)),
        reach,
        resolved,
        unreachable,
    }
}

/// `[[credentials]]`: their values can be had (as `serve` would read them
/// here) and each host's interception path works.
fn credentials(policy: &Policy, cfg: &crate::proxy::Config) -> Vec<crate::proxy::reach::Reach> {
    use crate::proxy::credentials::Vault;
    match Vault::open(&policy.credentials, &policy.network.upstream_ca) {
        Ok(None) => vec![],
        Ok(Some(v)) => crate::proxy::reach::intercepted(cfg, &v),
        Err(e) => vec![crate::proxy::reach::Reach {
            name: "(credentials)".into(),
            ok: false,
            detail: e.to_string(),
        }],
    }
}

/// The network mode (proxy mode: what it allows), in the human report.
pub(super) fn print_network(n: &NetworkView, out: &mut impl Write) -> std::io::Result<()> {
    if n.mode != "proxy" {
        return writeln!(out, "\nnetwork: {}", n.mode);
    }
    writeln!(
        out,
        "\nnetwork: proxy at {} (names only): {}",
        crate::proxy::url(),
        if n.allow.is_empty() {
            "nothing allowed".to_string()
        } else {
            n.allow.join(", ")
        }
    )?;
    for r in &n.reach {
        let verdict = match (r.ok, n.unreachable.contains(&r.name)) {
            (true, _) => "ok",
            (false, true) => "WARNING",
            (false, false) => "FAILED",
        };
        writeln!(out, "  {verdict:<7} {}: {}", r.name, r.detail)?;
    }
    print_fix(n, out)
}

/// For names refused by their addresses' ranges: the entries to paste and
/// the one command that writes them; addresses never proposed, and why.
fn print_fix(n: &NetworkView, out: &mut impl Write) -> std::io::Result<()> {
    if !n.refused() {
        return Ok(());
    }
    if let Some(cmd) = &n.fix {
        writeln!(
            out,
            "\n  {} allowed name(s) resolve here only to addresses the proxy refuses by default:\n  \
             a mirror on a private or reserved range? If these addresses are your mirror's,\n  \
             one command writes a local profile that opens each name to its own addresses\n  \
             alone (the profile checked is not changed):\n\n      {cmd}\n\n  \
             or paste these entries into [network] allow, in place of the plain names:\n",
            mirror::fixable(&n.resolved).count()
        )?;
        for e in &n.paste {
            writeln!(out, "      {e},")?;
        }
    }
    for s in &n.resolved {
        if let Verdict::Refused { withheld, .. } = &s.verdict {
            for w in withheld {
                writeln!(
                    out,
                    "  not proposed for {}: {w} (an entry for it is yours to write by hand, if it really is your mirror)",
                    s.name
                )?;
            }
        }
    }
    Ok(())
}
