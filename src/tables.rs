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
/// those it refuses for a file mode, and how many the allowlist holds.
fn seccomp_denied() -> String {
    let mut t = String::from("| refused with `EPERM` | syscalls |\n|---|---|\n");
    for (group, calls) in crate::sandbox::syscalls::DENIED {
        let names: Vec<String> = calls.iter().map(|(n, _)| format!("`{n}`")).collect();
        t.push_str(&format!("| {group} | {} |\n", names.join(", ")));
    }
    use crate::sandbox::syscalls::{MODE_SETTERS, SPECIAL_FILE_TYPES};
    let setters: Vec<String> = MODE_SETTERS
        .iter()
        .map(|(n, _, _, flags)| match flags {
            Some(_) => format!("`{n}` (with `O_CREAT` or `O_TMPFILE`)"),
            None => format!("`{n}`"),
        })
        .collect();
    t.push_str(&format!(
        "| a set-user-ID or set-group-ID bit in the mode (P8) | {} |\n",
        setters.join(", ")
    ));
    let kinds: Vec<&str> = SPECIAL_FILE_TYPES.iter().map(|(k, _)| *k).collect();
    t.push_str(&format!(
        "| `mknod`, `mknodat` of a special file (P8) | {} |\n",
        kinds.join(", ")
    ));
    t.push_str(
        "| `renameat2` with `RENAME_WHITEOUT` (P8: a whiteout is a device node) | `renameat2` |\n",
    );
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
