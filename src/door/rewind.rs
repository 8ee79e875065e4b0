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
use crate::supervisor::layer::{self, LayerError};

/// Rewinds layer `id` to checkpoint `n`; the exit status (0 done, 2
/// refused: no such checkpoint, a record that cannot be written, a
/// running instance that could not be rewound).
pub(crate) fn rewind_layer(id: &str, n: u64) -> i32 {
    match run(id, n) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            0
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            2
        }
    }
}

fn run(id: &str, n: u64) -> Result<Vec<String>, RewindError> {
    let (dir, _) = layer::find(id)?;
    // Held while the layer is written: no instance starts on it meanwhile.
    let _lock = match layer::ended(&dir, id) {
        Ok(l) => l,
        Err(live) => return running(id, n, live),
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

/// The instance runs: `serve` rewinds it (and records it) and answers.
fn running(id: &str, n: u64, live: LayerError) -> Result<Vec<String>, RewindError> {
    use crate::runtime::endpoint::{Op, Request};
    let Some(found) = crate::operator::find(id).ok().filter(|f| f.is_serve()) else {
        return Err(RewindError::NotServed {
            id: id.to_string(),
            live,
        });
    };
    let mut req = Request::new(Op::Rewind);
    req.checkpoint = Some(n);
    let wait = crate::supervisor::rewinder::DEADLINE + std::time::Duration::from_secs(60);
    let v = crate::operator::request_within(&found.dir, req, wait).map_err(|why| {
        RewindError::RunningFailed {
            id: id.to_string(),
            n,
            why,
        }
    })?;
    let frozen = match v["frozen"] == true {
        true => " (it was frozen before and stays so: `sandmux thaw` resumes it)",
        false => "",
    };
    Ok(vec![format!(
        "rewound the workspace of running instance {id} to checkpoint {n} (now checkpoint {}; {} entries written or removed){frozen}; `sandmux rewind {id} {}` undoes it",
        v["after"], v["written"].as_u64().unwrap_or(0) + v["removed"].as_u64().unwrap_or(0), v["before"]
    )])
}
