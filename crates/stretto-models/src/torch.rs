//! A reader for PyTorch's *legacy* (pre-1.6, non-zip) `torch.save` format holding a state dict, without Python.
//!
//! The file is a sequence of pickles (magic number, protocol version, system info, the state dict whose tensors
//! refer to storages by persistent id, the list of storage keys) followed by each storage's raw bytes, prefixed by
//! its element count. Only what state dicts use is interpreted: a small pickle machine builds dicts, tuples and
//! lists, and recognises `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2` and the storage types; any
//! other callable is an error rather than code execution.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{ModelError, Result};

const MAGIC: u128 = 0x1950a86a20f9469cfc6c;

/// A dense tensor read from a state dict.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchTensor {
    /// Shape.
    pub shape: Vec<usize>,
    /// Values in row-major order, converted to f32.
    pub data: Vec<f32>,
}

#[derive(Debug, Clone)]
enum V {
    None,
    Bool,
    Int(i64),
    Float,
    Str(String),
    Tuple(Vec<V>),
    List(Vec<V>),
    Dict(Vec<(V, V)>),
    Global(String, String),
    Storage { key: String, elem: usize, float: bool },
    Tensor { key: String, elem: usize, float: bool, offset: usize, size: Vec<usize>, stride: Vec<usize> },
    Mark,
}

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    file: &'a Path,
}

impl<'a> Machine<'a> {
    fn err(&self, m: impl Into<String>) -> ModelError {
        ModelError::Format {
            file: self.file.display().to_string(),
            message: format!("{} (at byte {})", m.into(), self.pos),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| self.err("truncated"))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn line(&mut self) -> Result<String> {
        let start = self.pos;
        while self.u8()? != b'\n' {}
        Ok(String::from_utf8_lossy(&self.bytes[start..self.pos - 1]).into_owned())
    }

    fn pop_mark(&self, stack: &mut Vec<V>) -> Result<Vec<V>> {
        let at = stack.iter().rposition(|v| matches!(v, V::Mark)).ok_or_else(|| self.err("MARK missing"))?;
        let items = stack.split_off(at + 1);
        stack.pop();
        Ok(items)
    }

    fn pop(&self, stack: &mut Vec<V>) -> Result<V> {
        stack.pop().ok_or_else(|| self.err("pickle stack underflow"))
    }

    /// Runs one pickle to its STOP opcode.
    fn load(&mut self) -> Result<V> {
        let mut stack: Vec<V> = Vec::new();
        let mut memo: HashMap<u32, V> = HashMap::new();
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?;
                }
                b'.' => return self.pop(&mut stack),
                b'(' => stack.push(V::Mark),
                b'N' => stack.push(V::None),
                0x88 | 0x89 => stack.push(V::Bool),
                b'K' => {
                    let v = self.u8()?;
                    stack.push(V::Int(v as i64))
                }
                b'M' => {
                    let b = self.take(2)?;
                    stack.push(V::Int(u16::from_le_bytes([b[0], b[1]]) as i64))
                }
                b'J' => {
                    let v = self.u32()? as i32;
                    stack.push(V::Int(v as i64))
                }
                0x8a => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    if n > 16 {
                        return Err(self.err("integer too large"));
                    }
                    let mut buf = [0u8; 16];
                    buf[..n].copy_from_slice(b);
                    if n > 0 && b[n - 1] & 0x80 != 0 {
                        buf[n..].fill(0xff);
                    }
                    let v = i128::from_le_bytes(buf);
                    // Only the magic number is this wide; keep it recognisable.
                    stack.push(if v as u128 == MAGIC { V::Int(-1) } else { V::Int(v as i64) })
                }
                b'G' => {
                    self.take(8)?;
                    stack.push(V::Float)
                }
                b'X' | b'T' => {
                    let n = self.u32()? as usize;
                    let s = String::from_utf8_lossy(self.take(n)?).into_owned();
                    stack.push(V::Str(s))
                }
                b'U' => {
                    let n = self.u8()? as usize;
                    let s = String::from_utf8_lossy(self.take(n)?).into_owned();
                    stack.push(V::Str(s))
                }
                b'}' => stack.push(V::Dict(Vec::new())),
                b']' => stack.push(V::List(Vec::new())),
                b')' => stack.push(V::Tuple(Vec::new())),
                b't' => {
                    let items = self.pop_mark(&mut stack)?;
                    stack.push(V::Tuple(items))
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if stack.len() < n {
                        return Err(self.err("pickle stack underflow"));
                    }
                    let items = stack.split_off(stack.len() - n);
                    stack.push(V::Tuple(items))
                }
                b'q' => {
                    let i = self.u8()? as u32;
                    memo.insert(i, stack.last().cloned().ok_or_else(|| self.err("BINPUT on empty stack"))?);
                }
                b'r' => {
                    let i = self.u32()?;
                    memo.insert(i, stack.last().cloned().ok_or_else(|| self.err("BINPUT on empty stack"))?);
                }
                b'h' | b'j' => {
                    let i = if op == b'h' { self.u8()? as u32 } else { self.u32()? };
                    stack.push(memo.get(&i).cloned().ok_or_else(|| self.err(format!("memo {i} missing")))?)
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    stack.push(V::Global(module, name))
                }
                b's' | b'u' => {
                    let items = if op == b's' {
                        let v = self.pop(&mut stack)?;
                        let k = self.pop(&mut stack)?;
                        vec![k, v]
                    } else {
                        self.pop_mark(&mut stack)?
                    };
                    match stack.last_mut() {
                        Some(V::Dict(d)) => {
                            let mut it = items.into_iter();
                            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                                d.push((k, v));
                            }
                        }
                        _ => return Err(self.err("SETITEM on a non-dict")),
                    }
                }
                b'a' | b'e' => {
                    let items = if op == b'a' { vec![self.pop(&mut stack)?] } else { self.pop_mark(&mut stack)? };
                    match stack.last_mut() {
                        Some(V::List(l)) => l.extend(items),
                        _ => return Err(self.err("APPEND on a non-list")),
                    }
                }
                b'b' => {
                    // BUILD sets object state (a state dict's `_metadata`); not needed for the tensors.
                    self.pop(&mut stack)?;
                }
                b'Q' => {
                    let pid = self.pop(&mut stack)?;
                    stack.push(self.storage(pid)?)
                }
                b'R' => {
                    let args = self.pop(&mut stack)?;
                    let f = self.pop(&mut stack)?;
                    stack.push(self.reduce(f, args)?)
                }
                other => return Err(self.err(format!("unsupported pickle opcode 0x{other:02x}"))),
            }
        }
    }

    fn storage(&self, pid: V) -> Result<V> {
        let V::Tuple(items) = pid else { return Err(self.err("persistent id is not a tuple")) };
        match items.as_slice() {
            [V::Str(kind), V::Global(_, ty), V::Str(key), ..] if kind == "storage" => {
                let (elem, float) = match ty.as_str() {
                    "FloatStorage" => (4, true),
                    "HalfStorage" => (2, true),
                    "DoubleStorage" => (8, true),
                    "LongStorage" => (8, false),
                    "IntStorage" => (4, false),
                    other => return Err(self.err(format!("storage type {other} is not supported"))),
                };
                Ok(V::Storage { key: key.clone(), elem, float })
            }
            _ => Err(self.err("unrecognised persistent id")),
        }
    }

    fn reduce(&self, f: V, args: V) -> Result<V> {
        let V::Global(module, name) = f else { return Err(self.err("REDUCE of a non-callable")) };
        let V::Tuple(args) = args else { return Err(self.err("REDUCE arguments are not a tuple")) };
        let ints = |v: &V| -> Result<Vec<usize>> {
            match v {
                V::Tuple(xs) => xs
                    .iter()
                    .map(|x| match x {
                        V::Int(i) if *i >= 0 => Ok(*i as usize),
                        _ => Err(self.err("bad tensor size")),
                    })
                    .collect(),
                _ => Err(self.err("bad tensor size")),
            }
        };
        match (module.as_str(), name.as_str()) {
            ("collections", "OrderedDict") => Ok(V::Dict(Vec::new())),
            ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => match args.as_slice() {
                [V::Storage { key, elem, float }, V::Int(offset), size, stride, ..] => Ok(V::Tensor {
                    key: key.clone(),
                    elem: *elem,
                    float: *float,
                    offset: *offset as usize,
                    size: ints(size)?,
                    stride: ints(stride)?,
                }),
                _ => Err(self.err("bad _rebuild_tensor arguments")),
            },
            _ => Err(self.err(format!("refusing to call {module}.{name} (only state dicts are read)"))),
        }
    }
}

/// Reads a legacy-format state dict: tensor name → tensor (integer tensors such as `num_batches_tracked` are
/// skipped).
pub fn read_state_dict(path: &Path) -> Result<Vec<(String, TorchTensor)>> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
    let mut m = Machine { bytes: &bytes, pos: 0, file: path };
    if !matches!(m.load()?, V::Int(-1)) {
        return Err(m.err("not a legacy torch.save file (zip-format files are not supported)"));
    }
    let _protocol = m.load()?;
    let _sys = m.load()?;
    let V::Dict(entries) = m.load()? else { return Err(m.err("the saved object is not a state dict")) };
    let V::List(keys) = m.load()? else { return Err(m.err("storage key list missing")) };
    // Storages follow in key order, each as a u64 element count and raw little-endian data.
    let kinds: HashMap<String, usize> = entries
        .iter()
        .filter_map(|(_, v)| match v {
            V::Tensor { key, elem, .. } => Some((key.clone(), *elem)),
            _ => None,
        })
        .collect();
    let mut storages: HashMap<String, (usize, &[u8])> = HashMap::new();
    for k in keys {
        let V::Str(key) = k else { return Err(m.err("bad storage key")) };
        let elem = *kinds.get(&key).ok_or_else(|| m.err(format!("storage {key} is not used by any tensor")))?;
        let b = m.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        let count = u64::from_le_bytes(a) as usize;
        let data = m.take(count.checked_mul(elem).ok_or_else(|| m.err("storage too large"))?)?;
        storages.insert(key, (count, data));
    }
    let mut out = Vec::new();
    for (k, v) in entries {
        let (V::Str(name), V::Tensor { key, elem, float, offset, size, stride }) = (k, v) else { continue };
        if !float {
            continue;
        }
        let (count, data) = storages.get(&key).ok_or_else(|| m.err(format!("storage {key} missing")))?;
        let n: usize = size.iter().product();
        let read = |i: usize| -> f32 {
            let b = &data[i * elem..(i + 1) * elem];
            match elem {
                2 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                4 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                _ => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32,
            }
        };
        let mut values = Vec::with_capacity(n);
        let mut idx = vec![0usize; size.len()];
        for _ in 0..n {
            let at = offset + idx.iter().zip(&stride).map(|(i, s)| i * s).sum::<usize>();
            if at >= *count {
                return Err(m.err(format!("tensor {name} reads past its storage")));
            }
            values.push(read(at));
            for d in (0..size.len()).rev() {
                idx[d] += 1;
                if idx[d] < size[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out.push((name, TorchTensor { shape: size, data: values }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three header pickles of a legacy file: magic number, protocol version, system info.
    fn header() -> Vec<u8> {
        let mut b = vec![0x80, 0x02, 0x8a, 0x0a];
        b.extend_from_slice(&MAGIC.to_le_bytes()[..10]);
        b.push(b'.');
        b.extend_from_slice(&[0x80, 0x02, b'M', 0xe9, 0x03, b'.']);
        b.extend_from_slice(&[0x80, 0x02, b'}', b'.']);
        b
    }

    fn read(bytes: &[u8]) -> Result<Vec<(String, TorchTensor)>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.pth");
        std::fs::write(&path, bytes).unwrap();
        read_state_dict(&path)
    }

    #[test]
    fn a_small_state_dict_round_trips() {
        let mut b = header();
        // {"w": _rebuild_tensor_v2(("storage", FloatStorage, "0", "cpu", 4, None), 1, (3,), (1,), False, {})}
        b.extend_from_slice(b"\x80\x02}(X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(");
        b.extend_from_slice(
            b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04Ntq\x00Q",
        );
        b.extend_from_slice(b"K\x01K\x03\x85K\x01\x85\x89}tRu.");
        b.extend_from_slice(b"\x80\x02]X\x01\x00\x00\x000a.");
        b.extend_from_slice(&4u64.to_le_bytes());
        for v in [1f32, 2.0, 3.0, 4.0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let dict = read(&b).unwrap();
        assert_eq!(dict, vec![("w".to_string(), TorchTensor { shape: vec![3], data: vec![2.0, 3.0, 4.0] })]);
        // Truncated storages are an error, not a short tensor.
        assert!(read(&b[..b.len() - 3]).is_err());
    }

    #[test]
    fn arbitrary_callables_are_refused() {
        let mut b = header();
        b.extend_from_slice(b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.");
        let err = read(&b).unwrap_err().to_string();
        assert!(err.contains("refusing to call os.system"), "{err}");
        assert!(read(b"garbage").is_err());
    }
}
