//! The proxy's parsers of bytes from inside under libFuzzer: the ClientHello
//! parser and the request-head checks never panic; a verdict of "more" only
//! below the bound; a name found is canonical.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandmux::testing::{head, hello, name};

fuzz_target!(|data: &[u8]| {
    match hello::parse(data) {
        hello::Hello::More => assert!(data.len() < hello::MAX_BYTES),
        hello::Hello::Sni(n) => assert_eq!(name::canonical(&n).as_deref(), Ok(n.as_str())),
        hello::Hello::Refused(_) => {}
    }
    if let head::Parsed::Done(r) = head::parse(data) {
        assert!(r.len <= data.len());
        assert_eq!(name::canonical(&r.host).as_deref(), Ok(r.host.as_str()));
    }
});
