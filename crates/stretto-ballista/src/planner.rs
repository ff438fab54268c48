//! Query planners: the client's certifies every semantic pipeline before the query leaves for the cluster; the
//! scheduler's turns certified pipelines into [`CascadeExec`]s.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, plan_err, DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{EmptyRelation, Extension, LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use stretto::core::exec::CascadePlan;
use stretto_sql::exec::{certify, stretto_input, Certified, PipelineRun, RunLog};
use stretto_sql::node::{stretto_names, SemanticPipelineNode};

use crate::exec::CascadeExec;
use crate::node::{CertifiedPipelineNode, StageAnswers, MAX_SHIPPED_ANSWERS};

/// The first semantic pipeline whose input holds no other one (the innermost).
fn innermost_pipeline(plan: &LogicalPlan) -> Result<Option<SemanticPipelineNode>> {
    let mut found = None;
    plan.apply(|p| {
        if let LogicalPlan::Extension(e) = p {
            if let Some(n) = e.node.as_any().downcast_ref::<SemanticPipelineNode>() {
                found = Some(n.clone());
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    // `apply` visits parents before children, so the last one found is at the bottom of its branch.
    Ok(found)
}

/// The answers of the operators of `certified`'s plan on the rows of `input` that the session's memo holds (at
/// least those profiling just paid for, and those a saved profile's run paid for): what the executors would
/// otherwise compute again. At most [`MAX_SHIPPED_ANSWERS`], the first stages' first.
fn known_answers(
    session: &stretto::Session,
    certified: &Certified,
    input: &arrow::array::RecordBatch,
) -> stretto::Result<Vec<StageAnswers>> {
    let registry = session.registry();
    let cascade = CascadePlan::bind(&certified.plan, certified.tasks.clone(), |n| registry.get(n))?;
    let mut left = MAX_SHIPPED_ANSWERS;
    let mut out = Vec::new();
    for stage in &cascade.stages {
        if left == 0 {
            break;
        }
        let mut answers = stage.op.memoised_answers(&cascade.tasks[stage.logical], input)?;
        answers.truncate(left);
        left -= answers.len();
        if !answers.is_empty() {
            out.push(StageAnswers { physical: stage.physical.clone(), answers });
        }
    }
    Ok(out)
}

/// The client's planner: for each semantic pipeline, the relational input runs on the cluster, the pipeline is
/// profiled and optimized here on the session's seeded sample under the query's targets (exactly as on one
/// machine), and the pipeline is replaced by its certified plan; then the whole query goes to the cluster.
pub struct CertifyingPlanner {
    session: stretto::Session,
    cluster: Arc<dyn QueryPlanner + Send + Sync>,
    log: RunLog,
}

impl std::fmt::Debug for CertifyingPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertifyingPlanner").field("session", &self.session).finish_non_exhaustive()
    }
}

impl CertifyingPlanner {
    /// Certifies with `session`, then plans with `cluster` (Ballista's planner, which submits the query).
    pub fn new(session: stretto::Session, cluster: Arc<dyn QueryPlanner + Send + Sync>, log: RunLog) -> Self {
        Self { session, cluster, log }
    }

    async fn certify_one(
        &self,
        node: &SemanticPipelineNode,
        state: &dyn datafusion::catalog::Session,
    ) -> Result<LogicalPlan> {
        let run = Arc::new(Mutex::new(PipelineRun {
            pipeline: node.spec.describe(),
            on_cluster: true,
            ..Default::default()
        }));
        self.log.push(run.clone());
        // The relational input, computed by the cluster.
        let t0 = std::time::Instant::now();
        let input = self.cluster.create_physical_plan(&node.input, state).await?;
        let schema = input.schema();
        let batches = datafusion::physical_plan::collect(input, state.task_ctx()).await?;
        let input_seconds = t0.elapsed().as_secs_f64();
        let names = stretto_names(node.input.schema())?;
        let (session, spec) = (self.session.clone(), node.spec.clone());
        let run2 = run.clone();
        let certified = tokio::task::spawn_blocking(move || {
            let _span = tracing::info_span!("cluster_certify", pipeline = %spec.describe()).entered();
            let batch = arrow::compute::concat_batches(&schema, &batches).map_err(stretto::Error::Arrow)?;
            let input = stretto_input(&schema, &names, &batch)?;
            let certified = certify(&session, &spec, &input, &run2, None)?;
            let answers = match &certified {
                Some(c) => known_answers(&session, c, &input)?,
                None => Vec::new(),
            };
            Ok::<_, stretto::Error>(certified.map(|c| (c, answers)))
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
        run.lock().unwrap_or_else(|p| p.into_inner()).timings.insert("cluster_input".into(), input_seconds);
        match certified {
            None => Ok(LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: false,
                schema: UserDefinedLogicalNode::schema(node).clone(),
            })),
            Some((c, answers)) => {
                run.lock().unwrap_or_else(|p| p.into_inner()).shipped_answers =
                    answers.iter().map(|a| (a.physical.clone(), a.answers.len())).collect();
                let n =
                    CertifiedPipelineNode::try_new(node.input.clone(), node.spec.as_ref().clone(), c.plan, c.tasks)?
                        .with_answers(answers);
                Ok(LogicalPlan::Extension(Extension { node: Arc::new(n) }))
            }
        }
    }
}

#[async_trait]
impl QueryPlanner for CertifyingPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        state: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut plan = logical_plan.clone();
        while let Some(node) = innermost_pipeline(&plan)? {
            let certified = self.certify_one(&node, state).await?;
            let mut replaced = false;
            plan = plan
                .transform_up(|p| {
                    if let LogicalPlan::Extension(e) = &p {
                        if !replaced && e.node.as_any().downcast_ref::<SemanticPipelineNode>() == Some(&node) {
                            replaced = true;
                            return Ok(Transformed::yes(certified.clone()));
                        }
                    }
                    Ok(Transformed::no(p))
                })?
                .data;
            if !replaced {
                return internal_err!("the certified pipeline could not be put back in the plan");
            }
        }
        self.cluster.create_physical_plan(&plan, state).await
    }
}

/// The scheduler's extension planner: a [`CertifiedPipelineNode`] becomes a [`CascadeExec`] over its input's
/// partitions. An uncertified pipeline is refused (it would profile on an executor).
#[derive(Debug, Default)]
pub struct CascadePlanner;

#[async_trait]
impl ExtensionPlanner for CascadePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _state: &dyn datafusion::catalog::Session,
        _planning: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if node.as_any().downcast_ref::<SemanticPipelineNode>().is_some() {
            return plan_err!(
                "a semantic pipeline reached the scheduler uncertified; submit queries through \
                 stretto_ballista::ClusterContext"
            );
        }
        let Some(n) = node.as_any().downcast_ref::<CertifiedPipelineNode>() else { return Ok(None) };
        let [input] = physical_inputs else {
            return internal_err!("CertifiedSemanticPipeline has one input, got {}", physical_inputs.len());
        };
        let names = stretto_names(n.input.schema())?;
        Ok(Some(Arc::new(
            CascadeExec::try_new(input.clone(), n.spec.clone(), n.plan.clone(), n.tasks.clone(), names, None)?
                .with_answers(n.answers.clone()),
        )))
    }
}

/// DataFusion's physical planner with [`CascadePlanner`]: the scheduler's query planner.
#[derive(Debug, Default)]
pub struct SchedulerQueryPlanner;

#[async_trait]
impl QueryPlanner for SchedulerQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        state: &dyn datafusion::catalog::Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(CascadePlanner)])
            .create_physical_plan(logical_plan, state)
            .await
    }
}
