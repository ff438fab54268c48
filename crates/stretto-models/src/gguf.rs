//! Reading GGUF files (llama.cpp's model format) and dequantizing their tensors to `f32`.
//!
//! The file is memory-mapped; tensors are dequantized on demand. Supported tensor types are the ones the bundled
//! models use: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K (block layouts as in llama.cpp's
//! `ggml-quants.c`).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use crate::error::{ModelError, Result};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any unsigned integer.
    U64(u64),
    /// Any signed integer.
    I64(i64),
    /// Any float.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Value>),
}

impl Value {
    /// As an unsigned integer, if it is one (signed non-negative values too).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(*v),
            Value::I64(v) if *v >= 0 => Some(*v as u64),
            _ => None,
        }
    }

    /// As a float, if numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            Value::U64(v) => Some(*v as f64),
            Value::I64(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// As an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// GGML tensor types this reader dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    BF16,
    /// 4-bit, one scale per 32.
    Q4_0,
    /// 4-bit, scale and minimum per 32.
    Q4_1,
    /// 5-bit, one scale per 32.
    Q5_0,
    /// 8-bit, one scale per 32.
    Q8_0,
    /// 4-bit k-quant (super-blocks of 256).
    Q4K,
    /// 6-bit k-quant (super-blocks of 256).
    Q6K,
}

impl TensorType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            14 => Self::Q6K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q6K => (256, 210),
        }
    }
}

/// Where a tensor lives in the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Dimensions as GGUF stores them (innermost first).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: TensorType,
    /// Byte offset in the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An open GGUF file.
pub struct Gguf {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Metadata by key.
    pub metadata: BTreeMap<String, Value>,
    /// Tensors by name.
    pub tensors: BTreeMap<String, TensorInfo>,
    data_start: usize,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf").field("path", &self.path).field("tensors", &self.tensors.len()).finish()
    }
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Cursor<'a> {
    fn bad(&self, message: impl Into<String>) -> ModelError {
        ModelError::Format {
            file: self.file.to_string(),
            message: format!("{} (at byte {})", message.into(), self.pos),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| self.bad("truncated"))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| self.bad("truncated"))?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| self.bad("truncated"))?))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()? as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("string is not UTF-8"))
    }
    fn value(&mut self, ty: u32) -> Result<Value> {
        self.value_within(ty, 0)
    }
    /// A value `depth` arrays deep (real files nest none; a crafted one could recurse until the stack overflows).
    fn value_within(&mut self, ty: u32, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::U64(self.take(1)?[0] as u64),
            1 => Value::I64(self.take(1)?[0] as i8 as i64),
            2 => Value::U64(u16::from_le_bytes(self.take(2)?.try_into().unwrap_or([0; 2])) as u64),
            3 => Value::I64(i16::from_le_bytes(self.take(2)?.try_into().unwrap_or([0; 2])) as i64),
            4 => Value::U64(self.u32()? as u64),
            5 => Value::I64(self.u32()? as i32 as i64),
            6 => Value::F64(f32::from_bits(self.u32()?) as f64),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.bad(format!("metadata arrays nested more than {MAX_ARRAY_DEPTH} deep")));
                }
                let inner = self.u32()?;
                let n = self.u64()?;
                // Every element takes at least a byte of what is left of the file.
                if n > (self.data.len() - self.pos.min(self.data.len())) as u64 {
                    return Err(self.bad("array length exceeds the file"));
                }
                let mut v = Vec::with_capacity((n as usize).min(1 << 16));
                for _ in 0..n {
                    v.push(self.value_within(inner, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            other => return Err(self.bad(format!("unknown metadata type {other}"))),
        })
    }
}

/// How deep metadata arrays may nest (GGUF's own keys nest none).
const MAX_ARRAY_DEPTH: usize = 8;

impl Gguf {
    /// Opens and parses a GGUF file's header; tensor data stays mapped, not read.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the map is read-only and model files are not modified while Stretto runs; a concurrent writer
        // could only change values, never memory safety of the slice bounds we check.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let name = path.display().to_string();
        let mut c = Cursor { data: &map, pos: 0, file: &name };
        if c.take(4)? != b"GGUF" {
            return Err(c.bad("not a GGUF file (bad magic)"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(c.bad(format!("unsupported GGUF version {version}")));
        }
        let n_tensors = c.u64()? as usize;
        let n_kv = c.u64()? as usize;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            metadata.insert(key, c.value(ty)?);
        }
        let mut tensors = BTreeMap::new();
        for _ in 0..n_tensors {
            let tname = c.string()?;
            let n_dims = c.u32()? as usize;
            let dims = (0..n_dims).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
            let tid = c.u32()?;
            let ty =
                TensorType::from_id(tid).ok_or_else(|| c.bad(format!("tensor {tname}: unsupported type {tid}")))?;
            let offset = c.u64()?;
            tensors.insert(tname, TensorInfo { dims, ty, offset });
        }
        let align = metadata.get("general.alignment").and_then(Value::as_u64).unwrap_or(32);
        if align == 0 || align > 1 << 20 {
            return Err(c.bad(format!("general.alignment {align} is not a usable alignment")));
        }
        let align = align as usize;
        let data_start = c.pos.div_ceil(align) * align;
        let gguf = Self { path: path.to_path_buf(), map, metadata, tensors, data_start };
        for (n, t) in &gguf.tensors {
            gguf.bytes_of(n, t)?;
        }
        Ok(gguf)
    }

    fn bad(&self, message: impl Into<String>) -> ModelError {
        ModelError::Format { file: self.path.display().to_string(), message: message.into() }
    }

    /// The file it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bytes_of(&self, name: &str, t: &TensorInfo) -> Result<&[u8]> {
        let (per, bytes) = t.ty.block();
        let beyond = || self.bad(format!("tensor {name} lies beyond the end of the file"));
        // Dimensions and offsets are the file's word: checked, so a crafted one cannot overflow.
        let len = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(beyond)?;
        let len = usize::try_from(len).map_err(|_| beyond())?;
        if !len.is_multiple_of(per) {
            return Err(self.bad(format!("tensor {name}: {len} elements is not a whole number of blocks")));
        }
        let size = (len / per).checked_mul(bytes).ok_or_else(beyond)?;
        let start = usize::try_from(t.offset).ok().and_then(|o| self.data_start.checked_add(o)).ok_or_else(beyond)?;
        let end = start.checked_add(size).ok_or_else(beyond)?;
        self.map.get(start..end).ok_or_else(beyond)
    }

    /// A metadata value, or an error naming the missing key.
    pub fn meta(&self, key: &str) -> Result<&Value> {
        self.metadata.get(key).ok_or_else(|| self.bad(format!("metadata key `{key}` is missing")))
    }

    /// A tensor's info.
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.get(name).ok_or_else(|| self.bad(format!("tensor `{name}` is missing")))
    }

    /// A tensor dequantized to `f32`, in storage order (GGUF's innermost dimension fastest).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        let raw = self.bytes_of(name, t)?;
        let mut out = vec![0f32; t.len()];
        dequantize(t.ty, raw, &mut out);
        Ok(out)
    }
}

/// Dequantizes `raw` blocks of type `ty` into `out` (whose length is a whole number of blocks).
pub fn dequantize(ty: TensorType, raw: &[u8], out: &mut [f32]) {
    let (per, bytes) = ty.block();
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    for (blk, y) in raw.chunks_exact(bytes).zip(out.chunks_exact_mut(per)) {
        match ty {
            TensorType::F32 => y[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            TensorType::F16 => y[0] = h(blk, 0),
            TensorType::BF16 => y[0] = bf16::from_le_bytes([blk[0], blk[1]]).to_f32(),
            TensorType::Q4_0 => {
                let d = h(blk, 0);
                for j in 0..16 {
                    y[j] = ((blk[2 + j] & 0x0f) as i32 - 8) as f32 * d;
                    y[j + 16] = ((blk[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
            TensorType::Q4_1 => {
                let (d, m) = (h(blk, 0), h(blk, 2));
                for j in 0..16 {
                    y[j] = (blk[4 + j] & 0x0f) as f32 * d + m;
                    y[j + 16] = (blk[4 + j] >> 4) as f32 * d + m;
                }
            }
            TensorType::Q5_0 => {
                let d = h(blk, 0);
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                    y[j] = (((blk[6 + j] & 0x0f) | xh0) as i32 - 16) as f32 * d;
                    y[j + 16] = (((blk[6 + j] >> 4) | xh1) as i32 - 16) as f32 * d;
                }
            }
            TensorType::Q8_0 => {
                let d = h(blk, 0);
                for j in 0..32 {
                    y[j] = blk[2 + j] as i8 as f32 * d;
                }
            }
            TensorType::Q4K => {
                let (d, dmin) = (h(blk, 0), h(blk, 2));
                let scales = &blk[4..16];
                let qs = &blk[16..144];
                for (k, chunk) in (0..4).map(|k| (k, &qs[k * 32..k * 32 + 32])) {
                    let (sc1, m1) = scale_min_k4(2 * k, scales);
                    let (sc2, m2) = scale_min_k4(2 * k + 1, scales);
                    let (d1, min1, d2, min2) = (d * sc1 as f32, dmin * m1 as f32, d * sc2 as f32, dmin * m2 as f32);
                    for l in 0..32 {
                        y[k * 64 + l] = d1 * (chunk[l] & 0x0f) as f32 - min1;
                        y[k * 64 + 32 + l] = d2 * (chunk[l] >> 4) as f32 - min2;
                    }
                }
            }
            TensorType::Q6K => {
                let ql = &blk[0..128];
                let qh = &blk[128..192];
                let sc = &blk[192..208];
                let d = h(blk, 208);
                for half in 0..2 {
                    let (ql, qh, sc, y) = (&ql[half * 64..], &qh[half * 32..], &sc[half * 8..], &mut y[half * 128..]);
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K super-block.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    /// A GGUF v3 file of `kvs` (key, type, encoded value) and `tensors` (name, dims, offset; F32), with `data` after
    /// the header at 32-byte alignment.
    fn gguf(kvs: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u64)], data: &[u8]) -> tempfile::NamedTempFile {
        let text = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            text(&mut b, k);
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, offset) in tensors {
            text(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(0u32.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend(data);
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, &b).unwrap();
        f
    }

    fn string(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    }

    /// What a crafted or damaged header claims is an error naming the file, never a panic (a division by zero, a
    /// stack overflow, an overflowing size).
    #[test]
    fn impossible_headers_are_errors() {
        let err = |f: &tempfile::NamedTempFile| Gguf::open(f.path()).unwrap_err().to_string();
        let e = err(&gguf(&[("general.alignment", 4, 0u32.to_le_bytes().to_vec())], &[], &[]));
        assert!(e.contains("alignment 0"), "{e}");
        // An array of one array of one array ... of one bool (an array value: element type, count, elements).
        let mut nested = [7u32.to_le_bytes().to_vec(), 1u64.to_le_bytes().to_vec(), vec![1]].concat();
        for _ in 0..12 {
            nested = [9u32.to_le_bytes().to_vec(), 1u64.to_le_bytes().to_vec(), nested].concat();
        }
        let e = err(&gguf(&[("deep", 9, nested)], &[], &[]));
        assert!(e.contains("nested more than 8"), "{e}");
        let e = err(&gguf(
            &[("big", 9, [8u32.to_le_bytes().to_vec(), u64::MAX.to_le_bytes().to_vec()].concat())],
            &[],
            &[],
        ));
        assert!(e.contains("array length exceeds the file"), "{e}");
        for (dims, offset) in [(&[u64::MAX, 4][..], 0), (&[4][..], u64::MAX - 8), (&[4][..], 0)] {
            let e = err(&gguf(&[], &[("t", dims, offset)], &[0u8; 8]));
            assert!(e.contains("tensor t lies beyond the end of the file"), "{e}");
        }
        let ok = gguf(&[], &[("t", &[2], 0)], &[0u8; 8]);
        assert_eq!(Gguf::open(ok.path()).unwrap().tensor_f32("t").unwrap(), [0.0, 0.0]);
    }

    #[test]
    fn attention_heads_that_do_not_divide_are_an_error() {
        let u32v = |n: u32| n.to_le_bytes().to_vec();
        let tokenizer = tokenizers::Tokenizer::new(tokenizers::models::wordlevel::WordLevel::default());
        for (heads, kv) in [(0, 0), (2, 0), (3, 1), (2, 4)] {
            let f = gguf(
                &[
                    ("general.architecture", 8, string("qwen2")),
                    ("qwen2.embedding_length", 4, u32v(8)),
                    ("qwen2.attention.head_count", 4, u32v(heads)),
                    ("qwen2.attention.head_count_kv", 4, u32v(kv)),
                    ("qwen2.block_count", 4, u32v(1)),
                    ("qwen2.feed_forward_length", 4, u32v(16)),
                    ("qwen2.attention.layer_norm_rms_epsilon", 6, 1e-6f32.to_le_bytes().to_vec()),
                ],
                &[("token_embd.weight", &[8, 2], 0)],
                &[0u8; 64],
            );
            let g = Gguf::open(f.path()).unwrap();
            let e = crate::convert::DecoderConfig::from_gguf(&g, &tokenizer).unwrap_err().to_string();
            assert!(e.contains("the heads must divide the width"), "{heads} / {kv}: {e}");
        }
    }

    #[test]
    fn q4_1_and_q8_0_blocks() {
        // Q4_1: d = 0.5, m = -1; nibble j in low half, 15 - j in high half.
        let mut blk = Vec::new();
        blk.extend(f16b(0.5));
        blk.extend(f16b(-1.0));
        blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0f32; 32];
        dequantize(TensorType::Q4_1, &blk, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], j as f32 * 0.5 - 1.0);
            assert_eq!(y[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
        let mut blk = Vec::new();
        blk.extend(f16b(0.25));
        blk.extend((0..32i8).map(|j| (j - 16) as u8));
        dequantize(TensorType::Q8_0, &blk, &mut y);
        assert_eq!(y[0], -4.0);
        assert_eq!(y[31], 3.75);
    }

    #[test]
    fn q5_0_high_bits() {
        let mut blk = Vec::new();
        blk.extend(f16b(1.0));
        // High bit set for element 0 (bit 0) and element 16 (bit 16).
        blk.extend(0x0001_0001u32.to_le_bytes());
        blk.extend([0x00u8; 16]);
        let mut y = [0f32; 32];
        dequantize(TensorType::Q5_0, &blk, &mut y);
        assert_eq!(y[0], 0.0); // 16 - 16
        assert_eq!(y[1], -16.0);
        assert_eq!(y[16], 0.0);
        assert_eq!(y[17], -16.0);
    }

    #[test]
    fn q4_k_scales_and_mins() {
        let mut blk = Vec::new();
        blk.extend(f16b(1.0));
        blk.extend(f16b(0.5));
        // Sub-blocks 0..4: scale 2, min 4; sub-blocks 4..8: scale 3 (low nibble) with no high bits, min 1.
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = 2;
            scales[j + 4] = 4;
        }
        for s in &mut scales[8..12] {
            *s = 3 | (1 << 4);
        }
        blk.extend(scales);
        blk.extend([0x21u8; 128]); // low nibble 1, high nibble 2
        let mut y = [0f32; 256];
        dequantize(TensorType::Q4K, &blk, &mut y);
        assert_eq!(y[0], 2.0 * 1.0 - 0.5 * 4.0); // sub-block 0, low nibble
        assert_eq!(y[32], 2.0 * 2.0 - 0.5 * 4.0); // sub-block 1, high nibble
        assert_eq!(y[128], 3.0 * 1.0 - 0.5 * 1.0); // sub-block 4
        assert_eq!(y[255], 3.0 * 2.0 - 0.5 * 1.0); // sub-block 7
    }

    #[test]
    fn q6_k_layout() {
        let mut blk = vec![0u8; 210];
        // Element 0: low 4 bits from ql[0] low nibble, high 2 bits from qh[0] bits 0..2.
        blk[0] = 0x05;
        blk[128] = 0b10;
        for s in 0..16 {
            blk[192 + s] = 2;
        }
        blk[208..210].copy_from_slice(&f16b(0.5));
        let mut y = [0f32; 256];
        dequantize(TensorType::Q6K, &blk, &mut y);
        assert_eq!(y[0], 0.5 * 2.0 * ((5 | (2 << 4)) as f32 - 32.0));
        assert_eq!(y[1], 0.5 * 2.0 * -32.0);
    }
}
