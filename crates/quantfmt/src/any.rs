//! The closed set of formats quantfmt ships, for static dispatch.
//!
//! [`AnyQuantizer`] and [`AnyStorage`] are enums over every format (via
//! `enum_dispatch`): no boxing, no vtable on the hot path, and they still implement the
//! object-safe [`Quantizer`] / [`Storage`] traits, so they go wherever a trait object
//! goes. Adding a format means adding one line to `formats!` below; nothing else in the
//! facade names a format.

use std::any::Any;
use std::fmt;
use std::ops::Range;

use enum_dispatch::enum_dispatch;
use quant_core::parallel::AmaxReducer;
use quant_core::{
    Buffer, BufferDesc, DType, Direction, Error, Format, GroupedStorage, HostDataMut, HostTensor,
    QuantizedTensor, Quantizer, Result, Shape, Storage, TensorProto, Usage,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Static-dispatch access to a quantizer variant (implemented for every [`Format`]).
#[enum_dispatch]
pub trait QuantizerVariant {
    /// The variant as a trait object.
    fn as_quantizer(&self) -> &dyn Quantizer;
    /// Quantizes into the matching [`AnyStorage`] variant (no boxing).
    fn quantize_any(&self, x: &HostTensor<'_>) -> Result<AnyStorage>;
}

/// Static-dispatch access to a storage variant (implemented for every `QuantizedTensor<F>`).
#[enum_dispatch]
pub trait StorageVariant {
    /// The variant as a trait object.
    fn as_storage(&self) -> &dyn Storage;
    /// The variant as a mutable trait object.
    fn as_storage_mut(&mut self) -> &mut dyn Storage;
}

impl<F: Format> QuantizerVariant for F
where
    QuantizedTensor<F>: Into<AnyStorage>,
{
    fn as_quantizer(&self) -> &dyn Quantizer {
        self
    }
    fn quantize_any(&self, x: &HostTensor<'_>) -> Result<AnyStorage> {
        Ok(quant_core::quantize(self, x)?.into())
    }
}

impl<F: Format> StorageVariant for QuantizedTensor<F> {
    fn as_storage(&self) -> &dyn Storage {
        self
    }
    fn as_storage_mut(&mut self) -> &mut dyn Storage {
        self
    }
}

macro_rules! formats {
    ($($variant:ident($q:ty)),+ $(,)?) => {
        /// Any quantizer quantfmt ships (static dispatch over the closed set of formats).
        #[enum_dispatch(QuantizerVariant)]
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum AnyQuantizer {
            $(
                #[allow(missing_docs)]
                $variant($q),
            )+
        }

        /// Any quantized tensor quantfmt ships (static dispatch over the closed set of formats).
        #[enum_dispatch(StorageVariant)]
        #[derive(Clone, Debug)]
        pub enum AnyStorage {
            $(
                #[allow(missing_docs)]
                $variant(QuantizedTensor<$q>),
            )+
        }

        impl AnyQuantizer {
            /// Converts a boxed quantizer of a shipped format into the enum.
            pub fn from_dyn(q: &dyn Quantizer) -> Result<AnyQuantizer> {
                $(
                    if let Some(v) = q.as_any().downcast_ref::<$q>() {
                        return Ok(AnyQuantizer::$variant(v.clone()));
                    }
                )+
                Err(Error::UnknownFormat {
                    name: q.format_name().to_string(),
                    valid: crate::registry().names().join(", "),
                })
            }
        }

        impl AnyStorage {
            /// Converts a boxed storage of a shipped format into the enum (no copy).
            pub fn from_box(s: Box<dyn Storage>) -> Result<AnyStorage> {
                let name = s.format_name();
                let any: Box<dyn Any> = s.into_any();
                $(
                    let any = match any.downcast::<QuantizedTensor<$q>>() {
                        Ok(t) => return Ok(AnyStorage::$variant(*t)),
                        Err(other) => other,
                    };
                )+
                drop(any);
                Err(Error::UnknownFormat {
                    name: name.to_string(),
                    valid: crate::registry().names().join(", "),
                })
            }
        }

        /// The registry of every shipped format.
        pub(crate) fn register_all(r: &mut quant_core::Registry) {
            $( r.register::<$q>(); )+
        }

        // Every shipped quantizer, its storages and its grouped storages can be shared
        // across threads: checked at compile time for each concrete type.
        const _: () = {
            const fn send_sync<T: Send + Sync>() {}
            $(
                send_sync::<$q>();
                send_sync::<QuantizedTensor<$q>>();
                send_sync::<quant_core::GroupedTensor<$q>>();
            )+
            send_sync::<AnyQuantizer>();
            send_sync::<AnyStorage>();
        };
    };
}

formats! {
    Fp8(fmt_fp8::Fp8Quantizer),
    Fp8Block(fmt_fp8::Fp8BlockQuantizer),
    Mxfp8(fmt_mxfp8::Mxfp8Quantizer),
    Nvfp4(fmt_nvfp4::Nvfp4Quantizer),
    Int4Tiled(fmt_int4tiled::Int4TiledQuantizer),
}

impl AnyQuantizer {
    /// Quantizes `x` into the matching storage variant (static dispatch).
    pub fn quantize(&self, x: &HostTensor<'_>) -> Result<AnyStorage> {
        self.quantize_any(x)
    }
}

impl Quantizer for AnyQuantizer {
    fn format_name(&self) -> &'static str {
        self.as_quantizer().format_name()
    }
    fn spec(&self) -> String {
        self.as_quantizer().spec()
    }
    fn options(&self) -> Result<serde_json::Value> {
        self.as_quantizer().options()
    }
    fn shape_rule(&self) -> &'static str {
        self.as_quantizer().shape_rule()
    }
    fn usage(&self) -> Usage {
        self.as_quantizer().usage()
    }
    fn input_passes(&self) -> usize {
        self.as_quantizer().input_passes()
    }
    fn with_usage(&self, usage: Usage) -> Box<dyn Quantizer> {
        self.as_quantizer().with_usage(usage)
    }
    fn check_shape(&self, shape: &Shape) -> Result<()> {
        self.as_quantizer().check_shape(shape)
    }
    fn buffers(&self, shape: &Shape) -> Result<Vec<BufferDesc>> {
        self.as_quantizer().buffers(shape)
    }
    fn quantize(&self, x: &HostTensor<'_>) -> Result<Box<dyn Storage>> {
        Quantizer::quantize(self.as_quantizer(), x)
    }
    fn quantize_reduced(
        &self,
        x: &HostTensor<'_>,
        reducer: &dyn AmaxReducer,
    ) -> Result<Box<dyn Storage>> {
        self.as_quantizer().quantize_reduced(x, reducer)
    }
    fn quantize_into(&self, x: &HostTensor<'_>, out: &mut dyn Storage) -> Result<()> {
        // An AnyStorage destination is unwrapped to its variant first.
        match out.as_any_mut().downcast_mut::<AnyStorage>() {
            Some(any) => self.as_quantizer().quantize_into(x, any.as_storage_mut()),
            None => self.as_quantizer().quantize_into(x, out),
        }
    }
    fn allocate(&self, shape: &Shape, dtype: DType) -> Result<Box<dyn Storage>> {
        self.as_quantizer().allocate(shape, dtype)
    }
    fn unflatten(
        &self,
        shape: &Shape,
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn Storage>> {
        self.as_quantizer().unflatten(shape, dtype, buffers)
    }
    fn quantize_grouped(
        &self,
        x: &HostTensor<'_>,
        shapes: &[Shape],
    ) -> Result<Box<dyn GroupedStorage>> {
        self.as_quantizer().quantize_grouped(x, shapes)
    }
    fn quantize_grouped_list(&self, xs: &[HostTensor<'_>]) -> Result<Box<dyn GroupedStorage>> {
        self.as_quantizer().quantize_grouped_list(xs)
    }
    fn unflatten_grouped(
        &self,
        shapes: &[Shape],
        dtype: DType,
        buffers: Vec<Buffer>,
    ) -> Result<Box<dyn GroupedStorage>> {
        self.as_quantizer()
            .unflatten_grouped(shapes, dtype, buffers)
    }
    fn clone_box(&self) -> Box<dyn Quantizer> {
        self.as_quantizer().clone_box()
    }
    fn dyn_eq(&self, other: &dyn Quantizer) -> bool {
        match other.as_any().downcast_ref::<AnyQuantizer>() {
            Some(o) => self == o,
            None => self.as_quantizer().dyn_eq(other),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Storage for AnyStorage {
    fn quantizer(&self) -> &dyn Quantizer {
        self.as_storage().quantizer()
    }
    fn shape(&self) -> &Shape {
        self.as_storage().shape()
    }
    fn dtype(&self) -> DType {
        self.as_storage().dtype()
    }
    fn buffers(&self) -> &[Buffer] {
        self.as_storage().buffers()
    }
    fn dequantize(&self, dir: Direction, dtype: DType) -> Result<HostTensor<'static>> {
        self.as_storage().dequantize(dir, dtype)
    }
    fn dequantize_into(&self, dir: Direction, out: HostDataMut<'_>) -> Result<()> {
        self.as_storage().dequantize_into(dir, out)
    }
    fn dequantize_f32(&self) -> Result<Vec<f32>> {
        self.as_storage().dequantize_f32()
    }
    fn update_usage(&mut self, usage: Usage) -> Result<()> {
        self.as_storage_mut().update_usage(usage)
    }
    fn gather_dim0(&self, ranges: &[Range<usize>]) -> Result<Box<dyn Storage>> {
        self.as_storage().gather_dim0(ranges)
    }
    fn proto(&self) -> TensorProto {
        self.as_storage().proto()
    }
    fn clone_box(&self) -> Box<dyn Storage> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl fmt::Display for AnyQuantizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tagged {
    format: String,
    options: serde_json::Value,
}

/// Serialized as `{"format": NAME, "options": {...}}`, the same pair the native file stores.
impl Serialize for AnyQuantizer {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let options = self.options().map_err(serde::ser::Error::custom)?;
        Tagged {
            format: self.format_name().to_string(),
            options,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for AnyQuantizer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let t = Tagged::deserialize(d)?;
        let q = crate::registry()
            .quantizer(&t.format, &t.options)
            .map_err(serde::de::Error::custom)?;
        AnyQuantizer::from_dyn(&*q).map_err(serde::de::Error::custom)
    }
}
