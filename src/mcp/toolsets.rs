//! Which tools are enabled (P4): toolsets from the profile, overridden by the
//! environment (`SANDMUX_TOOLSETS`, `SANDMUX_TOOLS`, `SANDMUX_EXCLUDE_TOOLS`),
//! overridden by command-line flags. Exclusions beat every enable; every name
//! is checked against the catalogue and an unknown one fails start-up with the
//! list of valid names. Besides these and `SANDMUX_LOG` (the log levels,
//! [`crate::log`]), any other `SANDMUX_*` variable also fails start-up.

use super::catalog::{toolset_named, toolset_names, TOOLS};
use crate::profile::Toolset;
use std::collections::BTreeSet;

/// Command-line selection (each `None` when the flag was not given).
#[derive(Debug, Clone, Default)]
pub(crate) struct Flags {
    /// `--toolsets a,b`.
    pub toolsets: Option<String>,
    /// `--tools x,y`.
    pub tools: Option<String>,
    /// `--exclude-tools z`.
    pub exclude_tools: Option<String>,
}

/// The `SANDMUX_*` variables `serve` reads (E30: any other stops it).
const KNOWN_ENV: &[&str] = &[
    "SANDMUX_TOOLSETS",
    "SANDMUX_TOOLS",
    "SANDMUX_EXCLUDE_TOOLS",
    crate::log::ENV,
];

/// The `core` preset: the ten tools of an agent's daily work, for clients
/// that pay per token. A preset is a list of tools, not a toolset: each tool
/// stays in its own toolset, which remains the unit of revoke and grant.
pub(crate) const CORE: &[&str] = &[
    "list_panes",
    "capture_pane",
    "capture_since",
    "wait_for_text",
    "wait_for_stable",
    "sandbox_status",
    "split_window",
    "send_keys",
    "run_command",
    "wait_for_command",
];

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

/// A name in a toolset list: a toolset, or the `core` preset.
enum SetName {
    Set(Toolset),
    Core,
}

fn toolset(name: &str) -> Result<SetName, String> {
    if name == "core" {
        return Ok(SetName::Core);
    }
    toolset_named(name).map(SetName::Set).ok_or_else(|| {
        format!(
            "unknown toolset {name:?}; valid toolsets: {}, and the preset core",
            toolset_names()
        )
    })
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

/// Computes the enabled tools. `preset`: the profile's `[mcp] preset`
/// (narrows the profile's toolsets to the preset's tools); `core` in
/// `--toolsets` or `SANDMUX_TOOLSETS` adds the preset's tools.
pub(crate) fn select(
    profile: &[Toolset],
    preset: Option<crate::profile::Preset>,
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
    let mut core = false;
    let sets: Vec<Toolset> = match get(&flags.toolsets, "SANDMUX_TOOLSETS") {
        Some(s) => {
            let mut v = Vec::new();
            for n in list(&s) {
                match toolset(&n)? {
                    SetName::Set(t) => v.push(t),
                    SetName::Core => core = true,
                }
            }
            v
        }
        None => profile.to_vec(),
    };
    let narrowed = preset.is_some()
        && flags.toolsets.is_none()
        && !env.iter().any(|(k, _)| k == "SANDMUX_TOOLSETS");
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
        .filter(|t| !narrowed || CORE.contains(&t.name))
        .map(|t| t.name)
        .collect();
    if core {
        on.extend(CORE.iter().filter_map(|n| tool(n).ok()));
    }
    on.extend(extra);
    for x in exclude {
        on.remove(x);
    }
    Ok(on)
}

/// Whether `--exclude-tools` (or `SANDMUX_EXCLUDE_TOOLS`) names `name`:
/// the human withheld it on purpose, beyond what the toolsets offer.
pub(crate) fn excludes(flags: &Flags, env: &[(String, String)], name: &str) -> bool {
    flags
        .exclude_tools
        .clone()
        .or_else(|| {
            env.iter()
                .find(|(k, _)| k == "SANDMUX_EXCLUDE_TOOLS")
                .map(|(_, v)| v.clone())
        })
        .is_some_and(|s| list(&s).iter().any(|n| n == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_errors() {
        let prof = [Toolset::Inspect];
        let none = Flags::default();
        let on = select(&prof, None, &none, &[]).unwrap();
        assert!(on.contains("list_panes") && !on.contains("send_keys"));
        let env = vec![("SANDMUX_TOOLSETS".to_string(), "execute".to_string())];
        let on = select(&prof, None, &none, &env).unwrap();
        assert!(on.contains("send_keys") && !on.contains("list_panes"));
        let flags = Flags {
            toolsets: Some("inspect,teardown".into()),
            tools: Some("send_keys".into()),
            exclude_tools: Some("kill_server,send_keys".into()),
        };
        let on = select(&prof, None, &flags, &env).unwrap();
        assert!(
            on.contains("kill_pane") && !on.contains("kill_server") && !on.contains("send_keys")
        );
        let empty = Flags {
            toolsets: Some(String::new()),
            tools: Some("list_panes".into()),
            ..Default::default()
        };
        assert_eq!(
            select(&prof, None, &empty, &[])
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            vec!["list_panes"]
        );
        assert!(select(
            &prof,
            None,
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
            None,
            &Flags {
                tools: Some("list_servers".into()),
                ..Default::default()
            },
            &[]
        )
        .unwrap_err()
        .contains("valid tools"));
        assert!(
            select(&prof, None, &none, &[("SANDMUX_SAFETY".into(), "x".into())])
                .unwrap_err()
                .contains("SANDMUX_SAFETY")
        );
        // The log levels are the one other variable sandmux reads.
        assert!(select(
            &prof,
            None,
            &none,
            &[("SANDMUX_LOG".into(), "trace".into())]
        )
        .is_ok());
    }

    #[test]
    fn the_core_preset_is_tools_of_the_real_toolsets() {
        use crate::profile::Preset;
        let all = [Toolset::Inspect, Toolset::Manage, Toolset::Execute];
        let flags = Flags {
            toolsets: Some("core".into()),
            ..Default::default()
        };
        let on = select(&all, None, &flags, &[]).unwrap();
        assert_eq!(on.len(), CORE.len());
        assert!((8..=10).contains(&CORE.len()));
        for n in CORE {
            assert!(TOOLS.iter().any(|t| t.name == *n), "{n}");
        }
        let on = select(&all, Some(Preset::Core), &Flags::default(), &[]).unwrap();
        assert_eq!(on.len(), CORE.len());
        // A profile without execute keeps only core's other tools.
        let on = select(
            &[Toolset::Inspect],
            Some(Preset::Core),
            &Flags::default(),
            &[],
        )
        .unwrap();
        assert!(on.contains("capture_pane") && !on.contains("run_command"));
        let both = Flags {
            toolsets: Some("core,teardown".into()),
            ..Default::default()
        };
        let on = select(&all, None, &both, &[]).unwrap();
        assert!(
            on.contains("kill_pane") && on.contains("run_command") && !on.contains("rename_window")
        );
    }
}
