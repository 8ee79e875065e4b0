//! `sandmux profile list | show | validate | mirror`.

use super::fail;
use crate::profile::{self, Context};
use crate::sandbox::{EXIT_INTERNAL, EXIT_USAGE};
use clap::Subcommand;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub(crate) enum ProfileCmd {
    /// List built-in and user profiles.
    List,
    /// Print a profile's TOML (or, with --resolved, the policy for a workspace).
    Show {
        /// Profile name or path.
        name: String,
        /// Show the resolved policy (paths substituted and checked) and the
        /// sandbox compiled from it: every mount, layer and Landlock rule.
        #[arg(long)]
        resolved: bool,
        /// Format of --resolved: json or toml.
        #[arg(long, default_value = "json", value_parser = ["json", "toml"])]
        format: String,
        /// Workspace to resolve against (default: the current directory).
        #[arg(long, short)]
        workspace: Option<PathBuf>,
    },
    /// Validate a profile file; exit status 2 if invalid.
    Validate {
        /// The file.
        file: PathBuf,
    },
    /// For a network whose registries resolve to a mirror on a private or
    /// reserved range: resolve each name of a proxy profile's allow list as
    /// its proxy would, and print the entries that open each refused name to
    /// its own addresses alone (each a /32 or /128); with --write, write the
    /// profile with them as NAME-mirror in ~/.config/sandmux/profiles (the
    /// profile named is never changed). Exit status 0, 2 for a bad profile,
    /// name or a file of yours in the way, 1 if the file cannot be written.
    Mirror {
        /// Profile name or path (network mode "proxy").
        name: String,
        /// Write the local profile (without it: print what it would add).
        #[arg(long)]
        write: bool,
        /// The written profile's name (default: NAME-mirror).
        #[arg(long = "as", value_name = "NEW")]
        as_name: Option<String>,
    },
}

/// Prints an error (through `term`: it may quote what the agent chose).
pub(crate) fn profile_cmd(cmd: ProfileCmd) -> ExitCode {
    match cmd {
        ProfileCmd::List => list(),
        ProfileCmd::Show {
            name,
            resolved,
            format,
            workspace,
        } => show(&name, resolved, &format, workspace),
        ProfileCmd::Validate { file } => validate(&file),
        ProfileCmd::Mirror {
            name,
            write,
            as_name,
        } => mirror(&name, write, as_name),
    }
}

/// `sandmux profile list`: the built-ins, then the user's files (an
/// invalid one says why; one a built-in shadows says so).
fn list() -> ExitCode {
    for (name, text) in profile::BUILTINS {
        let d = profile::parse(name, text)
            .map(|p| p.description)
            .unwrap_or_default();
        println!("{name:<12} builtin  {d}");
    }
    let Ok(rd) = std::fs::read_dir(profile::config_dir()) else {
        return ExitCode::SUCCESS;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("toml") {
            continue;
        }
        let d = match profile::load_file(&p) {
            Ok(l) => l.profile.description,
            Err(e) => format!("INVALID: {e}"),
        };
        let stem = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let note = if profile::BUILTINS.iter().any(|(n, _)| *n == stem) {
            " (NOT USED: the built-in of this name wins; rename the file)"
        } else {
            ""
        };
        println!("{stem:<12} user     {d}{note}");
    }
    ExitCode::SUCCESS
}

/// `sandmux profile show NAME [--resolved]`.
fn show(name: &str, resolved: bool, format: &str, workspace: Option<PathBuf>) -> ExitCode {
    let loaded = match profile::load(name) {
        Ok(l) => l,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    if !resolved {
        print!("{}", loaded.text);
        return ExitCode::SUCCESS;
    }
    let ws = match profile::check_workspace(&workspace.unwrap_or_else(|| ".".into())) {
        Ok(w) => w,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let mut policy = match loaded.resolve(&Context::of(ws, crate::guard::planner)) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    if policy.workspace_mode.has_door() {
        // Made when an instance starts: shown with its placeholders.
        policy.layer = Some("{state}/layers/{id}".into());
    }
    match crate::sandbox::view::resolved(&policy, format) {
        // Paths can be the agent's: escaped for terminals either way.
        Ok(text) if format == "json" => {
            println!("{}", crate::term::inert_json(text));
            ExitCode::SUCCESS
        }
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(EXIT_INTERNAL, e),
    }
}

/// `sandmux profile validate FILE`.
fn validate(file: &Path) -> ExitCode {
    match profile::load_file(file) {
        Ok(l) => {
            println!(
                "{}: valid (version {}): {}",
                file.display(),
                l.profile.version,
                l.profile.description
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// `sandmux profile mirror`: what it found for each name, then the entries
/// (or the file written with them).
fn mirror(spec: &str, write: bool, as_name: Option<String>) -> ExitCode {
    use crate::check::{mirror, mirror_profile as mp};
    let loaded = match profile::load(spec) {
        Ok(l) => l,
        Err(e) => return fail(EXIT_USAGE, e),
    };
    if loaded.profile.network.mode != profile::NetMode::Proxy {
        return fail(
            EXIT_USAGE,
            mp::MirrorError::NotProxy(loaded.source.to_string()),
        );
    }
    let new_name = as_name.unwrap_or_else(|| mp::default_name(&loaded.name));
    if let Err(e) = mp::check_name(&new_name) {
        return fail(EXIT_USAGE, e);
    }
    let cfg = match crate::proxy::Config::of(&loaded.profile.network) {
        Ok(c) => c,
        Err((key, e)) => return fail(EXIT_USAGE, format!("{key}: {e}")),
    };
    let seen = mirror::survey(&cfg);
    let mut out = crate::term::Safe(std::io::stdout().lock());
    let _ = say_seen(&seen, &mut out);
    let command = mirror::command(spec);
    let text = match mp::rewrite(&loaded, &new_name, &command, &seen) {
        Ok(Some(t)) => t,
        Ok(None) => {
            let _ = writeln!(out, "\nnothing to add: no name resolves only to addresses a mirror may have and the proxy refuses");
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(EXIT_USAGE, e),
    };
    let paste: Vec<String> = mp::entries(&loaded.profile.network.allow, &seen)
        .into_iter()
        .filter(|(_, changed)| *changed)
        .map(|(e, _)| mp::toml_entry(&e))
        .collect();
    let _ = writeln!(
        out,
        "\nentries for [network] allow, in place of the plain names:"
    );
    for e in &paste {
        let _ = writeln!(out, "    {e},");
    }
    if !write {
        let _ = writeln!(
            out,
            "\nto write them as the local profile {new_name}: {command}"
        );
        return ExitCode::SUCCESS;
    }
    match mp::write(&new_name, &text) {
        Ok(path) => {
            let _ = writeln!(
                out,
                "\nwrote {}: the profile {} with these entries (review them)\nuse it: sandmux check -p {new_name}   (then serve, run or shell with -p {new_name})",
                crate::term::printable(&path.display().to_string()),
                crate::term::printable(&loaded.source.to_string()),
            );
            ExitCode::SUCCESS
        }
        Err(e @ mp::MirrorError::Write(..)) => fail(1, e),
        Err(e) => fail(EXIT_USAGE, e),
    }
}

/// One line per name the survey judged other than allowed.
fn say_seen(seen: &[crate::check::mirror::Seen], out: &mut impl Write) -> std::io::Result<()> {
    use crate::check::mirror::Verdict;
    for s in seen {
        match &s.verdict {
            Verdict::Allowed => writeln!(out, "ok       {}", s.name)?,
            Verdict::Unresolved { why } => writeln!(
                out,
                "warning  {}: {why} (left as it is: this network has no such name)",
                s.name
            )?,
            Verdict::Refused { ranges, withheld } => {
                if !ranges.is_empty() {
                    writeln!(out, "refused  {}: opened by {}", s.name, ranges.join(", "))?;
                }
                for w in withheld {
                    writeln!(out, "refused  {}: {w}: not proposed (an entry for it is yours to write by hand)", s.name)?;
                }
            }
        }
    }
    Ok(())
}
