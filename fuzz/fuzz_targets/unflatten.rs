//! Unflatten with arbitrary buffer contents: for any registered quantizer and shape, the
//! format's buffers filled with fuzzer bytes are either refused by `validate_buffers` or
//! give a storage (and a grouped storage) whose every operation works.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use quantfmt::{Buffer, Shape};
use quantfmt_fuzz::{Recipe, dtype_from, exercise, exercise_grouped, shape_from};

#[derive(Arbitrary, Debug)]
struct Input {
    recipe: Recipe,
    dims: Vec<u16>,
    dtype: u8,
    fill: Vec<u8>,
}

fn filled(q: &dyn quantfmt::Quantizer, shapes: &[Shape], fill: &[u8]) -> Option<Vec<Buffer>> {
    let descs = if shapes.len() == 1 {
        q.buffers(&shapes[0]).ok()?
    } else {
        quant_core::GroupLayout::new(q, shapes)
            .ok()?
            .grouped_descs()
    };
    let mut at = 0usize;
    descs
        .into_iter()
        .map(|d| {
            let n = d.nbytes().ok()?;
            if n > 1 << 20 {
                return None;
            }
            let bytes: Vec<u8> = (0..n)
                .map(|i| fill.get((at + i) % fill.len().max(1)).copied().unwrap_or(0))
                .collect();
            at += n;
            Buffer::from_bytes(d, &bytes).ok()
        })
        .collect()
}

fuzz_target!(|input: Input| {
    let Some(q) = input.recipe.quantizer() else {
        return;
    };
    let Some(shape) = shape_from(&input.dims, 1 << 14) else {
        return;
    };
    let dtype = dtype_from(input.dtype);
    if let Some(bufs) = filled(&*q, std::slice::from_ref(&shape), &input.fill) {
        if let Ok(s) = q.unflatten(&shape, dtype, bufs) {
            exercise(&*s);
        }
    }
    let shapes = [shape.clone(), shape];
    if let Some(bufs) = filled(&*q, &shapes, &input.fill) {
        if let Ok(g) = q.unflatten_grouped(&shapes, dtype, bufs) {
            exercise_grouped(&*g);
        }
    }
});
