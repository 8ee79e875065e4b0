//! Which tools are enabled (P4): toolsets from the profile, overridden by the
//! environment (`SANDMUX_TOOLSETS`, `SANDMUX_TOOLS`, `SANDMUX_EXCLUDE_TOOLS`),
//! overridden by command-line flags. Exclusions beat every enable; every name
//! is checked against the catalogue and an unknown one fails start-up with the
//! list of valid names. Any other `SANDMUX_*` variable also fails start-up.

use super::catalog::TOOLS;
use crate::profile::Toolset;
use std::collections::BTreeSet;

/// Command-line selection (each `None` when the flag was not given).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--toolsets a,b`.
    pub toolsets: Option<String>,
    /// `--tools x,y`.
    pub tools: Option<String>,
    /// `--exclude-tools z`.
    pub exclude_tools: Option<String>,
}

const KNOWN_ENV: &[&str] = &["SANDMUX_TOOLSETS", "SANDMUX_TOOLS", "SANDMUX_EXCLUDE_TOOLS"];

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

fn toolset(name: &str) -> Result<Toolset, String> {
    match name {
        "inspect" => Ok(Toolset::Inspect),
        "manage" => Ok(Toolset::Manage),
        "execute" => Ok(Toolset::Execute),
        "teardown" => Ok(Toolset::Teardown),
        other => Err(format!(
            "unknown toolset {other:?}; valid toolsets: inspect, manage, execute, teardown"
        )),
    }
}

fn tool(name: &str) -> Result<&'static str, String> {
    TOOLS
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.name)
        .ok_or_else(|| {
            format!(
                "unknown tool {name:?}; valid tools: {}",
                TOOLS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
            )
        })
}

/// Computes the enabled tools.
pub fn select(
    profile: &[Toolset],
    flags: &Flags,
    env: &[(String, String)],
) -> Result<BTreeSet<&'static str>, String> {
    for (k, _) in env {
        if k.starts_with("SANDMUX_") && !KNOWN_ENV.contains(&k.as_str()) {
            return Err(format!(
                "unknown environment variable {k}; sandmux reads only {}",
                KNOWN_ENV.join(", ")
            ));
        }
    }
    let get = |flag: &Option<String>, var: &str| {
        flag.clone()
            .or_else(|| env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone()))
    };
    let sets: Vec<Toolset> = match get(&flags.toolsets, "SANDMUX_TOOLSETS") {
        Some(s) => list(&s)
            .iter()
            .map(|n| toolset(n))
            .collect::<Result<_, _>>()?,
        None => profile.to_vec(),
    };
    let extra: Vec<&'static str> = get(&flags.tools, "SANDMUX_TOOLS")
        .map(|s| list(&s))
        .unwrap_or_default()
        .iter()
        .map(|n| tool(n))
        .collect::<Result<_, _>>()?;
    let exclude: Vec<&'static str> = get(&flags.exclude_tools, "SANDMUX_EXCLUDE_TOOLS")
        .map(|s| list(&s))
        .unwrap_or_default()
        .iter()
        .map(|n| tool(n))
        .collect::<Result<_, _>>()?;
    let mut on: BTreeSet<&'static str> = TOOLS
        .iter()
        .filter(|t| sets.contains(&t.toolset))
        .map(|t| t.name)
        .collect();
    on.extend(extra);
    for x in exclude {
        on.remove(x);
    }
    Ok(on)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_errors() {
        let prof = [Toolset::Inspect];
        let none = Flags::default();
        let on = select(&prof, &none, &[]).unwrap();
        assert!(on.contains("list_panes") && !on.contains("send_keys"));
        let env = vec![("SANDMUX_TOOLSETS".to_string(), "execute".to_string())];
        let on = select(&prof, &none, &env).unwrap();
        assert!(on.contains("send_keys") && !on.contains("list_panes"));
        let flags = Flags {
            toolsets: Some("inspect,teardown".into()),
            tools: Some("send_keys".into()),
            exclude_tools: Some("kill_server,send_keys".into()),
        };
        let on = select(&prof, &flags, &env).unwrap();
        assert!(
            on.contains("kill_pane") && !on.contains("kill_server") && !on.contains("send_keys")
        );
        let empty = Flags {
            toolsets: Some(String::new()),
            tools: Some("list_panes".into()),
            ..Default::default()
        };
        assert_eq!(
            select(&prof, &empty, &[])
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            vec!["list_panes"]
        );
        assert!(select(
            &prof,
            &Flags {
                toolsets: Some("evrything".into()),
                ..Default::default()
            },
            &[]
        )
        .unwrap_err()
        .contains("valid toolsets"));
        assert!(select(
            &prof,
            &Flags {
                tools: Some("list_servers".into()),
                ..Default::default()
            },
            &[]
        )
        .unwrap_err()
        .contains("valid tools"));
        assert!(
            select(&prof, &none, &[("SANDMUX_SAFETY".into(), "x".into())])
                .unwrap_err()
                .contains("SANDMUX_SAFETY")
        );
    }
}
