//! Format spec parsing and option deserialization: any string is refused or gives a
//! quantizer whose canonical spec parses back to an equal quantizer, and any JSON options
//! are refused or give a quantizer that round-trips through its spec and its options.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfmt::{FormatSpec, Quantizer, Usage, registry};

fn round_trips(q: &dyn Quantizer) {
    let again = registry()
        .parse_spec(&q.spec(), q.usage())
        .unwrap_or_else(|e| panic!("canonical spec `{}` refused: {e}", q.spec()));
    assert!(again.dyn_eq(q), "spec `{}` does not round-trip", q.spec());
    let opts = q.options().unwrap();
    let back = registry()
        .quantizer(q.format_name(), &opts)
        .unwrap_or_else(|e| panic!("options of `{}` refused: {e}", q.spec()));
    assert!(
        back.dyn_eq(q),
        "options of `{}` do not round-trip",
        q.spec()
    );
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (spec, json) = text.split_once('\n').unwrap_or((&text, ""));
    for usage in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
        if let Ok(q) = registry().parse_spec(spec, usage) {
            round_trips(&*q);
        }
    }
    if let Ok(s) = spec.parse::<FormatSpec>() {
        let q = s.boxed(Usage::ROWWISE).unwrap();
        round_trips(&*q);
        assert_eq!(s.to_string().parse::<FormatSpec>().unwrap(), s);
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(json) {
        for e in registry().entries() {
            if let Ok(q) = registry().quantizer(e.name, &v) {
                round_trips(&*q);
            }
        }
        let _ = serde_json::from_value::<quantfmt::AnyQuantizer>(v);
    }
});
