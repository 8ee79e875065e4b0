//! `sandmux check` in proxy mode: each allowed name dialled as the proxy
//! would dial it for a connection from inside — the same list, the host's
//! resolver, the same ranges, a TCP connection within the idle time — so a
//! registry refused by its address's range, unresolvable or unreachable is
//! reported before an agent meets it. TLS and HTTP are the client's own:
//! what this proves is that the proxy would open the way. A host a
//! credential is sent to is intercepted: for it, the instance's CA signs a
//! certificate and the upstream's TLS is verified as the proxy will verify
//! it ([`intercepted`]).

use super::serve::{dial, resolve};
use super::{name, Config};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// The longest one name is tried for.
const AT_MOST: Duration = Duration::from_secs(10);

/// What dialling one allowed name gave.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Reach {
    /// The entry as written canonically (`name:port`).
    pub name: String,
    /// Whether a connection opened.
    pub ok: bool,
    /// The address connected to, or why not (and the key that decides).
    pub detail: String,
}

/// Dials every name of `cfg`'s list (a `*.suffix` pattern names no host:
/// it is reported, not dialled), all at once: the slowest decides how long.
pub(crate) fn reach_all(cfg: &Config) -> Vec<Reach> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return vec![failed("(all)", format!("no runtime: {e}"))],
    };
    let mut cfg = cfg.clone();
    cfg.idle = cfg.idle.min(AT_MOST);
    let cfg = Arc::new(cfg);
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (i, r) in cfg.allow.iter().cloned().enumerate() {
            let cfg = cfg.clone();
            set.spawn(async move { (i, one(&cfg, &r).await) });
        }
        let mut out: Vec<(usize, Reach)> = set.join_all().await;
        out.sort_by_key(|(i, _)| *i);
        out.into_iter().map(|(_, r)| r).collect()
    })
}

async fn one(cfg: &Config, r: &name::Rule) -> Reach {
    let port = r.port.unwrap_or(name::CONNECT_PORT);
    let shown = format!("{}:{port}", r.name);
    if r.suffix {
        return Reach {
            name: r.show(),
            ok: true,
            detail: "a pattern: names below it are decided when asked for (not dialled)".into(),
        };
    }
    // Every entry that matches adds its ranges, as in the proxy.
    let ranges = name::allowed(&cfg.allow, &r.name, port, name::CONNECT_PORT).unwrap_or_default();
    let to = match resolve(cfg, &r.name, port, &ranges).await {
        Ok(to) => to,
        Err((_, why)) => return failed(&shown, why),
    };
    match dial(cfg.idle, to).await {
        Ok(_) => Reach {
            name: shown,
            ok: true,
            detail: format!("connected to {to}"),
        },
        Err((_, why)) => failed(&shown, why),
    }
}

/// The interception path of each credential host (`[[credentials]]`): a
/// certificate from the instance's CA, then the upstream dialled on the
/// port its allow entry names and its TLS verified against the host's roots
/// and `upstream_ca`. No request is sent (no credential leaves).
pub(crate) fn intercepted(cfg: &Config, vault: &super::credentials::Vault) -> Vec<Reach> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return vec![failed("(credentials)", format!("no runtime: {e}"))],
    };
    let mut cfg = cfg.clone();
    cfg.idle = cfg.idle.min(AT_MOST);
    rt.block_on(async {
        let mut out = Vec::new();
        for host in vault.hosts() {
            out.push(one_intercepted(&cfg, vault, &host).await);
        }
        out
    })
}

async fn one_intercepted(cfg: &Config, vault: &super::credentials::Vault, host: &str) -> Reach {
    let port = cfg
        .allow
        .iter()
        .find(|r| {
            r.matches(
                host,
                r.port.unwrap_or(name::CONNECT_PORT),
                name::CONNECT_PORT,
            )
        })
        .and_then(|r| r.port)
        .unwrap_or(name::CONNECT_PORT);
    let shown = format!("{host}:{port} (intercepted for a credential)");
    if let Err(e) = vault.tls.server_for(host) {
        return failed(&shown, e.to_string());
    }
    let ranges = name::allowed(&cfg.allow, host, port, name::CONNECT_PORT).unwrap_or_default();
    let to = match resolve(cfg, host, port, &ranges).await {
        Ok(to) => to,
        Err((_, why)) => return failed(&shown, why),
    };
    let tcp = match dial(cfg.idle, to).await {
        Ok(t) => t,
        Err((_, why)) => return failed(&shown, why),
    };
    let Ok(sn) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
        return failed(&shown, "not a server name".into());
    };
    let c = tokio_rustls::TlsConnector::from(vault.tls.upstream.clone());
    match tokio::time::timeout(cfg.idle, c.connect(sn, tcp)).await {
        Ok(Ok(_)) => Reach {
            name: shown,
            ok: true,
            detail: format!("the instance's CA signs for it; TLS to {to} verified"),
        },
        Ok(Err(e)) => failed(
            &shown,
            format!("TLS to {to}: {e} (a private CA upstream goes in [network] upstream_ca)"),
        ),
        Err(_) => failed(&shown, format!("TLS to {to} timed out")),
    }
}

fn failed(name: &str, detail: String) -> Reach {
    Reach {
        name: name.to_string(),
        ok: false,
        detail: detail.replace("sandmux proxy: ", ""),
    }
}
