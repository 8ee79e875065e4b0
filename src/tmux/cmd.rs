//! A tmux command line built word by word, every argument quoted for tmux's
//! parser, so nothing a caller passes can become a second command or a flag.

use super::control::quote;

/// A builder for one tmux command line; every argument is quoted.
#[derive(Debug, Clone)]
pub struct Cmd {
    words: Vec<String>,
    /// A positional argument (or `--`) was pushed: tmux reads no flags after it.
    positional: bool,
}

impl Cmd {
    /// A command by name (`send-keys`, ...).
    pub fn new(name: &str) -> Cmd {
        Cmd {
            words: vec![name.to_string()],
            positional: false,
        }
    }
    /// A flag, unquoted (`-t`, `-p`): only ever a literal from sandmux's code.
    pub fn flag(mut self, f: &'static str) -> Cmd {
        self.words.push(f.to_string());
        self
    }
    /// A positional argument, quoted for tmux's parser. tmux reads flags after
    /// unquoting, so one that starts with `-` is put after a `--`.
    pub fn arg(mut self, a: impl AsRef<[u8]>) -> Cmd {
        let a = a.as_ref();
        if !self.positional && a.first() == Some(&b'-') {
            self.words.push("--".into());
        }
        self.positional = true;
        self.words.push(quote(a));
        self
    }
    /// A flag followed by its value (taken as the value whatever it starts with).
    pub fn opt(mut self, f: &'static str, a: impl AsRef<[u8]>) -> Cmd {
        self.words.push(f.to_string());
        self.words.push(quote(a.as_ref()));
        self
    }
    /// `--` then the rest as arguments.
    pub fn rest<I: IntoIterator<Item = S>, S: AsRef<[u8]>>(mut self, args: I) -> Cmd {
        if !self.positional {
            self.words.push("--".into());
            self.positional = true;
        }
        for a in args {
            self.words.push(quote(a.as_ref()));
        }
        self
    }
    /// The command's name.
    pub fn name(&self) -> &str {
        &self.words[0]
    }
    /// The line sent to tmux.
    pub fn line(&self) -> String {
        self.words.join(" ")
    }
}
