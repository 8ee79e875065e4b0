//! `[[credentials]]`: secrets the agent uses but never holds. Each names the
//! variable the sandbox sees (a placeholder, made per instance), the hosts
//! the real value may be sent to (each one the `[network] allow` list
//! reaches), and where the supervisor reads the value on the host. The
//! value itself is the proxy's (`crate::proxy::credentials`): the profile
//! holds only where it comes from.

use super::schema::{is_forbidden_env, NetMode, Network};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Most credentials one profile may name.
pub(crate) const MAX_CREDENTIALS: usize = 32;
/// A `from_command`'s default time limit, and the longest allowed.
pub(crate) const COMMAND_SECONDS: (u64, u64) = (10, 120);

/// One `[[credentials]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Credential {
    /// The variable the sandbox sees, holding the placeholder.
    pub name: String,
    /// The hosts the real value may go to (each reached through the proxy
    /// on port 443, intercepted).
    pub send_to: Vec<String>,
    /// The host-side variable the value is read from.
    #[serde(default)]
    pub from_env: Option<String>,
    /// The host-side file the value is read from (read again when it
    /// changes).
    #[serde(default)]
    pub from_file: Option<PathBuf>,
    /// A host-side command whose output is the value (and its lifetime):
    /// argv, no shell, run again before the value ends and after a 401.
    #[serde(default)]
    pub from_command: Option<Vec<String>>,
    /// The command's environment over `PATH` and `HOME` (nothing else of
    /// sandmux's, nothing of the sandbox's).
    #[serde(default)]
    pub command_env: std::collections::BTreeMap<String, String>,
    /// The command's time limit (default [`COMMAND_SECONDS`]).
    #[serde(default)]
    pub command_timeout_seconds: Option<u64>,
    /// How long a plain (not JSON) output lives; JSON's `expires_in` wins.
    #[serde(default)]
    pub lifetime_seconds: Option<u64>,
    /// The request headers the value is put into (default `Authorization`;
    /// e.g. `PRIVATE-TOKEN` for GitLab, `X-Api-Key`).
    #[serde(default)]
    pub headers: Vec<String>,
}

/// Where a credential's value is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum From<'a> {
    /// A variable of the supervisor's environment.
    Env(&'a str),
    /// A file on the host.
    File(&'a std::path::Path),
    /// A command run on the host (argv).
    Command(&'a [String]),
}

impl Credential {
    /// Where the value comes from (validated: exactly one).
    pub(crate) fn from(&self) -> From<'_> {
        match (&self.from_env, &self.from_file, &self.from_command) {
            (Some(v), _, _) => From::Env(v),
            (None, Some(f), _) => From::File(f),
            (None, None, Some(c)) => From::Command(c),
            (None, None, None) => From::Env(&self.name),
        }
    }

    /// The command's time limit.
    pub(crate) fn command_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.command_timeout_seconds.unwrap_or(COMMAND_SECONDS.0))
    }

    /// The headers the value is put into, lowercase (`authorization`
    /// unless the profile names others).
    pub(crate) fn headers(&self) -> Vec<String> {
        if self.headers.is_empty() {
            return vec!["authorization".into()];
        }
        self.headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect()
    }

    /// The hosts, canonical (validated).
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.send_to
            .iter()
            .filter_map(|h| super::allow::name::canonical(h).ok())
            .collect()
    }
}

fn var_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks the entries against `[network]` and `[environment] set`: errors
/// name the key.
pub(crate) fn check(
    creds: &[Credential],
    net: &Network,
    set: &std::collections::BTreeMap<String, String>,
) -> Result<(), (&'static str, String)> {
    if creds.is_empty() {
        if !net.upstream_ca.is_empty() && net.mode != NetMode::Proxy {
            return Err((
                "network.upstream_ca",
                "upstream_ca applies only to mode = \"proxy\"".into(),
            ));
        }
        return Ok(());
    }
    if net.mode != NetMode::Proxy {
        return Err(("credentials.name", format!("a credential needs [network] mode = \"proxy\" (this profile's is \"{}\"): the proxy is what puts the real value in, on its way to the hosts in send_to", net.mode.name())));
    }
    if creds.len() > MAX_CREDENTIALS {
        return Err((
            "credentials.name",
            format!("{} credentials (at most {MAX_CREDENTIALS})", creds.len()),
        ));
    }
    for ca in &net.upstream_ca {
        if !ca.is_absolute() {
            return Err((
                "network.upstream_ca",
                format!("{} is not an absolute path", ca.display()),
            ));
        }
    }
    let cfg = super::allow::Config::of(net)?;
    let mut seen = std::collections::BTreeSet::new();
    for c in creds {
        one(c, &cfg, set)?;
        if !seen.insert(c.name.as_str()) {
            return Err((
                "credentials.name",
                format!("{:?} is named by two credentials", c.name),
            ));
        }
    }
    Ok(())
}

type Refusal = (&'static str, String);

fn one(
    c: &Credential,
    cfg: &super::allow::Config,
    set: &std::collections::BTreeMap<String, String>,
) -> Result<(), Refusal> {
    name(c, set)?;
    source(c)?;
    headers(c)?;
    send_to(c, cfg)
}

/// The credential's name: a variable the sandbox may have, not also set.
fn name(c: &Credential, set: &std::collections::BTreeMap<String, String>) -> Result<(), Refusal> {
    let n = &c.name;
    if !var_name(n) || is_forbidden_env(n) {
        return Err((
            "credentials.name",
            format!("{n:?} is not a variable name the sandbox may have"),
        ));
    }
    if set.contains_key(n) {
        return Err((
            "credentials.name",
            format!(
                "{n:?} is also in [environment] set: the credential's placeholder is its value"
            ),
        ));
    }
    Ok(())
}

/// Where the value comes from: exactly one source, each well formed.
fn source(c: &Credential) -> Result<(), Refusal> {
    let n = &c.name;
    let given = [
        c.from_env.is_some(),
        c.from_file.is_some(),
        c.from_command.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err((
            "credentials.from_env",
            format!("credential {n:?}: give exactly one of from_env, from_file and from_command"),
        ));
    }
    command(c)?;
    match (&c.from_env, &c.from_file) {
        (Some(v), None) if !var_name(v) => Err((
            "credentials.from_env",
            format!("credential {n:?}: {v:?} is not a variable name"),
        )),
        (None, Some(f)) if !f.is_absolute() => Err((
            "credentials.from_file",
            format!("credential {n:?}: {} is not an absolute path", f.display()),
        )),
        (None, Some(f)) if f.parent() == Some(std::path::Path::new("/")) => Err((
            "credentials.from_file",
            format!("credential {n:?}: keep {} in a directory of its own (e.g. /run/secrets/{n}/token), not in /: the confined supervisor keeps read access to that directory to read a rotated file again", f.display()),
        )),
        _ => Ok(()),
    }
}

/// The headers the value may be put into: tokens, none that frames the
/// request or talks to a proxy.
fn headers(c: &Credential) -> Result<(), Refusal> {
    let n = &c.name;
    for h in &c.headers {
        let token = !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        let l = h.to_ascii_lowercase();
        let framing = [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "te",
            "upgrade",
            "trailer",
            "keep-alive",
        ];
        if !token || framing.contains(&l.as_str()) || l.starts_with("proxy-") {
            return Err((
                "credentials.headers",
                format!("credential {n:?}: {h:?} is not a header a credential may be put into"),
            ));
        }
    }
    Ok(())
}

/// The hosts it is sent to: at least one, each reached by `[network] allow`.
fn send_to(c: &Credential, cfg: &super::allow::Config) -> Result<(), Refusal> {
    let n = &c.name;
    if c.send_to.is_empty() {
        return Err((
            "credentials.send_to",
            format!("credential {n:?} names no host to send it to"),
        ));
    }
    for h in &c.send_to {
        let host = super::allow::name::canonical(h).map_err(|e| {
            (
                "credentials.send_to",
                format!("credential {n:?}: {h:?}: {e}"),
            )
        })?;
        // Any port: the entry's own (`host:8443`) or HTTPS's.
        let port =
            |r: &super::allow::name::Rule| r.port.unwrap_or(super::allow::name::CONNECT_PORT);
        if !cfg.allow.iter().any(|r| r.matches(&host, port(r), port(r))) {
            return Err((
                "credentials.send_to",
                format!(
                    "credential {n:?}: {host} is not reached by [network] allow; add it there too"
                ),
            ));
        }
    }
    Ok(())
}

/// A `from_command` entry's own keys (and none of them without it).
fn command(c: &Credential) -> Result<(), (&'static str, String)> {
    let n = &c.name;
    let err = |k, why: String| Err((k, format!("credential {n:?}: {why}")));
    let Some(argv) = &c.from_command else {
        let extra = !c.command_env.is_empty()
            || c.command_timeout_seconds.is_some()
            || c.lifetime_seconds.is_some();
        return match extra {
            true => err("credentials.from_command", "command_env, command_timeout_seconds and lifetime_seconds go with from_command only".into()),
            false => Ok(()),
        };
    };
    match argv.first() {
        None => return err("credentials.from_command", "from_command is empty: give the program and its arguments, e.g. [\"/usr/bin/gh\", \"auth\", \"token\"]".into()),
        Some(p) if !std::path::Path::new(p).is_absolute() => return err("credentials.from_command", format!("{p:?}: give the program's absolute path (from_command runs no shell and searches no PATH)")),
        _ => {}
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return err(
            "credentials.from_command",
            "an argument holds a NUL byte".into(),
        );
    }
    if let Some(k) = c.command_env.keys().find(|k| !var_name(k)) {
        return err(
            "credentials.command_env",
            format!("{k:?} is not a variable name"),
        );
    }
    let (_, max) = COMMAND_SECONDS;
    if c.command_timeout_seconds.is_some_and(|t| t == 0 || t > max) {
        return err(
            "credentials.command_timeout_seconds",
            format!("give 1-{max} seconds"),
        );
    }
    if c.lifetime_seconds == Some(0) {
        return err(
            "credentials.lifetime_seconds",
            "give at least 1 second".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> Network {
        Network {
            mode: NetMode::Proxy,
            allow: vec![crate::profile::AllowEntry::Name("api.test".into())],
            ..Network::default()
        }
    }

    fn cred() -> Credential {
        Credential {
            name: "GITHUB_TOKEN".into(),
            send_to: vec!["api.test".into()],
            from_env: Some("GH".into()),
            ..Default::default()
        }
    }

    #[test]
    fn each_mistake_names_its_key() {
        let set = Default::default();
        assert_eq!(check(&[cred()], &net(), &set), Ok(()));
        let key = |c: Credential, n: &Network| check(&[c], n, &set).unwrap_err().0;
        let mut n = net();
        n.mode = NetMode::None;
        n.allow.clear();
        assert_eq!(key(cred(), &n), "credentials.name");
        let mut c = cred();
        c.send_to = vec!["other.test".into()];
        assert_eq!(key(c, &net()), "credentials.send_to");
        let mut c = cred();
        c.from_file = Some("/run/x".into());
        assert_eq!(key(c, &net()), "credentials.from_env");
        let mut c = cred();
        c.name = "LD_PRELOAD".into();
        assert_eq!(key(c, &net()), "credentials.name");
        let mut c = cred();
        (c.from_env, c.from_file) = (None, Some("rel/x".into()));
        assert_eq!(key(c, &net()), "credentials.from_file");
        let mut c = cred();
        (c.from_env, c.from_file) = (None, Some("/token".into()));
        assert_eq!(key(c, &net()), "credentials.from_file");
        let mut c = cred();
        (c.from_env, c.from_command) = (None, Some(vec!["gh".into()]));
        assert_eq!(key(c, &net()), "credentials.from_command");
        let mut c = cred();
        c.from_command = Some(vec!["/usr/bin/gh".into()]);
        assert_eq!(key(c, &net()), "credentials.from_env");
        let mut c = cred();
        c.lifetime_seconds = Some(60);
        assert_eq!(key(c, &net()), "credentials.from_command");
        let mut c = cred();
        (c.from_env, c.from_command) = (None, Some(vec!["/usr/bin/gh".into()]));
        c.command_timeout_seconds = Some(1000);
        assert_eq!(
            key(c.clone(), &net()),
            "credentials.command_timeout_seconds"
        );
        c.command_timeout_seconds = Some(5);
        assert_eq!(check(&[c], &net(), &set), Ok(()));
        assert_eq!(
            check(&[cred(), cred()], &net(), &set).unwrap_err().0,
            "credentials.name"
        );
    }
}
