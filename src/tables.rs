//! The tables `docs/architecture.md` shows about the sandbox, generated from
//! the code (`sandmux __tables-doc NAME` prints one), so a change cannot
//! leave the document behind: `tests/cli.rs` compares each table in the
//! document with what the code prints.

use crate::profile::{self, Layer};

/// Every table: its name (the document's `<!-- NAME:begin -->` marker) and
/// its text.
pub(crate) fn all() -> Vec<(&'static str, String)> {
    vec![
        ("seccomp-denied", seccomp_denied()),
        ("layers", layers()),
        ("landlock", crate::sandbox::landlock::table()),
        ("mount-view", crate::sandbox::view::table()),
    ]
}

/// The syscalls the filter refuses with `EPERM` whatever their arguments,
/// and how many the allowlist holds per group.
fn seccomp_denied() -> String {
    let mut t = String::from("| refused with `EPERM` | syscalls |\n|---|---|\n");
    for (group, calls) in crate::sandbox::syscalls::DENIED {
        let names: Vec<String> = calls.iter().map(|(n, _)| format!("`{n}`")).collect();
        t.push_str(&format!("| {group} | {} |\n", names.join(", ")));
    }
    let allowed: usize = crate::sandbox::syscalls::ALLOWED
        .iter()
        .map(|(_, c)| c.len())
        .sum();
    t.push_str(&format!(
        "\nThe allowlist holds {allowed} syscalls in {} groups; every other one answers `ENOSYS`.\n",
        crate::sandbox::syscalls::ALLOWED.len()
    ));
    t
}

/// Each layer: required or best-effort in each built-in profile, and the fix
/// a refusal names.
fn layers() -> String {
    let profiles: Vec<(&str, Vec<Layer>)> = profile::BUILTINS
        .iter()
        .map(|(name, text)| {
            let p = profile::parse(name, text).expect("built-in profiles parse");
            (*name, p.enforcement.best_effort)
        })
        .collect();
    let mut t = String::from("| layer |");
    for (name, _) in &profiles {
        t.push_str(&format!(" `{name}` |"));
    }
    t.push_str(" fix a refusal names |\n|---|");
    t.push_str(&"---|".repeat(profiles.len() + 1));
    t.push('\n');
    for l in Layer::ALL {
        t.push_str(&format!("| `{}` |", l.name()));
        for (_, best) in &profiles {
            let cell = if best.contains(&l) {
                "best-effort"
            } else {
                "required"
            };
            t.push_str(&format!(" {cell} |"));
        }
        t.push_str(&format!(" {} |\n", l.fix().replace('|', "\\|")));
    }
    t
}
