//! One spec per kernel family: each recipe, and the options that take walks of their
//! own. The tests that run "every kernel" once (the heap bound of the `_into` paths, the
//! pool-size independence) share this list.

/// The specs, in registry order.
pub const FAMILIES: [&str; 18] = [
    "fp8",
    "fp8:e5m2,pow2",
    "fp8-block:1x128",
    "fp8-block:128x128",
    "fp8-block:1x128,fp32-scales",
    "mxfp8",
    "mxfp8:2d",
    "mxfp8:swizzled",
    "nvfp4",
    "nvfp4:2d",
    "nvfp4:rht",
    "nvfp4:sr",
    "nvfp4:row-scaled",
    "nvfp4:4over6",
    "nvfp4:swizzled",
    "nvfp4:rht,sr",
    "int4tiled",
    "int4tiled:g32",
];
