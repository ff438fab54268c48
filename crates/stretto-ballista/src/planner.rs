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
use stretto_sql::exec::{certify, stretto_input, Certified, ExecutionScope, PipelineRun, RunLog};
use stretto_sql::node::{stretto_names, SemanticPipelineNode};

use crate::exec::CascadeExec;
use crate::node::{CertifiedPipelineNode, StageAnswers, MAX_SHIPPED_BYTES};

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

/// How many rows whatever reads `node` wants at most: the skip plus fetch of a `LIMIT` above it with only
/// projections and aliases (row for row) between, the tightest of several. `None` when something else reads it
/// (a filter, a sort, a join…), when no limit does, or when `node` appears more than once.
fn fetch_above(plan: &LogicalPlan, node: &SemanticPipelineNode) -> Result<Option<usize>> {
    use datafusion::logical_expr::logical_plan::{FetchType, SkipType};
    fn walk(
        p: &LogicalPlan,
        node: &SemanticPipelineNode,
        wanted: Option<usize>,
        found: &mut Vec<Option<usize>>,
    ) -> Result<()> {
        if let LogicalPlan::Extension(e) = p {
            if e.node.as_any().downcast_ref::<SemanticPipelineNode>() == Some(node) {
                found.push(wanted);
                return Ok(());
            }
        }
        let below = match p {
            LogicalPlan::Limit(l) => match (l.get_skip_type()?, l.get_fetch_type()?) {
                (SkipType::Literal(skip), FetchType::Literal(Some(fetch))) => {
                    let own = skip.saturating_add(fetch);
                    // An outer limit of k over this one's output wants its first k after the skip.
                    Some(wanted.map_or(own, |k| own.min(skip.saturating_add(k))))
                }
                // An offset alone, or a limit that is not a constant.
                _ => None,
            },
            LogicalPlan::Projection(_) | LogicalPlan::SubqueryAlias(_) => wanted,
            _ => None,
        };
        for child in p.inputs() {
            walk(child, node, below, found)?;
        }
        Ok(())
    }
    let mut found = Vec::new();
    walk(plan, node, None, &mut found)?;
    Ok(match found.as_slice() {
        [one] => *one,
        _ => None,
    })
}

/// The answers of the operators of `certified`'s plan on the rows of `input` that the session's memo holds: what
/// the executors would otherwise compute again. First each stage's answers on the rows profiling paid for (the
/// sample's, gold's the dearest), then each stage's others (an earlier query's), up to [`MAX_SHIPPED_BYTES`] of JSON.
fn known_answers(
    session: &stretto::Session,
    certified: &Certified,
    input: &arrow::array::RecordBatch,
) -> stretto::Result<Vec<StageAnswers>> {
    let registry = session.registry();
    let cascade = CascadePlan::bind(&certified.plan, certified.tasks.clone(), |n| registry.get(n))?;
    let mut left = MAX_SHIPPED_BYTES;
    let mut out: Vec<StageAnswers> =
        cascade.stages.iter().map(|s| StageAnswers { physical: s.physical.clone(), answers: Vec::new() }).collect();
    let mut seen = std::collections::HashSet::new();
    for paid_first in [true, false] {
        for (stage, shipped) in cascade.stages.iter().zip(out.iter_mut()) {
            // The second pass reads the whole input (no copy of it): answers the first shipped are skipped below.
            let paid;
            let rows = if paid_first {
                let rows: Vec<u32> = (0..input.num_rows())
                    .filter(|&r| certified.paid.contains(&stage.physical, r))
                    .filter_map(|r| u32::try_from(r).ok())
                    .collect();
                if rows.is_empty() {
                    continue;
                }
                paid = arrow::compute::take_record_batch(input, &arrow::array::UInt32Array::from(rows))
                    .map_err(stretto::Error::Arrow)?;
                &paid
            } else {
                input
            };
            // An answer takes more than 80 bytes of JSON (its key alone is 64), so this many can be no more than fit.
            for answer in stage.op.memoised_answers(&cascade.tasks[stage.logical], rows, left / 80)? {
                let bytes = serde_json::to_vec(&answer).map_or(usize::MAX, |b| b.len() + 1);
                if bytes > left {
                    break;
                }
                if seen.insert((stage.physical.clone(), answer.key.clone())) {
                    left -= bytes;
                    shipped.answers.push(answer);
                }
            }
        }
    }
    out.retain(|s| !s.answers.is_empty());
    Ok(out)
}

/// The client's planner: for each semantic pipeline, the relational input runs on the cluster, the pipeline is
/// profiled and optimized here on the session's seeded sample under the query's targets (exactly as on one
/// machine, a `LIMIT` right above it included), and the pipeline is replaced by its certified plan; then the
/// whole query goes to the cluster.
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

    /// Certifies `node` for a consumer that wants at most `fetch` of its rows (a `LIMIT` above it).
    async fn certify_one(
        &self,
        node: &SemanticPipelineNode,
        fetch: Option<usize>,
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
            // One copy of the input at a time: the batches go once concatenated, the concatenation once converted.
            let batch = arrow::compute::concat_batches(&schema, &batches).map_err(stretto::Error::Arrow)?;
            drop(batches);
            let input = stretto_input(&schema, &names, &batch)?;
            drop(batch);
            let certified = certify(&session, &spec, &input, &run2, ExecutionScope { fetch, elsewhere: true })?;
            let answers = match &certified {
                // Shipping answers saves the executors work; failing to gather them must not fail the query.
                Some(c) => known_answers(&session, c, &input).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the client's known answers are not shipped; the executors compute them");
                    Vec::new()
                }),
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
            let fetch = fetch_above(&plan, &node)?;
            let certified = self.certify_one(&node, fetch, state).await?;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use stretto::core::exec::PaidAnswers;
    use stretto::core::format::{PlanFile, PlanStage};
    use stretto::core::op::{LogicalKind, Modality, OpOutput, OpProperties, PhysicalOp, SemanticTask};

    use super::*;

    /// Scores an item by its length.
    #[derive(Debug)]
    struct Length(OpProperties);

    impl PhysicalOp for Length {
        fn name(&self) -> &str {
            "length"
        }
        fn properties(&self) -> &OpProperties {
            &self.0
        }
        fn evaluate_items(&self, _: &SemanticTask, items: &[String]) -> stretto::core::Result<(OpOutput, Vec<f64>)> {
            Ok((OpOutput::Scores(items.iter().map(|i| i.len() as f64).collect()), vec![0.5; items.len()]))
        }
    }

    #[test]
    fn the_answers_profiling_paid_for_are_shipped_first_and_the_rest_up_to_the_size_limit() {
        let dir = tempfile::tempdir().unwrap();
        let session =
            stretto::Session::builder(dir.path().join("home")).memo_dir(dir.path().join("memo")).build().unwrap();
        session
            .register(Arc::new(Length(OpProperties {
                kind: LogicalKind::Filter,
                family: "length".into(),
                modality: Modality::Text,
                model: None,
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 1e-3,
                score_range: (0.0, 100.0),
            })))
            .unwrap();
        // More answers in the memo than fit: 8,000 of about 120 bytes each.
        let n = 8_000;
        let texts: Vec<String> = (0..n).map(|i| format!("review {i}")).collect();
        let input = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("t.text", DataType::Utf8, true)])),
            vec![Arc::new(StringArray::from(texts))],
        )
        .unwrap();
        let task = SemanticTask::filter("f", "{t.text} is long");
        session.registry().get("length").unwrap().evaluate(&task, &input).unwrap();
        // Profiling paid for the last rows only.
        let mut paid = PaidAnswers::default();
        paid.add("f/length", n - 10..n);
        let certified = Certified {
            plan: PlanFile::new(vec![PlanStage { physical: "f/length".into(), lower: Some(1.0), upper: Some(2.0) }]),
            tasks: vec![task],
            paid: Arc::new(paid),
        };
        let shipped = known_answers(&session, &certified, &input).unwrap();
        let [stage] = shipped.as_slice() else { panic!("one stage: {shipped:?}") };
        assert_eq!(stage.physical, "f/length");
        let scores: Vec<f64> = stage.answers.iter().map(|a| a.score.unwrap()).collect();
        assert_eq!(scores[..10], [11.0; 10], "the paid rows (`review 7990`..) come first");
        assert_eq!(scores[10], 8.0, "then the others, in row order (`review 0`)");
        let bytes: usize = stage.answers.iter().map(|a| serde_json::to_vec(a).unwrap().len() + 1).sum();
        assert!(bytes <= MAX_SHIPPED_BYTES && bytes > MAX_SHIPPED_BYTES - 200, "{bytes} bytes");
        assert!(stage.answers.len() < n);
    }

    /// A filter pipeline over a scan of `t(id, text)`.
    fn pipeline() -> SemanticPipelineNode {
        use arrow::datatypes::{DataType, Field, Schema};
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("text", DataType::Utf8, true)]);
        let scan = datafusion::logical_expr::logical_plan::builder::table_scan(Some("t"), &schema, None)
            .unwrap()
            .build()
            .unwrap();
        let spec = stretto_sql::node::PipelineSpec {
            filters: vec!["{t.text} is clearly positive".into()],
            maps: vec![],
            options: stretto_sql::StrettoOptions::default(),
        };
        SemanticPipelineNode::try_new(scan, spec).unwrap()
    }

    #[test]
    fn a_limit_reaches_the_pipeline_through_projections_only() {
        use datafusion::logical_expr::{col, lit, LogicalPlanBuilder};
        let node = pipeline();
        let ext = LogicalPlan::Extension(Extension { node: Arc::new(node.clone()) });
        let b = || LogicalPlanBuilder::from(ext.clone());
        let fetch = |p: LogicalPlan| fetch_above(&p, &node).unwrap();

        assert_eq!(fetch(b().limit(0, Some(5)).unwrap().build().unwrap()), Some(5));
        // OFFSET 3 LIMIT 5 needs the first 8 rows; projections and aliases keep rows one for one.
        let projected = b().project(vec![col("id")]).unwrap().alias("r").unwrap().limit(3, Some(5)).unwrap();
        assert_eq!(fetch(projected.build().unwrap()), Some(8));
        // Of two limits the tighter one counts: LIMIT 2 over (OFFSET 1 LIMIT 10) wants the first 3.
        assert_eq!(fetch(b().limit(1, Some(10)).unwrap().limit(0, Some(2)).unwrap().build().unwrap()), Some(3));
        // No limit, an offset alone, or anything that needs more rows than it passes on: no fetch.
        assert_eq!(fetch(b().project(vec![col("id")]).unwrap().build().unwrap()), None);
        assert_eq!(fetch(b().limit(4, None).unwrap().build().unwrap()), None);
        let filtered = b().filter(col("id").gt(lit(3))).unwrap().limit(0, Some(5)).unwrap();
        assert_eq!(fetch(filtered.build().unwrap()), None);
        let sorted = b().sort(vec![col("id").sort(true, false)]).unwrap().limit(0, Some(5)).unwrap();
        assert_eq!(fetch(sorted.build().unwrap()), None);
        // The same pipeline twice (a self-union): neither occurrence may stop early on the other's account.
        let union = b().limit(0, Some(5)).unwrap().union(ext.clone()).unwrap();
        assert_eq!(fetch(union.build().unwrap()), None);
    }
}
