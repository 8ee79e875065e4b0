//! The proptest runner the property suites share (`#[path]`-included).

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Runs `f` on `cases` inputs from `strategy`; fails with proptest's minimal
/// counterexample; prints the number of inputs run, under `suite: name` (the
/// suite is the test binary including this file).
pub(crate) fn check<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    f: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let n = std::cell::Cell::new(0u64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    });
    let r = runner.run(&strategy, |v| {
        n.set(n.get() + 1);
        f(v)
    });
    let suite = env!("CARGO_CRATE_NAME");
    eprintln!("{suite}: {name}: {} inputs run", n.get());
    if let Err(e) = r {
        panic!("{name}: {e}");
    }
}
