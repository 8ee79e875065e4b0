//! Listing and resolving tmux objects. Every listing is one command whose
//! format wraps each field between per-query random separators, and asks for
//! every string a pane can influence (names, titles, paths, commands) through
//! `#{q:...}`, so no value can forge a row, a field or a control-mode guard
//! line (T7). Targets are resolved here, in Rust, never by tmux's own fuzzy
//! matching: a given id or name that does not exist is an error, not a
//! fallback to another pane.

use super::ctx::Call;
use super::error::ToolError;
use crate::tmux::control::unquote_q;
use crate::tmux::hub::Cmd;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Names starting with this are sandmux's own and never listed or targeted.
pub(crate) const RESERVED_PREFIX: &str = "_sandmux";

/// A field of a listing: its tmux variable and whether it needs `q:`.
type Field = (&'static str, bool);

const PANE_FIELDS: &[Field] = &[
    ("session_id", false),
    ("session_name", true),
    ("window_id", false),
    ("window_index", false),
    ("window_name", true),
    ("pane_id", false),
    ("pane_index", false),
    ("pane_active", false),
    ("pane_title", true),
    ("pane_current_command", true),
    ("pane_current_path", true),
    ("pane_width", false),
    ("pane_height", false),
    ("pane_pid", false),
    ("pane_dead", false),
    ("pane_dead_status", false),
    ("pane_in_mode", false),
    ("alternate_on", false),
    ("cursor_x", false),
    ("cursor_y", false),
    ("history_size", false),
    ("scroll_position", false),
    ("pane_left", false),
    ("pane_top", false),
    ("pane_right", false),
    ("pane_bottom", false),
];

/// One pane as a whole result or a part of one (`get_pane_info`,
/// `find_pane_by_position`, `snapshot_pane`'s `pane`): a [`PaneRow`] whose
/// fields are published once, in `list_panes`' items; here its schema is
/// only "an object" and the tool's description points there (three more
/// copies cost every conversation 2.4 KB of `tools/list`).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub(crate) struct OnePane(pub PaneRow);

impl JsonSchema for OnePane {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "OnePane".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "object" })
    }
}

/// One pane.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub(crate) struct PaneRow {
    /// `%N`.
    pub pane_id: String,
    /// N of `%N`, the key of the pane's output stream (not on the wire).
    #[serde(skip)]
    pub num: u32,
    /// Index in its window.
    pub pane_index: u32,
    /// `@N`.
    pub window_id: String,
    /// Window index in its session.
    pub window_index: u32,
    /// Window name.
    pub window_name: String,
    /// `$N`.
    pub session_id: String,
    /// Session name.
    pub session_name: String,
    /// Title (set by programs via escape sequences or set_pane_title).
    pub title: String,
    /// Foreground command.
    pub current_command: String,
    /// Working directory of the foreground process (inside the sandbox).
    pub current_path: String,
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Process id inside the sandbox.
    pub pid: u32,
    /// Whether the pane is the active one of its window.
    pub active: bool,
    /// Whether its process has exited (remain-on-exit).
    pub dead: bool,
    /// Exit status of a dead pane.
    pub dead_status: Option<i32>,
    /// Whether the pane is in copy mode.
    pub in_mode: bool,
    /// Whether the alternate screen is on (a full-screen program runs).
    pub alternate_screen: bool,
    /// Cursor column.
    pub cursor_x: u32,
    /// Cursor row.
    pub cursor_y: u32,
    /// Lines of scrollback.
    pub history_size: u32,
    /// Scroll position in copy mode.
    pub scroll_position: Option<u32>,
    /// Left edge.
    pub left: u32,
    /// Top edge.
    pub top: u32,
    /// Right edge.
    pub right: u32,
    /// Bottom edge.
    pub bottom: u32,
    /// Always false: the MCP server runs in no pane.
    pub is_caller: bool,
}

/// A pane a call types into or reads. Named by id it is not asked for
/// first: tmux refuses the call's own command if it does not exist
/// ([`PaneRef::gone`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PaneRef {
    /// `%N`.
    pub pane_id: String,
    /// N of `%N`, the key of the pane's output stream.
    pub num: u32,
}

impl From<&PaneRow> for PaneRef {
    fn from(p: &PaneRow) -> PaneRef {
        PaneRef {
            pane_id: p.pane_id.clone(),
            num: p.num,
        }
    }
}

impl PaneRef {
    /// The call's error: tmux's refusal of a pane that is not there becomes
    /// "not found" with a hint.
    pub(crate) fn gone(&self, e: ToolError) -> ToolError {
        match e {
            ToolError::Tmux(crate::tmux::client::TmuxError::Command(m))
                if m.contains("can't find pane") =>
            {
                no_pane(&self.pane_id)
            }
            e => e,
        }
    }
}

/// "Not found" for a pane id, with the hint.
fn no_pane(id: &str) -> ToolError {
    ToolError::not_found(format!("pane {id}"), "call list_panes for the current ids")
}

/// Runs a listing command and splits it into rows of fields.
pub(crate) async fn listing(
    c: &Call<'_>,
    cmd: Cmd,
    fields: &[Field],
) -> Result<Vec<Vec<String>>, ToolError> {
    listing_by(c, |fmt| cmd.opt("-F", fmt), fields).await
}

/// Like [`listing`], the format given to `with` (e.g. as display-message's
/// argument).
pub(crate) async fn listing_by(
    c: &Call<'_>,
    with: impl FnOnce(String) -> Cmd,
    fields: &[Field],
) -> Result<Vec<Vec<String>>, ToolError> {
    let sep = format!("<{}>", &crate::nonce::hex()[..12]);
    let end = format!("<{}>", &crate::nonce::hex()[..12]);
    let mut fmt = String::new();
    for (i, (f, q)) in fields.iter().enumerate() {
        if i > 0 {
            fmt.push_str(&sep);
        }
        if *q {
            fmt.push_str(&format!("#{{q:{f}}}"));
        } else {
            fmt.push_str(&format!("#{{{f}}}"));
        }
    }
    fmt.push_str(&end);
    let reply = c.s.hub().run(&with(fmt)).await?;
    let joined: Vec<u8> = reply.join(&b'\n');
    let text = String::from_utf8_lossy(&joined).into_owned();
    let mut rows = Vec::new();
    for chunk in text.split(&end) {
        let chunk = chunk.strip_prefix('\n').unwrap_or(chunk);
        if chunk.is_empty() {
            continue;
        }
        let vals: Vec<String> = chunk
            .split(&sep)
            .collect::<Vec<_>>()
            .iter()
            .zip(fields)
            .map(|(v, (_, q))| {
                if *q {
                    String::from_utf8_lossy(&unquote_q(v.as_bytes())).into_owned()
                } else {
                    v.to_string()
                }
            })
            .collect();
        if vals.len() == fields.len() {
            rows.push(vals);
        }
    }
    Ok(rows)
}

fn num(s: &str) -> u32 {
    s.parse().unwrap_or(0)
}

fn id_num(s: &str) -> u64 {
    s.trim_start_matches(['$', '@', '%'])
        .parse()
        .unwrap_or(u64::MAX)
}

/// Every pane (except sandmux's own), sorted by session id, window index, pane index.
pub(crate) async fn panes(c: &Call<'_>) -> Result<Vec<PaneRow>, ToolError> {
    // tmux leaves the control session out before it expands the fields
    // (`rows_of` leaves it out again).
    let not_ours = format!("#{{!=:#{{session_id}},{}}}", c.s.hub().control_session_id());
    let list = Cmd::new("list-panes").flag("-a").opt("-f", not_ours);
    let rows = listing(c, list, PANE_FIELDS).await?;
    let mut out = rows_of(c, rows);
    out.sort_by_key(|p| (id_num(&p.session_id), p.window_index, p.pane_index));
    Ok(out)
}

/// One pane by id, asked for alone (one pane's fields, not every pane's).
async fn one_pane(c: &Call<'_>, id: &str) -> Result<Option<PaneRow>, ToolError> {
    let rows = listing_by(
        c,
        |fmt| {
            Cmd::new("display-message")
                .flag("-p")
                .opt("-t", id)
                .arg(fmt)
        },
        PANE_FIELDS,
    )
    .await;
    let rows = match rows {
        Ok(r) => r,
        Err(ToolError::Tmux(crate::tmux::client::TmuxError::Command(_))) => return Ok(None),
        Err(e) => return Err(e),
    };
    // tmux 3.3 answers a target that does not exist with empty fields.
    Ok(rows_of(c, rows).into_iter().find(|p| p.pane_id == id))
}

fn rows_of(c: &Call<'_>, rows: Vec<Vec<String>>) -> Vec<PaneRow> {
    rows.into_iter()
        .filter(|r| r[0] != c.s.hub().control_session_id())
        .map(|r| PaneRow {
            session_id: r[0].clone(),
            session_name: r[1].clone(),
            window_id: r[2].clone(),
            window_index: num(&r[3]),
            window_name: r[4].clone(),
            pane_id: r[5].clone(),
            num: pane_num(&r[5]).unwrap_or(0),
            pane_index: num(&r[6]),
            active: r[7] == "1",
            title: r[8].clone(),
            current_command: r[9].clone(),
            current_path: r[10].clone(),
            width: num(&r[11]),
            height: num(&r[12]),
            pid: num(&r[13]),
            dead: r[14] == "1",
            dead_status: r[15].parse().ok(),
            in_mode: r[16] == "1",
            alternate_screen: r[17] == "1",
            cursor_x: num(&r[18]),
            cursor_y: num(&r[19]),
            history_size: num(&r[20]),
            scroll_position: r[21].parse().ok(),
            left: num(&r[22]),
            top: num(&r[23]),
            right: num(&r[24]),
            bottom: num(&r[25]),
            is_caller: false,
        })
        .collect()
}

/// Which session a call means: `session_name`, or `session_id` (`$N`);
/// nothing: the first session. (Like [`PaneSel`]'s, these fields carry no
/// schema descriptions; a tool that documents its own session arguments
/// builds one with [`SessionSel::new`].)
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub(crate) struct SessionSel {
    pub session_name: Option<String>,
    pub session_id: Option<String>,
}

impl SessionSel {
    /// A selector from a tool's own session arguments.
    pub(crate) fn new(name: &Option<String>, id: &Option<String>) -> SessionSel {
        SessionSel {
            session_name: name.clone(),
            session_id: id.clone(),
        }
    }

    /// Whether a session is named at all (by name or id).
    pub(crate) fn given(&self) -> bool {
        self.session_name.is_some() || self.session_id.is_some()
    }

    fn matches(&self, p: &PaneRow) -> bool {
        self.session_name
            .as_ref()
            .is_none_or(|n| &p.session_name == n)
            && self.session_id.as_ref().is_none_or(|i| &p.session_id == i)
    }

    fn check(&self) -> Result<(), ToolError> {
        match &self.session_id {
            Some(id) => check_id("session_id", id, '$'),
            None => Ok(()),
        }
    }
}

/// Which pane a call means: `pane_id` (`%N`), or the active pane of
/// `window_id` (`@N`) or of a session ([`SessionSel`]); nothing: the first
/// pane of the first window of the first session. (The fields carry no
/// schema descriptions: the server's instructions say this once, rather
/// than every tool's schema.)
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub(crate) struct PaneSel {
    pub pane_id: Option<String>,
    #[serde(flatten)]
    pub s: SessionSel,
    pub window_id: Option<String>,
}

/// Which window a call means: `window_id` (`@N`), or `window_index` in a
/// session ([`SessionSel`]); see [`PaneSel`].
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub(crate) struct WindowSel {
    pub window_id: Option<String>,
    pub window_index: Option<String>,
    #[serde(flatten)]
    pub s: SessionSel,
}

impl WindowSel {
    /// A selector from a tool's own window and session arguments.
    pub(crate) fn new(
        window_id: Option<String>,
        window_index: Option<String>,
        session_name: &Option<String>,
        session_id: &Option<String>,
    ) -> WindowSel {
        WindowSel {
            window_id,
            window_index,
            s: SessionSel::new(session_name, session_id),
        }
    }
}

/// Whether `v` is a tmux id: one of `sigils`, then digits.
pub(crate) fn is_id(v: &str, sigils: &[char]) -> bool {
    v.strip_prefix(sigils)
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// A pane id's number (`%3` is 3): the key of the pane's output stream.
/// Parsed once, when a pane's row is read ([`PaneRow::num`]).
pub(crate) fn pane_num(id: &str) -> Option<u32> {
    id.strip_prefix('%')?.parse().ok()
}

fn check_id(arg: &str, v: &str, sigil: char) -> Result<(), ToolError> {
    if is_id(v, &[sigil]) {
        Ok(())
    } else {
        Err(ToolError::invalid(
            arg,
            &format!("{v:?} is not a tmux id"),
            &format!("ids look like {sigil}3; call list_panes / list_windows / list_sessions"),
        ))
    }
}

/// Resolves a pane. With nothing given: the first session's first window's
/// first pane (by index). Anything given must exist.
pub(crate) async fn pane(c: &Call<'_>, sel: &PaneSel) -> Result<PaneRow, ToolError> {
    if let Some(id) = &sel.pane_id {
        return explicit_pane(c, id).await;
    }
    let all = panes(c).await?;
    sel.s.check()?;
    if let Some(w) = &sel.window_id {
        check_id("window_id", w, '@')?;
        return all
            .into_iter()
            .find(|p| &p.window_id == w && sel.s.matches(p))
            .ok_or_else(|| {
                ToolError::not_found(
                    format!("window {w}"),
                    "call list_windows for the current ids",
                )
            });
    }
    let what = match (&sel.s.session_name, &sel.s.session_id) {
        (Some(n), _) => format!("session {n:?}"),
        (_, Some(i)) => format!("session {i}"),
        _ => "any pane (there are no sessions; call create_session)".into(),
    };
    all.into_iter()
        .find(|p| sel.s.matches(p))
        .ok_or_else(|| ToolError::not_found(what, "call list_sessions"))
}

/// Resolves a pane to act on, as [`pane`] does; by id, without asking
/// tmux (sandmux's own control pane is never one).
pub(crate) async fn pane_ref(c: &Call<'_>, sel: &PaneSel) -> Result<PaneRef, ToolError> {
    let Some(id) = &sel.pane_id else {
        return pane(c, sel).await.map(|p| PaneRef::from(&p));
    };
    check_id("pane_id", id, '%')?;
    // By number: tmux reads `%05` as `%5`.
    match pane_num(id) {
        Some(num) if Some(num) != pane_num(c.s.hub().control_pane_id()) => Ok(PaneRef {
            pane_id: format!("%{num}"),
            num,
        }),
        _ => Err(no_pane(id)),
    }
}

/// Resolves a pane from an explicit id only (kill and respawn never fall back).
pub(crate) async fn explicit_pane(c: &Call<'_>, pane_id: &str) -> Result<PaneRow, ToolError> {
    check_id("pane_id", pane_id, '%')?;
    one_pane(c, pane_id).await?.ok_or_else(|| no_pane(pane_id))
}

/// Resolves a window to its first pane's row (which carries the window's ids).
pub(crate) async fn window(c: &Call<'_>, sel: &WindowSel) -> Result<PaneRow, ToolError> {
    if let (None, Some(idx)) = (&sel.window_id, &sel.window_index) {
        let want: u32 = idx
            .parse()
            .map_err(|_| ToolError::invalid("window_index", "is not a number", "e.g. \"0\""))?;
        sel.s.check()?;
        let all = panes(c).await?;
        let first_session = all.first().map(|p| p.session_id.clone());
        return all
            .into_iter()
            .find(|p| {
                p.window_index == want
                    && if sel.s.given() {
                        sel.s.matches(p)
                    } else {
                        Some(&p.session_id) == first_session.as_ref()
                    }
            })
            .ok_or_else(|| {
                ToolError::not_found(format!("window index {want}"), "call list_windows")
            });
    }
    pane(
        c,
        &PaneSel {
            pane_id: None,
            s: sel.s.clone(),
            window_id: sel.window_id.clone(),
        },
    )
    .await
}

/// Resolves a session (default the first) to its first pane's row.
pub(crate) async fn session(c: &Call<'_>, sel: &SessionSel) -> Result<PaneRow, ToolError> {
    pane(
        c,
        &PaneSel {
            s: sel.clone(),
            ..Default::default()
        },
    )
    .await
}

/// Keeps rows matching `filters` (`field`, `field__exact`, `__contains`,
/// `__icontains`, `__startswith`, `__endswith`, `__in`), libtmux-style.
pub(crate) fn filter<T: Serialize>(
    rows: Vec<T>,
    filters: &Option<serde_json::Value>,
) -> Result<Vec<T>, ToolError> {
    let f = match filters {
        None => return Ok(rows),
        Some(serde_json::Value::String(s)) => serde_json::from_str::<serde_json::Value>(s)
            .map_err(|e| {
                ToolError::invalid(
                    "filters",
                    &format!("not JSON: {e}"),
                    "pass an object like {\"session_name__contains\": \"x\"}",
                )
            })?,
        Some(v) => v.clone(),
    };
    let obj = f.as_object().ok_or_else(|| {
        ToolError::invalid(
            "filters",
            "must be an object",
            "e.g. {\"window_name\": \"build\"}",
        )
    })?;
    let mut out = Vec::new();
    'rows: for r in rows {
        let v = serde_json::to_value(&r).map_err(|e| ToolError::Internal(e.to_string()))?;
        for (k, want) in obj {
            let (field, op) = k.split_once("__").unwrap_or((k.as_str(), "exact"));
            let Some(have) = v.get(field) else {
                return Err(ToolError::invalid(
                    "filters",
                    &format!("unknown field {field:?}"),
                    "use a field of the listed rows",
                ));
            };
            let have_s = match have {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let want_s = match want {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let ok = match op {
                "exact" => have_s == want_s,
                "iexact" => have_s.eq_ignore_ascii_case(&want_s),
                "contains" => have_s.contains(&want_s),
                "icontains" => have_s.to_lowercase().contains(&want_s.to_lowercase()),
                "startswith" => have_s.starts_with(&want_s),
                "endswith" => have_s.ends_with(&want_s),
                "in" => want.as_array().is_some_and(|a| {
                    a.iter().any(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| x.to_string())
                            == have_s
                    })
                }),
                other => {
                    return Err(ToolError::invalid(
                        "filters",
                        &format!("unknown lookup {other:?}"),
                        "use exact, iexact, contains, icontains, startswith, endswith or in",
                    ))
                }
            };
            if !ok {
                continue 'rows;
            }
        }
        out.push(r);
    }
    Ok(out)
}
