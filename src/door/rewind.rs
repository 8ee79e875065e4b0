//! `sandmux rewind ID N`: the layer put back to how it was after
//! checkpoint N (`supervisor::history::rewind`), recorded in the
//! instance's audit log like every door action; undone by rewinding to the
//! checkpoint it names. An ended instance's layer is written here; a
//! running instance is asked over its operator endpoint, and `serve`
//! rewinds the workspace its panes see, frozen meanwhile
//! (`runtime::rewind`), recording the same `(door)` record in its own log.

use super::error::RewindError;
use super::record::Record;
use super::report::{Kind, Line};
use crate::supervisor::history::{rewind, History};
use crate::supervisor::layer;

/// Rewinds the layer of ended instance `id` to checkpoint `n`: what to
/// tell the human. A running instance is [`RewindError::Live`]: its
/// `serve` is asked instead (the CLI does, over the operator endpoint).
pub(crate) fn rewind_layer(id: &str, n: u64) -> Result<Vec<String>, RewindError> {
    let (dir, _) = layer::find(id)?;
    // Held while the layer is written: no instance starts on it meanwhile.
    let _lock = match layer::ended(&dir, id) {
        Ok(l) => l,
        Err(live) => {
            return Err(RewindError::Live {
                id: id.to_string(),
                live,
            })
        }
    };
    if !History::dir_of(&dir).join("log.jsonl").exists() {
        return Err(crate::supervisor::history::HistoryError::None(id.to_string()).into());
    }
    // The door records what it does, and does nothing it cannot record.
    let rec = Record::open(id, &dir)?;
    // What the layer holds changes: measured again when next listed.
    let _ = std::fs::remove_file(dir.join(crate::supervisor::kept::USAGE));
    let mut h = History::open(&dir, &layer::writes(&dir), u64::MAX)?;
    match rewind::rewind(&mut h, n) {
        Ok((before, after)) => {
            let lines = vec![format!(
                "rewound layer {id} to checkpoint {n} (now checkpoint {}; {} entries written or removed); `sandmux rewind {id} {}` undoes it",
                after.n, after.changed + after.removed, before.n
            )];
            let said: Vec<Line> = lines.iter().map(Line::note).collect();
            rec.done("rewind", &[], &said, 0);
            Ok(lines)
        }
        Err(source) => {
            let e = RewindError::Failed {
                id: id.to_string(),
                n,
                source,
            };
            rec.done("rewind", &[], &[Line::new(Kind::Failed, e.to_string())], 2);
            Err(e)
        }
    }
}
