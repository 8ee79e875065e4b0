//! The replay filter under libFuzzer: any bytes, split at two points taken
//! from the input, give the same output as fed whole; the output holds only
//! kept sequences (`tests/common/replay_spec.rs`); it grows at most 3x; the
//! filter holds at most `CSI_MAX` + 4 bytes between chunks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandmux::testing::replay_filter::{filter_all, Filter, CSI_MAX};

#[path = "../../tests/common/replay_spec.rs"]
mod spec;

fuzz_target!(|data: &[u8]| {
    let whole = filter_all(data);
    let (a, b) = match data {
        [x, y, ..] => (
            *x as usize % (data.len() + 1),
            *y as usize * 7 % (data.len() + 1),
        ),
        _ => (0, data.len()),
    };
    let (a, b) = (a.min(b), a.max(b));
    let (mut f, mut out) = (Filter::new(), String::new());
    for part in [&data[..a], &data[a..b], &data[b..]] {
        f.feed(part, &mut out);
        assert!(f.held() <= CSI_MAX + 4);
    }
    f.finish(&mut out);
    assert_eq!(whole, out);
    if let Err(e) = spec::allowed(&whole) {
        panic!("{e} in {whole:?}");
    }
    assert!(whole.len() <= 3 * data.len());
});
