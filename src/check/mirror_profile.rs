//! `sandmux profile mirror PROFILE --write`: a local profile that is
//! PROFILE with, on each allow entry whose name this network resolves only
//! to refused addresses, a range of each of those addresses alone
//! ([`super::mirror`]). Nothing else changes: the built-in keeps its name and
//! its list (a built-in name always means the built-in), the new file says
//! at its top what was added and why, and it is used only when named
//! (`-p NAME`). It replaces only a file it wrote itself.

use super::mirror::{fixable, Seen};
use crate::profile::{AllowEntry, Loaded};
use serde::Deserialize;
use std::path::PathBuf;

/// The first line of every file written here (what may be replaced).
pub(crate) const HEADER: &str = "# Written by `sandmux profile mirror`";
/// The last line of the note that header begins.
const END: &str = "# (end of sandmux profile mirror's note)\n";

/// Why no profile was written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MirrorError {
    /// The profile has no proxy.
    #[error(
        "profile {0}: [network] mode is not \"proxy\": there is no allow list a mirror could need"
    )]
    NotProxy(String),
    /// A name that cannot be a profile's.
    #[error("--as {0:?}: {1}")]
    BadName(String, &'static str),
    /// A file of the user's own is in the way.
    #[error("{0} exists and was not written by `sandmux profile mirror`: left as it is (choose another name with --as NEW, or move it away)")]
    Exists(String),
    /// The profile's allow list could not be found in its text.
    #[error("profile {0}: {1}")]
    Text(String, String),
    /// Writing failed.
    #[error("writing {0}: {1}")]
    Write(String, std::io::Error),
}

/// The name written by default: PROFILE-mirror (a profile already so named
/// is rewritten in place: the mirror moved).
pub(crate) fn default_name(base: &str) -> String {
    if base.ends_with("-mirror") {
        base.to_string()
    } else {
        format!("{base}-mirror")
    }
}

/// The `[network] allow` entries as they should read: each refused exact
/// entry with its proposed ranges added, the others as written.
pub(crate) fn entries(allow: &[AllowEntry], seen: &[Seen]) -> Vec<(AllowEntry, bool)> {
    allow
        .iter()
        .map(|e| {
            let Ok(r) = crate::proxy::name::Rule::parse(e.name()) else {
                return (e.clone(), false);
            };
            let key = format!(
                "{}:{}",
                r.name,
                r.port.unwrap_or(crate::proxy::name::CONNECT_PORT)
            );
            match fixable(seen).find(|(n, _)| !r.suffix && *n == key) {
                Some((_, add)) => {
                    let mut ranges = e.ranges().to_vec();
                    ranges.extend(
                        add.iter()
                            .filter(|a| !ranges.contains(a))
                            .cloned()
                            .collect::<Vec<_>>(),
                    );
                    let name = e.name().to_string();
                    (
                        AllowEntry::Ranged(crate::profile::RangedName { name, ranges }),
                        true,
                    )
                }
                None => (e.clone(), false),
            }
        })
        .collect()
}

/// One entry as TOML.
pub(crate) fn toml_entry(e: &AllowEntry) -> String {
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    match e {
        AllowEntry::Name(n) => q(n),
        AllowEntry::Ranged(r) => {
            let ranges: Vec<String> = r.ranges.iter().map(|c| q(c)).collect();
            format!(
                "{{ name = {}, ranges = [{}] }}",
                q(&r.name),
                ranges.join(", ")
            )
        }
    }
}

/// PROFILE's text with its allow list replaced and a header saying what
/// was added; None when nothing is to be added.
pub(crate) fn rewrite(
    base: &Loaded,
    name: &str,
    command: &str,
    seen: &[Seen],
) -> Result<Option<String>, MirrorError> {
    #[derive(Deserialize)]
    struct Doc {
        network: Option<Net>,
    }
    #[derive(Deserialize)]
    struct Net {
        allow: Option<toml::Spanned<toml::Value>>,
    }
    let file = base.source.to_string();
    if base.profile.network.mode != crate::profile::NetMode::Proxy {
        return Err(MirrorError::NotProxy(file));
    }
    let new = entries(&base.profile.network.allow, seen);
    if !new.iter().any(|(_, changed)| *changed) {
        return Ok(None);
    }
    let doc: Doc =
        toml::from_str(&base.text).map_err(|e| MirrorError::Text(file.clone(), e.to_string()))?;
    let span = doc
        .network
        .and_then(|n| n.allow)
        .map(|a| a.span())
        .ok_or_else(|| MirrorError::Text(file.clone(), "no [network] allow list".into()))?;
    let mut head = format!(
        "{HEADER} ({}): the profile {file},\n\
         # with a range on each allow entry below whose name this network resolves\n\
         # only to addresses the proxy refuses by default (a mirror). Each range is one\n\
         # address alone; check that each is your mirror's. Used only when named:\n\
         # sandmux check -p {name}, sandmux serve -p {name}. Running the command again\n\
         # rewrites this file. Added:\n",
        crate::term::printable(command),
        file = crate::term::printable(&file),
    );
    let mut list = String::from("[\n");
    for (e, changed) in &new {
        if *changed {
            head.push_str(&format!("#   {}\n", toml_entry(e)));
        }
        list.push_str(&format!("  {},\n", toml_entry(e)));
    }
    list.push(']');
    head.push_str(END);
    let body = &base.text;
    // A file this command wrote starts with its own note: replaced, not kept twice.
    let start = body
        .starts_with(HEADER)
        .then(|| body.find(END).map(|i| i + END.len()))
        .flatten();
    let mut out = head;
    out.push_str(&body[start.unwrap_or(0).min(span.start)..span.start]);
    out.push_str(&list);
    out.push_str(&body[span.end..]);
    Ok(Some(out))
}

/// Checks a name for the new profile: a file stem, not a built-in's.
pub(crate) fn check_name(n: &str) -> Result<(), MirrorError> {
    let bad = |why| Err(MirrorError::BadName(n.to_string(), why));
    if n.is_empty() || n.len() > 64 || n.starts_with('.') || n.starts_with('-') {
        return bad("1 to 64 characters, not starting with '.' or '-'");
    }
    if !n
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return bad("letters, digits, '.', '_' and '-' only");
    }
    if crate::profile::BUILTINS.iter().any(|(b, _)| *b == n) {
        return bad("a built-in's name (a built-in name always means the built-in)");
    }
    Ok(())
}

/// Writes `text` as profile `name` in the user's profile directory,
/// replacing only a file this command wrote.
pub(crate) fn write(name: &str, text: &str) -> Result<PathBuf, MirrorError> {
    let dir = crate::profile::config_dir();
    let path = dir.join(format!("{name}.toml"));
    let shown = path.display().to_string();
    if let Ok(old) = std::fs::read_to_string(&path) {
        if !old.starts_with(HEADER) {
            return Err(MirrorError::Exists(shown));
        }
    } else if path.symlink_metadata().is_ok() {
        return Err(MirrorError::Exists(shown));
    }
    std::fs::create_dir_all(&dir).map_err(|e| MirrorError::Write(dir.display().to_string(), e))?;
    crate::profile::parse(&shown, text)
        .map_err(|e| MirrorError::Text(shown.clone(), e.to_string()))?;
    let tmp = dir.join(format!(".{name}.toml.tmp"));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            MirrorError::Write(shown, e)
        })?;
    Ok(path)
}
