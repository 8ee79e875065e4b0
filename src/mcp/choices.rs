//! The typed choice vocabulary of tool arguments: every argument that picks
//! one of a few words is an enum here, so its schema lists the words (a
//! string `enum`) and a wrong one is refused by name before any handler runs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A corner of a window (`find_pane_by_position`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Corner {
    TopLeft,
    TopRight,
    BottomLeft,
    BottomRight,
}

/// What a batch does after an operation fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnError {
    #[default]
    Stop,
    Continue,
}

/// Where `split_window` puts the new pane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Split {
    Above,
    #[default]
    Below,
    Left,
    Right,
}

/// Where `create_window` puts the new window, beside the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Beside {
    Before,
    After,
}

/// Which window `select_window` moves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum WindowStep {
    Next,
    Previous,
    Last,
}

/// Which pane `select_pane` moves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PaneStep {
    Up,
    Down,
    Left,
    Right,
    Last,
    Next,
    Previous,
}

/// tmux's preset layouts (names only: tmux 3.3a's server crashes on some
/// custom layout strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Layout {
    EvenHorizontal,
    EvenVertical,
    MainHorizontal,
    MainVertical,
    Tiled,
}

/// Each choice prints as the word the agent wrote.
macro_rules! words {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match serde_json::to_value(self) {
                    Ok(serde_json::Value::String(s)) => f.write_str(&s),
                    _ => Err(std::fmt::Error),
                }
            }
        }
    )*};
}
words!(Corner, OnError, Split, Beside, WindowStep, PaneStep, Layout);
