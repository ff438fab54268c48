//! A small ONNX model writer: the protobuf messages Stretto needs, declared with `prost`, and a graph builder that
//! streams large initializers into an external-data file.
//!
//! Why not `ort`'s Model Editor: converted models are written once and reused by every later process (and by any
//! ONNX tool), so they must exist as files; and a 0.5B-parameter decoder in f32 is larger than protobuf's 2 GiB
//! message limit, which ONNX solves with external data. Field numbers follow `onnx/onnx.proto` (IR version 8).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use crate::error::{ModelError, Result};

/// `TensorProto.DataType` values used here.
#[allow(missing_docs)]
pub mod dtype {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
}

/// The ONNX IR version written (ONNX 1.12, opset 17).
pub const IR_VERSION: i64 = 8;
/// The default-domain opset written.
pub const OPSET: i64 = 17;
/// ONNX Runtime's contrib-operator domain (`MatMulNBits`), imported at version 1 when a graph uses it.
pub const MS_DOMAIN: &str = "com.microsoft";

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(int64, tag = "1")]
    ir_version: i64,
    #[prost(string, tag = "2")]
    producer_name: String,
    #[prost(string, tag = "3")]
    producer_version: String,
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    opset_import: Vec<OperatorSetIdProto>,
    #[prost(message, repeated, tag = "14")]
    metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, Message)]
struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(int64, tag = "2")]
    version: i64,
}

#[derive(Clone, PartialEq, Message)]
struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    output: Vec<String>,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    op_type: String,
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<AttributeProto>,
    #[prost(string, tag = "7")]
    domain: String,
}

/// A node attribute (build with [`Attr`]'s constructors).
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(float, tag = "2")]
    f: f32,
    #[prost(int64, tag = "3")]
    i: i64,
    #[prost(int64, repeated, tag = "8")]
    ints: Vec<i64>,
    #[prost(int32, tag = "20")]
    r#type: i32,
}

/// Attribute constructors.
pub struct Attr;

impl Attr {
    /// An integer attribute.
    pub fn int(name: &str, i: i64) -> AttributeProto {
        AttributeProto { name: name.into(), i, r#type: 2, ..Default::default() }
    }
    /// A float attribute.
    pub fn float(name: &str, f: f32) -> AttributeProto {
        AttributeProto { name: name.into(), f, r#type: 1, ..Default::default() }
    }
    /// A list-of-integers attribute.
    pub fn ints(name: &str, ints: &[i64]) -> AttributeProto {
        AttributeProto { name: name.into(), ints: ints.to_vec(), r#type: 7, ..Default::default() }
    }
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(string, tag = "8")]
    name: String,
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
    #[prost(message, repeated, tag = "13")]
    external_data: Vec<StringStringEntryProto>,
    #[prost(int32, tag = "14")]
    data_location: i32,
}

#[derive(Clone, PartialEq, Message)]
struct ValueInfoProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorTypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorTypeProto {
    #[prost(int32, tag = "1")]
    elem_type: i32,
    #[prost(message, optional, tag = "2")]
    shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
struct Dimension {
    #[prost(oneof = "DimValue", tags = "1, 2")]
    value: Option<DimValue>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum DimValue {
    #[prost(int64, tag = "1")]
    Value(i64),
    #[prost(string, tag = "2")]
    Param(String),
}

/// The head of a model file, as far as [`signature`] reads it: graph inputs and outputs, nothing else (prost skips
/// the nodes and initializers without keeping them).
#[derive(Clone, PartialEq, Message)]
struct ModelHead {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphHead>,
}

#[derive(Clone, PartialEq, Message)]
struct GraphHead {
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

/// A graph input or output as the model file declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// Its name.
    pub name: String,
    /// `TensorProto.DataType` of its elements ([`dtype`]); 0 when it is not a tensor.
    pub elem_type: i32,
    /// Its rank (number of dimensions; 0 when undeclared).
    pub rank: usize,
}

/// What a model file takes and returns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Signature {
    /// Graph inputs.
    pub inputs: Vec<Port>,
    /// Graph outputs.
    pub outputs: Vec<Port>,
}

impl Signature {
    /// The input called `name`.
    pub fn input(&self, name: &str) -> Option<&Port> {
        self.inputs.iter().find(|p| p.name == name)
    }

    /// The output called `name`.
    pub fn output(&self, name: &str) -> Option<&Port> {
        self.outputs.iter().find(|p| p.name == name)
    }
}

/// Reads the inputs and outputs an ONNX model file declares, without loading it into a runtime (weights inside the
/// file are skipped, external data is not opened). An error names a file that is not an ONNX model.
pub fn signature(path: &Path) -> Result<Signature> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read once, here; a model file changing under a registration is reported as malformed.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    let bad = |message: String| ModelError::Format { file: path.display().to_string(), message };
    let head = ModelHead::decode(&map[..]).map_err(|e| bad(format!("not an ONNX model ({e})")))?;
    let graph = head.graph.ok_or_else(|| bad("not an ONNX model (no graph)".into()))?;
    let port = |v: ValueInfoProto| {
        let tensor = v.r#type.and_then(|t| t.tensor_type);
        Port {
            name: v.name,
            elem_type: tensor.as_ref().map_or(0, |t| t.elem_type),
            rank: tensor.and_then(|t| t.shape).map_or(0, |s| s.dim.len()),
        }
    };
    let sig = Signature {
        inputs: graph.input.into_iter().map(port).collect(),
        outputs: graph.output.into_iter().map(port).collect(),
    };
    if sig.outputs.is_empty() {
        return Err(bad("not an ONNX model (its graph has no outputs)".into()));
    }
    Ok(sig)
}

/// One dimension of a graph input or output.
#[derive(Debug, Clone)]
pub enum Dim {
    /// A fixed size.
    Fixed(i64),
    /// A named symbolic size (`batch_size`, `sequence_length`...).
    Sym(&'static str),
}

/// Initializers above this many bytes go to the external-data file, aligned for memory mapping.
const EXTERNAL_THRESHOLD: usize = 1024;
const ALIGN: u64 = 4096;

/// Builds one graph; values are named by the builder unless the caller names them.
pub struct GraphBuilder {
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    counter: usize,
    /// Whether a node of [`MS_DOMAIN`] was added.
    uses_ms: bool,
    data_path: PathBuf,
    data_name: String,
    data: BufWriter<File>,
    offset: u64,
}

fn value_info(name: &str, elem_type: i32, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(v) => DimValue::Value(*v),
                Dim::Sym(s) => DimValue::Param((*s).to_string()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto { elem_type, shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

impl GraphBuilder {
    /// A builder whose large initializers stream into `data_path` (named relative to the model file's folder).
    pub fn new(data_path: &Path) -> Result<Self> {
        let file = File::create(data_path).map_err(|e| ModelError::io(data_path, e))?;
        let data_name = data_path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| ModelError::Graph(format!("bad external data path {}", data_path.display())))?
            .to_string();
        Ok(Self {
            nodes: Vec::new(),
            initializers: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            counter: 0,
            uses_ms: false,
            data_path: data_path.to_path_buf(),
            data_name,
            data: BufWriter::with_capacity(1 << 20, file),
            offset: 0,
        })
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.counter += 1;
        format!("{hint}_{}", self.counter)
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem_type: i32, dims: &[Dim]) -> String {
        self.inputs.push(value_info(name, elem_type, dims));
        name.to_string()
    }

    /// Declares `value` as a graph output named `name` (an Identity node renames it).
    pub fn output(&mut self, value: &str, name: &str, elem_type: i32, dims: &[Dim]) {
        self.nodes.push(NodeProto {
            input: vec![value.into()],
            output: vec![name.into()],
            name: format!("out_{name}"),
            op_type: "Identity".into(),
            ..Default::default()
        });
        self.outputs.push(value_info(name, elem_type, dims));
    }

    /// Adds a node with one output and returns the output's name.
    pub fn op(&mut self, op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.op_in("", op_type, inputs, attrs)
    }

    /// Adds a node of operator set `domain` (`""` or [`MS_DOMAIN`]) with one output and returns the output's name.
    pub fn op_in(&mut self, domain: &str, op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.uses_ms |= domain == MS_DOMAIN;
        let out = self.fresh(op_type);
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.clone()],
            name: format!("{out}_node"),
            op_type: op_type.into(),
            attribute: attrs,
            domain: domain.into(),
        });
        out
    }

    /// Adds a node of the default domain with `N` outputs and returns their names.
    pub fn op_multi<const N: usize>(&mut self, op_type: &str, inputs: &[&str]) -> [String; N] {
        let outs: [String; N] = std::array::from_fn(|_| self.fresh(op_type));
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.to_vec(),
            name: format!("{}_node", outs[0]),
            op_type: op_type.into(),
            ..Default::default()
        });
        outs
    }

    fn tensor(&mut self, name: String, dims: &[i64], data_type: i32, bytes: &[u8]) -> Result<String> {
        let mut t = TensorProto { dims: dims.to_vec(), data_type, name: name.clone(), ..Default::default() };
        if bytes.len() > EXTERNAL_THRESHOLD {
            let pad = (ALIGN - self.offset % ALIGN) % ALIGN;
            if pad > 0 {
                self.data.write_all(&vec![0u8; pad as usize]).map_err(|e| ModelError::io(&self.data_path, e))?;
                self.offset += pad;
            }
            self.data.write_all(bytes).map_err(|e| ModelError::io(&self.data_path, e))?;
            let entry = |k: &str, v: String| StringStringEntryProto { key: k.into(), value: v };
            t.external_data = vec![
                entry("location", self.data_name.clone()),
                entry("offset", self.offset.to_string()),
                entry("length", bytes.len().to_string()),
            ];
            t.data_location = 1;
            self.offset += bytes.len() as u64;
        } else {
            t.raw_data = bytes.to_vec();
        }
        self.initializers.push(t);
        Ok(name)
    }

    /// An f32 initializer (little-endian, as ONNX's raw data requires).
    pub fn weight(&mut self, hint: &str, dims: &[i64], values: &[f32]) -> Result<String> {
        let expected: i64 = dims.iter().product();
        if expected as usize != values.len() {
            return Err(ModelError::Graph(format!("{hint}: {} values for dims {dims:?}", values.len())));
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let name = self.fresh(hint);
        self.tensor(name, dims, dtype::FLOAT, &bytes)
    }

    /// A uint8 initializer (e.g. the packed weights of a `MatMulNBits` node).
    pub fn u8s(&mut self, hint: &str, dims: &[i64], bytes: &[u8]) -> Result<String> {
        let expected: i64 = dims.iter().product();
        if expected as usize != bytes.len() {
            return Err(ModelError::Graph(format!("{hint}: {} bytes for dims {dims:?}", bytes.len())));
        }
        let name = self.fresh(hint);
        self.tensor(name, dims, dtype::UINT8, bytes)
    }

    /// An int8 initializer (e.g. the weights of a `MatMulIntegerToFloat` node).
    pub fn i8s(&mut self, hint: &str, dims: &[i64], values: &[i8]) -> Result<String> {
        let expected: i64 = dims.iter().product();
        if expected as usize != values.len() {
            return Err(ModelError::Graph(format!("{hint}: {} values for dims {dims:?}", values.len())));
        }
        let name = self.fresh(hint);
        let bytes: Vec<u8> = values.iter().map(|v| *v as u8).collect();
        self.tensor(name, dims, dtype::INT8, &bytes)
    }

    /// A small f32 constant.
    pub fn f32s(&mut self, dims: &[i64], values: &[f32]) -> Result<String> {
        self.weight("c", dims, values)
    }

    /// A small i64 constant (shapes, axes, indices).
    pub fn i64s(&mut self, dims: &[i64], values: &[i64]) -> Result<String> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let name = self.fresh("i");
        self.tensor(name, dims, dtype::INT64, &bytes)
    }

    /// A 1-D i64 constant.
    pub fn ints(&mut self, values: &[i64]) -> Result<String> {
        self.i64s(&[values.len() as i64], values)
    }

    /// Writes `model_path` (the graph) after flushing the external data file.
    pub fn finish(mut self, model_path: &Path, name: &str, metadata: &[(&str, String)]) -> Result<()> {
        self.data.flush().map_err(|e| ModelError::io(&self.data_path, e))?;
        let file = self.data.into_inner().map_err(|e| ModelError::io(&self.data_path, e.into_error()))?;
        file.sync_all().map_err(|e| ModelError::io(&self.data_path, e))?;
        let model = ModelProto {
            ir_version: IR_VERSION,
            producer_name: "stretto".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            graph: Some(GraphProto {
                node: self.nodes,
                name: name.into(),
                initializer: self.initializers,
                input: self.inputs,
                output: self.outputs,
            }),
            opset_import: std::iter::once(OperatorSetIdProto { domain: String::new(), version: OPSET })
                .chain(self.uses_ms.then(|| OperatorSetIdProto { domain: MS_DOMAIN.into(), version: 1 }))
                .collect(),
            metadata_props: metadata
                .iter()
                .map(|(k, v)| StringStringEntryProto { key: (*k).into(), value: v.clone() })
                .collect(),
        };
        let bytes = model.encode_to_vec();
        let mut f = File::create(model_path).map_err(|e| ModelError::io(model_path, e))?;
        f.write_all(&bytes).map_err(|e| ModelError::io(model_path, e))?;
        f.sync_all().map_err(|e| ModelError::io(model_path, e))?;
        Ok(())
    }
}
