//! `sandmux rewind ID N`: an ended instance's layer is rewound here
//! (`door::rewind`); a running instance's `serve` is asked over its
//! operator endpoint, and rewinds the workspace its panes see, frozen
//! meanwhile (`runtime::rewind`), recording it in its own log.

use crate::door::error::RewindError;
use crate::supervisor::layer::LayerError;
use std::process::ExitCode;

/// 0 done; 2 refused or failed (no such checkpoint, a record that cannot
/// be written, a running instance that could not be rewound).
pub(crate) fn rewind(id: &str, n: u64) -> ExitCode {
    let r = match crate::door::rewind::rewind_layer(id, n) {
        Err(RewindError::Live { id, live }) => running(&id, n, live),
        r => r,
    };
    match r {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandmux: {}", crate::term::printable(&e.to_string()));
            ExitCode::from(2)
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
