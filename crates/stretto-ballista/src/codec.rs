//! Ballista's logical and physical extension codecs, taught Stretto's nodes: a certified pipeline travels from the
//! client to the scheduler as a [`CertifiedPipelineNode`] and from the scheduler to the executors as a
//! [`CascadeExec`]. Every other node goes through Ballista's own codecs unchanged.
//!
//! Wire format: the bytes `stretto.cluster/v1\n` followed by one JSON document (the pipeline's operators and
//! settings, the `stretto.plan/v1` plan, the logical operators, the answers the client knows of the plan's stages
//! and, for the physical node, Stretto's input column names and each partition's fetch). The relational input travels as DataFusion's own
//! protobuf, beside it.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use stretto::core::format::PlanFile;
use stretto::core::op::SemanticTask;
use stretto_sql::node::{MapSpec, PipelineSpec};
use stretto_sql::StrettoOptions;

use crate::exec::{CascadeExec, ExecutorResources};
use crate::node::{CertifiedPipelineNode, StageAnswers};

/// The first bytes of every Stretto node on the wire.
pub const MAGIC: &[u8] = b"stretto.cluster/v1\n";

#[derive(serde::Serialize, serde::Deserialize)]
struct SpecWire {
    filters: Vec<String>,
    maps: Vec<MapSpec>,
    precision: f64,
    recall: f64,
    credible: f64,
    method: String,
    batch_rows: usize,
}

impl From<&PipelineSpec> for SpecWire {
    fn from(s: &PipelineSpec) -> Self {
        let o = &s.options;
        Self {
            filters: s.filters.clone(),
            maps: s.maps.clone(),
            precision: o.precision,
            recall: o.recall,
            credible: o.credible,
            method: o.method.clone(),
            batch_rows: o.batch_rows,
        }
    }
}

impl From<SpecWire> for PipelineSpec {
    fn from(w: SpecWire) -> Self {
        let mut options = StrettoOptions::default();
        (options.precision, options.recall, options.credible) = (w.precision, w.recall, w.credible);
        (options.method, options.batch_rows) = (w.method, w.batch_rows);
        PipelineSpec { filters: w.filters, maps: w.maps, options }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "node", rename_all = "snake_case")]
enum NodeWire {
    CertifiedPipeline {
        spec: SpecWire,
        plan: PlanFile,
        tasks: Vec<SemanticTask>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        answers: Vec<StageAnswers>,
    },
    Cascade {
        spec: SpecWire,
        plan: PlanFile,
        tasks: Vec<SemanticTask>,
        input_names: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        answers: Vec<StageAnswers>,
        /// Each partition's fetch (a `LIMIT` pushed into the cascade).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fetch: Option<usize>,
    },
}

fn encode(node: &NodeWire, buf: &mut Vec<u8>) -> Result<()> {
    buf.extend_from_slice(MAGIC);
    serde_json::to_writer(buf, node).map_err(|e| DataFusionError::Internal(format!("encoding a Stretto node: {e}")))
}

/// The node in `buf`, if it is one of Stretto's; its plan is checked before anything runs it.
fn decode(buf: &[u8]) -> Option<Result<NodeWire>> {
    let body = buf.strip_prefix(MAGIC)?;
    let node: Result<NodeWire> = serde_json::from_slice(body).map_err(|e| {
        DataFusionError::Internal(format!("a Stretto node from another version or damaged on the way: {e}"))
    });
    Some(node.and_then(|n| {
        let (NodeWire::CertifiedPipeline { plan, .. } | NodeWire::Cascade { plan, .. }) = &n;
        plan.validate("the certified plan received").map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(n)
    }))
}

fn one_input<T: Clone>(inputs: &[T], what: &str) -> Result<T> {
    match inputs {
        [one] => Ok(one.clone()),
        _ => Err(DataFusionError::Internal(format!("{what} takes one input, got {}", inputs.len()))),
    }
}

/// Ballista's logical codec plus [`CertifiedPipelineNode`]: the client and the scheduler use it.
#[derive(Debug, Default)]
pub struct StrettoLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for StrettoLogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        match decode(buf) {
            None => self.inner.try_decode(buf, inputs, ctx),
            Some(Ok(NodeWire::CertifiedPipeline { spec, plan, tasks, answers })) => {
                let input = one_input(inputs, "CertifiedSemanticPipeline")?;
                let node = CertifiedPipelineNode::try_new(input, spec.into(), plan, tasks)?.with_answers(answers);
                Ok(Extension { node: Arc::new(node) })
            }
            Some(Ok(NodeWire::Cascade { .. })) => {
                Err(DataFusionError::Internal("a physical Stretto node where a logical one was expected".into()))
            }
            Some(Err(e)) => Err(e),
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        match node.node.as_any().downcast_ref::<CertifiedPipelineNode>() {
            Some(n) => encode(
                &NodeWire::CertifiedPipeline {
                    spec: n.spec.as_ref().into(),
                    plan: n.plan.as_ref().clone(),
                    tasks: n.tasks.as_ref().clone(),
                    answers: n.answers.as_ref().clone(),
                },
                buf,
            ),
            None if node.node.name() == "SemanticPipeline" => Err(DataFusionError::Plan(
                "a semantic pipeline reaches the cluster only certified: run the query through \
                 stretto_ballista::ClusterContext, which profiles and optimizes it first"
                    .into(),
            )),
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        self.inner.try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(&self, buf: &[u8], ctx: &TaskContext) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(&self, buf: &mut Vec<u8>, node: Arc<dyn FileFormatFactory>) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }
}

/// Ballista's physical codec plus [`CascadeExec`]. The scheduler's copy (no resources) only ships cascades; an
/// executor's binds them to its own operators.
#[derive(Debug, Default)]
pub struct StrettoPhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
    resources: Option<ExecutorResources>,
}

impl StrettoPhysicalCodec {
    /// The codec of an executor: the cascades it decodes run with `resources`.
    pub fn for_executor(resources: ExecutorResources) -> Self {
        Self { inner: BallistaPhysicalExtensionCodec::default(), resources: Some(resources) }
    }
}

impl PhysicalExtensionCodec for StrettoPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match decode(buf) {
            None => self.inner.try_decode(buf, inputs, ctx, proto_converter),
            Some(Ok(NodeWire::Cascade { spec, plan, tasks, input_names, answers, fetch })) => {
                let input = one_input(inputs, "CascadeExec")?;
                let spec: PipelineSpec = spec.into();
                Ok(Arc::new(
                    CascadeExec::try_new(
                        input,
                        Arc::new(spec),
                        Arc::new(plan),
                        Arc::new(tasks),
                        input_names,
                        self.resources.clone(),
                    )?
                    .with_answers(Arc::new(answers))
                    .with_partition_fetch(fetch),
                ))
            }
            Some(Ok(NodeWire::CertifiedPipeline { .. })) => {
                Err(DataFusionError::Internal("a logical Stretto node where a physical one was expected".into()))
            }
            Some(Err(e)) => Err(e),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let any: &dyn std::any::Any = node.as_ref();
        match any.downcast_ref::<CascadeExec>() {
            Some(c) => encode(
                &NodeWire::Cascade {
                    spec: c.spec().as_ref().into(),
                    plan: c.plan().as_ref().clone(),
                    tasks: c.tasks().as_ref().clone(),
                    input_names: c.input_names().to_vec(),
                    answers: c.answers().as_ref().clone(),
                    fetch: c.fetch(),
                },
                buf,
            ),
            None => self.inner.try_encode(node, buf, proto_converter),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::execution::TaskContext;
    use datafusion::logical_expr::{Extension, LogicalPlan};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion_proto::logical_plan::LogicalExtensionCodec;
    use datafusion_proto::physical_plan::{DefaultPhysicalProtoConverter, PhysicalExtensionCodec};
    use stretto::core::format::{PlanFile, PlanStage};
    use stretto_sql::node::{MapSpec, PipelineSpec, SemanticPipelineNode};
    use stretto_sql::StrettoOptions;

    use super::*;

    fn spec() -> PipelineSpec {
        let mut options = StrettoOptions::default();
        (options.recall, options.method, options.batch_rows) = (0.7, "lotus".into(), 8);
        PipelineSpec {
            filters: vec!["{t.text} is clearly positive".into()],
            maps: vec![MapSpec {
                column: "title".into(),
                prompt: "The movie title named in {t.text}".into(),
                ty: "text".into(),
                field: "title".into(),
            }],
            options,
        }
    }

    fn plan() -> PlanFile {
        let stage = |p: &str, lower, upper| PlanStage { physical: p.into(), lower, upper };
        PlanFile::new(vec![
            stage("filter_1/embed:minilm", Some(0.1), Some(0.6)),
            stage("filter_1/llm:smollm2-135m@expected-attention-0.00", Some(0.0), Some(0.0)),
            stage("title/llm-map:smollm2-135m@expected-attention-0.00", None, None),
        ])
    }

    fn input() -> LogicalPlan {
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("text", DataType::Utf8, true)]);
        datafusion::logical_expr::logical_plan::builder::table_scan(Some("t"), &schema, None).unwrap().build().unwrap()
    }

    fn answers() -> Vec<StageAnswers> {
        let entry = |key: &str, score| stretto::core::memo::MemoEntry {
            key: key.into(),
            score: Some(score),
            value: None,
            confidence: None,
            seconds: 0.5,
        };
        vec![StageAnswers { physical: "filter_1/embed:minilm".into(), answers: vec![entry("a", 0.3), entry("b", 0.9)] }]
    }

    #[test]
    fn a_certified_pipeline_crosses_the_wire_whole() {
        let node =
            CertifiedPipelineNode::try_new(input(), spec(), plan(), spec().tasks()).unwrap().with_answers(answers());
        let codec = StrettoLogicalCodec::default();
        let mut buf = Vec::new();
        codec.try_encode(&Extension { node: Arc::new(node.clone()) }, &mut buf).unwrap();
        assert!(buf.starts_with(MAGIC));
        let back = codec.try_decode(&buf, &[input()], &TaskContext::default()).unwrap();
        let back = back.node.as_any().downcast_ref::<CertifiedPipelineNode>().expect("a certified pipeline");
        assert_eq!(back, &node);
        assert_eq!(back.spec.options.recall, 0.7);
        assert_eq!(back.spec.options.method, "lotus");
        assert_eq!(back.spec.options.batch_rows, 8);
        assert_eq!(back.plan.as_ref(), &plan());
        assert_eq!(back.tasks.as_ref(), &spec().tasks());
        assert_eq!(back.answers.as_ref(), &answers());
    }

    #[test]
    fn a_cascade_crosses_the_wire_whole_and_runs_only_where_operators_are() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, true),
        ]));
        let empty: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(schema));
        let names = vec!["t.id".to_string(), "t.text".to_string()];
        let exec = CascadeExec::try_new(
            empty.clone(),
            Arc::new(spec()),
            Arc::new(plan()),
            Arc::new(spec().tasks()),
            names.clone(),
            None,
        )
        .unwrap()
        .with_answers(Arc::new(answers()))
        .with_partition_fetch(Some(7));
        assert_eq!(exec.schema().fields().len(), 3, "input columns, then the map's");
        let codec = StrettoPhysicalCodec::default();
        let mut buf = Vec::new();
        codec.try_encode(Arc::new(exec), &mut buf, &DefaultPhysicalProtoConverter {}).unwrap();
        let back =
            codec.try_decode(&buf, &[empty], &TaskContext::default(), &DefaultPhysicalProtoConverter {}).unwrap();
        let any: &dyn std::any::Any = back.as_ref();
        let back = any.downcast_ref::<CascadeExec>().expect("a cascade");
        assert_eq!(back.plan().as_ref(), &plan());
        assert_eq!(back.input_names(), names.as_slice());
        assert_eq!(back.spec().key(), spec().key());
        assert_eq!(back.answers().as_ref(), &answers());
        assert_eq!(back.fetch(), Some(7), "each partition's fetch");
        // The scheduler's codec has no operators: its copy is shipped, never run.
        let err = back.execute(0, Arc::new(TaskContext::default())).err().expect("no operators here").to_string();
        assert!(err.contains("stretto-executor"), "{err}");
    }

    #[test]
    fn damaged_or_uncertified_nodes_are_refused_with_a_reason() {
        let codec = StrettoLogicalCodec::default();
        let mut buf = MAGIC.to_vec();
        buf.extend_from_slice(b"{\"node\": \"certified_pipeline\"");
        let err = codec.try_decode(&buf, &[input()], &TaskContext::default()).unwrap_err().to_string();
        assert!(err.contains("damaged"), "{err}");

        // A plan whose stages do not parse never reaches an executor.
        let node = CertifiedPipelineNode::try_new(input(), spec(), plan(), spec().tasks()).unwrap();
        let mut buf = Vec::new();
        codec.try_encode(&Extension { node: Arc::new(node) }, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap().replace("filter_1/embed:minilm", "no-slash");
        let err = codec.try_decode(text.as_bytes(), &[input()], &TaskContext::default()).unwrap_err().to_string();
        assert!(err.contains("no-slash"), "{err}");

        let uncertified = SemanticPipelineNode::try_new(input(), spec()).unwrap();
        let err = codec.try_encode(&Extension { node: Arc::new(uncertified) }, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("ClusterContext"), "{err}");
    }
}
