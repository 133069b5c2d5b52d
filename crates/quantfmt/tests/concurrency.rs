//! Quantizers and storages are `Send + Sync` (checked at compile time for every shipped
//! type in `src/any.rs`, and for the trait objects here), quantizing from many threads
//! at once gives the same bytes as quantizing alone, and the bytes do not depend on the
//! size of the worker pool.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "support/families.rs"]
mod families;
#[path = "support/outputs.rs"]
mod outputs;

use std::sync::{Arc, Barrier};

use families::FAMILIES;
use outputs::{buffer_bytes, dequantizations};

use quantfmt::io::{LoadedFile, load_bytes, save};
use quantfmt::{
    AnyQuantizer, AnyStorage, Buffer, GroupedStorage, HostTensor, Quantizer, Registry, Storage,
    TensorProto, Usage, registry,
};
use quantfmt_testkit::XorShift32;

const fn send_sync<T: Send + Sync + ?Sized>() {}
const _: () = {
    send_sync::<dyn Quantizer>();
    send_sync::<dyn Storage>();
    send_sync::<dyn GroupedStorage>();
    send_sync::<AnyQuantizer>();
    send_sync::<AnyStorage>();
    send_sync::<Buffer>();
    send_sync::<HostTensor<'static>>();
    send_sync::<TensorProto>();
    send_sync::<Registry>();
    send_sync::<LoadedFile>();
};

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut rng = XorShift32::new(seed.wrapping_mul(2_654_435_761).wrapping_add(1));
    (0..n)
        .map(|i| {
            let s = rng.next_u32();
            let u = (s as f32 / u32::MAX as f32) - 0.5;
            if i % 61 == 0 { u * 300.0 } else { u }
        })
        .collect()
}

const THREADS: usize = 8;

#[test]
fn quantizing_from_many_threads_at_once_gives_identical_bytes() {
    let (m, k) = (256, 512);
    let w = data(m * k, 3);
    let x = HostTensor::f32(&w, &[m, k]).unwrap();
    for e in registry().entries() {
        let q: Arc<dyn Quantizer> = Arc::from(
            e.from_spec(&[], Usage::BOTH)
                .or_else(|_| e.from_spec(&[], Usage::ROWWISE))
                .unwrap(),
        );
        let alone = q.quantize(&x).unwrap();
        let start = Barrier::new(THREADS);
        // One quantizer and one input shared by every thread, all starting together
        // (each quantize also fans out over rayon's pool).
        let results: Vec<Box<dyn Storage>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (q, x, start) = (&q, &x, &start);
                    s.spawn(move || {
                        start.wait();
                        q.quantize(x).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            for (a, b) in alone.buffers().iter().zip(r.buffers()) {
                assert!(a.bytes() == b.bytes(), "{}: {} differs", q.spec(), a.name());
            }
        }
        // A storage shared across threads: concurrent dequantization agrees too.
        let shared: Arc<dyn Storage> = Arc::from(alone);
        let want = shared.dequantize_f32().unwrap();
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let (shared, want) = (&shared, &want);
                s.spawn(move || assert_eq!(&shared.dequantize_f32().unwrap(), want));
            }
        });
    }
}

#[test]
fn registry_and_loading_are_usable_from_many_threads() {
    let (m, k) = (128, 256);
    let w = data(m * k, 4);
    let x = HostTensor::f32(&w, &[m, k]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = registry()
        .entries()
        .iter()
        .map(|e| {
            let q = e.from_spec(&[], Usage::ROWWISE).unwrap();
            let s = q.quantize(&x).unwrap();
            let path = dir.path().join(format!("{}.safetensors", e.name));
            save(&path, &[("w", &s)]).unwrap();
            (e.name.to_string(), std::fs::read(&path).unwrap())
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let files = &files;
            s.spawn(move || {
                for (name, bytes) in files.iter().cycle().skip(t).take(files.len() * 2) {
                    let q = registry().parse_spec(name, Usage::ROWWISE).unwrap();
                    assert_eq!(q.format_name(), name);
                    let f = load_bytes(bytes).unwrap();
                    assert!(f.get("w").is_some());
                }
            });
        }
    });
}

/// The work splits differ with the pool's size (strips per worker, tasks per slab), and
/// the bytes must not: every kernel family ([`FAMILIES`]), each usage, from f32 and bf16,
/// quantized and dequantized (each direction, into each float dtype) on pools of 1, 2, 3
/// and 5 workers. `[1056, 768]` is 8.25 slabs of 128 rows and 33 MXFP8 groups, so the
/// splits have partial ends.
#[test]
fn bytes_do_not_depend_on_the_number_of_workers() {
    let (m, k) = (1056, 768);
    let w = data(m * k, 5);
    let pools: Vec<rayon::ThreadPool> = [1, 2, 3, 5]
        .iter()
        .map(|&n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap()
        })
        .collect();
    let mut checked = 0;
    for spec in FAMILIES {
        let spec: quantfmt::FormatSpec = spec.parse().unwrap();
        for usage in [Usage::ROWWISE, Usage::COLUMNWISE, Usage::BOTH] {
            let Ok(q) = spec.boxed(usage) else { continue };
            for dtype in [quantfmt::DType::F32, quantfmt::DType::BF16] {
                let x = HostTensor::f32(&w, &[m, k])
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                // Bytes of every buffer and of every dequantization the storage gives.
                let run = || {
                    let s = q.quantize(&x).ok()?;
                    let mut all = buffer_bytes(&*s);
                    all.extend(dequantizations(&*s).into_iter().flatten());
                    Some(all)
                };
                let want = pools[0].install(run);
                let Some(want) = want else { continue };
                for pool in &pools[1..] {
                    let got = pool.install(run).unwrap();
                    assert_eq!(got.len(), want.len(), "{spec} {usage} {dtype}");
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g == w,
                            "{spec} {usage} from {dtype}: output {i} differs on {} workers",
                            pool.current_num_threads()
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 150, "only {checked} comparisons");
}
