//! Validation of a parsed profile: values that parse but make no sense.
//! Errors name the file, the line and the dotted key.

use super::schema::*;
use super::{line_of, ProfileError};

/// A validation failure: the dotted key and the reason.
type Invalid = Result<(), (&'static str, String)>;

fn bad(key: &'static str, reason: String) -> Invalid {
    Err((key, reason))
}

impl Profile {
    /// Checks values that parse but make no sense; errors name file, line and key.
    pub(crate) fn validate(&self, file: &str, text: &str) -> Result<(), ProfileError> {
        self.check_version()
            .and_then(|_| self.check_limits())
            .and_then(|_| self.check_network_and_sandbox())
            .and_then(|_| self.check_environment())
            .and_then(|_| self.check_enforcement_and_mcp())
            .and_then(|_| {
                super::credentials::check(&self.credentials, &self.network, &self.environment.set)
            })
            .map_err(|(key, reason)| ProfileError::Invalid {
                file: file.to_string(),
                line: line_of(text, key),
                key: key.to_string(),
                reason,
            })
    }

    /// `version`.
    fn check_version(&self) -> Invalid {
        if self.version != 1 {
            return bad(
                "version",
                format!(
                    "unsupported version {}; this sandmux reads version 1",
                    self.version
                ),
            );
        }
        Ok(())
    }

    /// `[limits]`: the minimums and the session and pane bounds.
    fn check_limits(&self) -> Invalid {
        let l = &self.limits;
        if l.nofile < 16 {
            return bad(
                "limits.nofile",
                format!("{} is too small to run a shell (minimum 16)", l.nofile),
            );
        }
        if l.processes < 8 {
            return bad(
                "limits.processes",
                format!(
                    "{} is too small to run tmux and a shell (minimum 8)",
                    l.processes
                ),
            );
        }
        if l.memory.0 < (64 << 20) {
            return bad("limits.memory", "must be at least 64MiB".into());
        }
        if l.tmpfs_size.0 < (1 << 20) {
            return bad("limits.tmpfs_size", "must be at least 1MiB".into());
        }
        if !(1..=MAX_SESSIONS_CEILING).contains(&l.max_sessions) {
            return bad(
                "limits.max_sessions",
                format!(
                    "{} is outside 1-{MAX_SESSIONS_CEILING} (each session costs a tmux client on the host)",
                    l.max_sessions
                ),
            );
        }
        if !(1..=MAX_PANES_CEILING).contains(&l.max_panes) {
            return bad(
                "limits.max_panes",
                format!("{} is outside 1-{MAX_PANES_CEILING}", l.max_panes),
            );
        }
        if !(1..=MAX_INOTIFY_WATCHES).contains(&l.inotify_watches) {
            return bad(
                "limits.inotify_watches",
                format!("{} is outside 1-{MAX_INOTIFY_WATCHES}", l.inotify_watches),
            );
        }
        if !(1..=MAX_INOTIFY_INSTANCES).contains(&l.inotify_instances) {
            return bad(
                "limits.inotify_instances",
                format!(
                    "{} is outside 1-{MAX_INOTIFY_INSTANCES}",
                    l.inotify_instances
                ),
            );
        }
        if l.max_panes < l.max_sessions {
            return bad(
                "limits.max_panes",
                format!(
                    "{} is below max_sessions ({}): every session has at least one pane",
                    l.max_panes, l.max_sessions
                ),
            );
        }
        Ok(())
    }

    /// `[network]` port lists and `[sandbox]`.
    fn check_network_and_sandbox(&self) -> Invalid {
        let n = &self.network;
        if n.mode != NetMode::Host && (!n.connect_tcp.is_empty() || !n.bind_tcp.is_empty()) {
            return bad(
                "network.connect_tcp",
                "TCP port lists apply only to mode = \"host\"".into(),
            );
        }
        self.check_proxy()?;
        let s = &self.sandbox;
        if s.uid == 0 {
            return bad(
                "sandbox.uid",
                "the uid inside must not be 0: nothing inside may look like root".into(),
            );
        }
        if s.hostname.is_empty()
            || s.hostname.len() > 64
            || !s
                .hostname
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return bad(
                "sandbox.hostname",
                format!("{:?} is not a valid hostname", s.hostname),
            );
        }
        if !s.shell.starts_with('/') {
            return bad(
                "sandbox.shell",
                format!("{:?} must be an absolute path", s.shell),
            );
        }
        Ok(())
    }

    /// `[network]` proxy keys: only in proxy mode, each entry parsed as the
    /// proxy will read it, the caps within bounds.
    fn check_proxy(&self) -> Invalid {
        let n = &self.network;
        if n.mode != NetMode::Proxy {
            if !n.allow.is_empty() || !n.allow_private.is_empty() || !n.hosts.is_empty() {
                return bad(
                    "network.allow",
                    "allow, allow_private and hosts apply only to mode = \"proxy\"".into(),
                );
            }
            if n.ask {
                return bad(
                    "network.ask",
                    "asking for a name applies only to mode = \"proxy\" (the proxy is what holds the connection)".into(),
                );
            }
            return Ok(());
        }
        super::allow::Config::of(n)?;
        if self.mcp.on_server_exit == ServerExit::Restart {
            return bad(
                "mcp.on_server_exit",
                "\"restart\" is not available with network mode \"proxy\" (a later generation's listener would be the broker's); use \"end\"".into(),
            );
        }
        if !(1..=4096).contains(&n.proxy_connections) {
            return bad(
                "network.proxy_connections",
                format!("{} is outside 1-4096", n.proxy_connections),
            );
        }
        if !(1..=3600).contains(&n.proxy_idle_seconds) {
            return bad(
                "network.proxy_idle_seconds",
                format!("{} is outside 1-3600", n.proxy_idle_seconds),
            );
        }
        if !(1024..=1 << 20).contains(&n.proxy_header_bytes) {
            return bad(
                "network.proxy_header_bytes",
                format!("{} is outside 1024-1048576", n.proxy_header_bytes),
            );
        }
        Ok(())
    }

    /// `[environment]`: names only, never `*` or a forbidden name.
    fn check_environment(&self) -> Invalid {
        for k in self
            .environment
            .set
            .keys()
            .chain(self.environment.keep.iter())
        {
            let name = k.strip_suffix('*').unwrap_or(k);
            if name.is_empty() && k != "*"
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return bad("environment.keep", format!("{k:?} is not a variable name"));
            }
            if k == "*" {
                return bad(
                    "environment.keep",
                    "\"*\" would keep every variable, secrets included; list names".into(),
                );
            }
            if is_forbidden_env(name) {
                return bad("environment.keep", format!("{k:?} may not enter the sandbox (tmux, sandmux and loader variables are always removed)"));
            }
        }
        Ok(())
    }

    /// `[enforcement]`, `[mcp]` and `[recording]`.
    fn check_enforcement_and_mcp(&self) -> Invalid {
        if let Some(abi) = self.enforcement.landlock_abi {
            if !(1..=9).contains(&abi) {
                return bad(
                    "enforcement.landlock_abi",
                    format!("{abi} is not a Landlock ABI (1-9)"),
                );
            }
        }
        self.check_mcp_limits()?;
        self.check_asking()?;
        if self.recording.max_bytes.0 < MIN_RECORDING_BYTES {
            return bad("recording.max_bytes", "must be at least 4KiB".into());
        }
        Ok(())
    }

    /// `[mcp]`'s bounds: waits, audit, input and HTTP sizes.
    fn check_mcp_limits(&self) -> Invalid {
        let m = &self.mcp;
        if !(1..=3600).contains(&m.wait_max_seconds) {
            return bad(
                "mcp.wait_max_seconds",
                format!("{} is outside 1-3600", m.wait_max_seconds),
            );
        }
        if !(64 << 10..=1 << 40).contains(&m.audit_max_bytes.0) {
            return bad(
                "mcp.audit_max_bytes",
                format!("{} bytes is outside 64 KiB-1 TiB", m.audit_max_bytes.0),
            );
        }
        if !(1024..=1 << 20).contains(&m.max_input_bytes) {
            return bad(
                "mcp.max_input_bytes",
                format!("{} is outside 1024-1048576", m.max_input_bytes),
            );
        }
        if m.http_idle_seconds != 0 && !(5..=604800).contains(&m.http_idle_seconds) {
            return bad(
                "mcp.http_idle_seconds",
                format!(
                    "{} is neither 0 (never) nor within 5-604800",
                    m.http_idle_seconds
                ),
            );
        }
        if !(1..=256).contains(&m.http_max_sessions) {
            return bad(
                "mcp.http_max_sessions",
                format!("{} is outside 1-256", m.http_max_sessions),
            );
        }
        if !(1..=1024).contains(&m.http_max_requests) {
            return bad(
                "mcp.http_max_requests",
                format!("{} is outside 1-1024", m.http_max_requests),
            );
        }
        if !(64 << 10..=16 << 20).contains(&m.http_max_body_bytes) {
            return bad(
                "mcp.http_max_body_bytes",
                format!("{} is outside 65536-16777216", m.http_max_body_bytes),
            );
        }
        Ok(())
    }

    /// `[mcp]`'s asking: who answers, what may be asked, for how long.
    fn check_asking(&self) -> Invalid {
        let m = &self.mcp;
        if m.ask_via.is_empty() {
            return bad(
                "mcp.ask_via",
                "name who answers: \"client\", \"operator\" or both".into(),
            );
        }
        if self.network.ask && !m.ask_via.contains(&Via::Operator) {
            return bad(
                "mcp.ask_via",
                "[network] ask needs \"operator\": a connection from a pane is asked of the operator only".into(),
            );
        }
        // A tool enabled is never asked about; execute under act =
        // "on-grant" is the exception: held until a grant, the agent may ask.
        let held = |t: &Toolset| m.act == Act::OnGrant && *t == Toolset::Execute;
        if let Some(t) = m
            .ask_toolsets
            .iter()
            .find(|t| m.toolsets.contains(t) && !held(t))
        {
            return bad(
                "mcp.ask_toolsets",
                format!("{} is enabled by [mcp] toolsets, so its tools are never asked about; name only toolsets the instance does not enable (or execute with act = \"on-grant\")", serde_json::to_string(t).unwrap_or_default()),
            );
        }
        if !(5..=600).contains(&m.ask_seconds) {
            return bad(
                "mcp.ask_seconds",
                format!("{} is outside 5-600", m.ask_seconds),
            );
        }
        Ok(())
    }
}
