//! The logical node a cluster runs: a semantic pipeline whose plan the client has already certified.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::common::{plan_err, DFSchemaRef, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};
use stretto::core::format::PlanFile;
use stretto::core::memo::MemoEntry;
use stretto::core::op::SemanticTask;
use stretto_sql::node::{PipelineSpec, SemanticPipelineNode};

/// The answers the client knows of one operator of a certified plan (`logical/implementation`, as the plan's stage
/// names it) on the pipeline's input, keyed as that operator's memo keys them: those its profiling paid for first,
/// up to [`MAX_SHIPPED_BYTES`] for all stages. An executor takes them into its memo (in memory,
/// [`stretto::core::op::RegisteredOp::remember`]) and reads them rather than asking the operator again; an executor
/// whose operator keys answers otherwise (another CPU's integer kernels), or runs without a memo, computes them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageAnswers {
    /// The stage's operator, `logical/implementation`.
    pub physical: String,
    /// Its memoised answers.
    pub answers: Vec<MemoEntry>,
}

/// At most this many bytes of answers (as JSON) travel with a certified plan: the plan travels once per task, several
/// tasks to a message of at most 16 MiB (Ballista's gRPC limit). A filter's answer takes about 120 bytes, a map's
/// more with its value, so a default profiling sample's (at most 600 tuples) fit for several stages.
pub const MAX_SHIPPED_BYTES: usize = 512 * 1024;

/// A semantic pipeline with its certified plan: the client profiled and optimized it on a sample; the cluster's
/// executors only run the cascade, partition by partition. Output: the input's columns, then one per map (as
/// [`SemanticPipelineNode`]).
#[derive(Clone)]
pub struct CertifiedPipelineNode {
    /// The relational input.
    pub input: LogicalPlan,
    /// Filters, maps and settings.
    pub spec: Arc<PipelineSpec>,
    /// The certified plan (`stretto.plan/v1`).
    pub plan: Arc<PlanFile>,
    /// The logical operators the plan's stages name.
    pub tasks: Arc<Vec<SemanticTask>>,
    /// The answers known of the plan's stages ([`CertifiedPipelineNode::with_answers`]); not part of
    /// the node's identity (they change no result, only what the executors compute).
    pub answers: Arc<Vec<StageAnswers>>,
    schema: DFSchemaRef,
}

impl CertifiedPipelineNode {
    /// The pipeline `spec` over `input` with its certified `plan`.
    pub fn try_new(input: LogicalPlan, spec: PipelineSpec, plan: PlanFile, tasks: Vec<SemanticTask>) -> Result<Self> {
        let uncertified = SemanticPipelineNode::try_new(input, spec)?;
        let schema = UserDefinedLogicalNodeCore::schema(&uncertified).clone();
        Ok(Self {
            input: uncertified.input,
            spec: uncertified.spec,
            plan: Arc::new(plan),
            tasks: Arc::new(tasks),
            answers: Arc::new(Vec::new()),
            schema,
        })
    }

    /// The same node carrying `answers` for the executors' memos.
    pub fn with_answers(mut self, answers: Vec<StageAnswers>) -> Self {
        self.answers = Arc::new(answers);
        self
    }

    fn key(&self) -> String {
        format!("{}|{}", self.spec.key(), serde_json::to_string(self.plan.as_ref()).unwrap_or_default())
    }

    /// The plan's stages, in execution order with their rules, as one line.
    pub fn stages(&self) -> String {
        self.plan.describe_stages()
    }
}

impl fmt::Debug for CertifiedPipelineNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        UserDefinedLogicalNodeCore::fmt_for_explain(self, f)
    }
}

impl PartialEq for CertifiedPipelineNode {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key() && self.input == other.input
    }
}

impl Eq for CertifiedPipelineNode {}

impl Hash for CertifiedPipelineNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
        self.input.hash(state);
    }
}

impl PartialOrd for CertifiedPipelineNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.key().cmp(&other.key()) {
            Ordering::Equal => self.input.partial_cmp(&other.input),
            o => Some(o),
        }
    }
}

impl UserDefinedLogicalNodeCore for CertifiedPipelineNode {
    fn name(&self) -> &str {
        "CertifiedSemanticPipeline"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "CertifiedSemanticPipeline: {}; plan {}", self.spec.describe(), self.stages())
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        if inputs.len() != 1 {
            return plan_err!("CertifiedSemanticPipeline takes one input, got {}", inputs.len());
        }
        let node = Self::try_new(
            inputs.swap_remove(0),
            self.spec.as_ref().clone(),
            self.plan.as_ref().clone(),
            self.tasks.as_ref().clone(),
        )?;
        Ok(Self { answers: self.answers.clone(), ..node })
    }

    // `necessary_children_exprs` stays `None`: every input column reaches the executors, so the columns the
    // prompts name and the ones above read are there whatever the scheduler's optimizer prunes.
}
