//! The analyzer step that gathers a query's semantic functions into one [`SemanticPipelineNode`].
//!
//! A SELECT block plans as `Limit → Sort → Projection → [Filter (HAVING)] → [Aggregate] → [Filter (WHERE)] →
//! joins → scans`. The rule walks down the upper part (projection, aggregate, sort, limit, window, distinct,
//! HAVING), replacing each `sem_map(...)` call with a column the pipeline will produce; at the WHERE filter (or the
//! join tree when there is none) it takes out every conjunct that is a `sem_filter(...)` call, in WHERE and in the
//! ON clauses of inner joins, and puts the pipeline there: relational filters and joins stay below it (Stretto's
//! pull-up), aggregates, ordering and limits above. WHERE conjuncts that read a map's value become a filter just
//! above the pipeline.
//!
//! The block is the one that holds the query's semantic functions: the outermost SELECT, or a CTE, a derived table
//! or a UNION branch below it (the rule passes through the blocks above, which stay relational). Semantic
//! functions in two blocks (two CTEs, a CTE read twice, both sides of a join) or in an IN / EXISTS / scalar subquery
//! are an error: one query, one pipeline, one certificate.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{plan_err, Column, Result};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
use datafusion::logical_expr::{Expr, Extension, Filter, JoinType, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use crate::functions::{literal_text, parse_type, semantic_call, SEM_FILTER};
use crate::node::{MapSpec, PipelineSpec, SemanticPipelineNode};
use crate::options::StrettoOptions;

/// Lifts every semantic function call of a query into one semantic pipeline (see the module doc).
#[derive(Debug, Default)]
pub struct SemanticPipelineRule;

impl AnalyzerRule for SemanticPipelineRule {
    fn name(&self) -> &str {
        crate::RULE_NAME
    }

    fn analyze(&self, plan: LogicalPlan, config: &ConfigOptions) -> Result<LogicalPlan> {
        if !plan_has_semantic(&plan)? {
            return Ok(plan);
        }
        let options = config.extensions.get::<StrettoOptions>().cloned().unwrap_or_default();
        let _span = tracing::info_span!("sql_semantic_pipeline").entered();
        rewrite_top(plan, &options)
    }
}

/// Whether any expression of the plan (subqueries included) calls a semantic function.
pub fn plan_has_semantic(plan: &LogicalPlan) -> Result<bool> {
    let mut found = false;
    plan.apply_with_subqueries(|p| {
        p.apply_expressions(|e| {
            if expr_has_semantic(e)? {
                found = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(if found { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })?;
    Ok(found)
}

fn expr_has_semantic(e: &Expr) -> Result<bool> {
    e.exists(|e| Ok(semantic_call(e).is_some()))
}

fn node_has_semantic(plan: &LogicalPlan) -> Result<bool> {
    for e in plan.expressions() {
        if expr_has_semantic(&e)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Statements wrapping a query (INSERT ... SELECT, CREATE TABLE ... AS SELECT, ...) pass through to it.
fn rewrite_top(plan: LogicalPlan, options: &StrettoOptions) -> Result<LogicalPlan> {
    let wrapper = !matches!(
        plan,
        LogicalPlan::Projection(_)
            | LogicalPlan::Aggregate(_)
            | LogicalPlan::Sort(_)
            | LogicalPlan::Limit(_)
            | LogicalPlan::Window(_)
            | LogicalPlan::Distinct(_)
            | LogicalPlan::Filter(_)
            | LogicalPlan::Join(_)
    ) && plan.inputs().len() == 1
        && !node_has_semantic(&plan)?;
    if wrapper {
        let input = rewrite_top(plan.inputs()[0].clone(), options)?;
        return plan.with_new_exprs(plan.expressions(), vec![input]);
    }
    if !block_has_semantic(&plan)? {
        return rewrite_below(plan, options);
    }
    let mut maps = Vec::new();
    let aliases = map_aliases(&plan)?;
    rewrite_block(plan, options, &mut maps, &aliases)
}

/// What a query that splits its semantic functions over several blocks is told.
const ONE_BLOCK: &str = "Stretto runs one semantic pipeline per query, in the one SELECT block that holds its \
     semantic functions (the outermost, or one CTE, derived table or UNION branch): they belong in that block's WHERE \
     (as AND-ed conditions), JOIN ... ON of inner joins, SELECT list, GROUP BY, HAVING or ORDER BY, not in two \
     blocks (a CTE read twice counts twice), an IN / EXISTS / scalar subquery or a non-inner join";

/// Whether the block's own clauses call a semantic function: its upper part, WHERE, and the ON clauses of its join
/// tree, not the CTEs, derived tables or UNION branches it reads.
fn block_has_semantic(plan: &LogicalPlan) -> Result<bool> {
    if node_has_semantic(plan)? {
        return Ok(true);
    }
    if is_upper(plan) || matches!(plan, LogicalPlan::Filter(_) | LogicalPlan::Join(_)) {
        for input in plan.inputs() {
            if block_has_semantic(input)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A block without semantic functions of its own: the pipeline goes into the one input that holds them.
fn rewrite_below(plan: LogicalPlan, options: &StrettoOptions) -> Result<LogicalPlan> {
    let mut holder = None;
    for (i, input) in plan.inputs().into_iter().enumerate() {
        if plan_has_semantic(input)? {
            if holder.is_some() {
                return plan_err!("{ONE_BLOCK}");
            }
            holder = Some(i);
        }
    }
    let Some(holder) = holder else { return plan_err!("{ONE_BLOCK}") };
    let inputs = plan
        .inputs()
        .into_iter()
        .enumerate()
        .map(|(i, input)| if i == holder { rewrite_top(input.clone(), options) } else { Ok(input.clone()) })
        .collect::<Result<Vec<_>>>()?;
    plan.with_new_exprs(plan.expressions(), inputs)
}

/// The SQL alias of each `sem_map` call of the block, by its prompt and type: `sem_map(..) AS title` in the
/// SELECT list, or the alias a GROUP BY key gets in the SELECT list above its aggregate. It is the label the model
/// reads for the value, the same wherever the call appears in the query.
fn map_aliases(plan: &LogicalPlan) -> Result<Vec<((String, String), String)>> {
    let mut calls: Vec<(String, (String, String))> = Vec::new();
    let mut aliases: Vec<(Expr, String)> = Vec::new();
    let mut node = Some(plan);
    while let Some(p) = node.filter(|p| is_upper(p)) {
        for e in p.expressions() {
            e.apply(|x| {
                if let Some((name, f)) = semantic_call(x) {
                    if name != SEM_FILTER {
                        if let (Ok(prompt), Ok(ty)) = (prompt_of(f, name), map_type(f)) {
                            calls.push((x.schema_name().to_string(), (prompt, ty)));
                        }
                    }
                }
                if let Expr::Alias(a) = x {
                    aliases.push((a.expr.as_ref().clone(), a.name.clone()));
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        node = p.inputs().first().copied();
    }
    let mut out: Vec<((String, String), String)> = Vec::new();
    for (expr, alias) in aliases {
        let key = match &expr {
            e if semantic_call(e).is_some() => calls.iter().find(|(n, _)| *n == e.schema_name().to_string()),
            Expr::Column(c) => calls.iter().find(|(n, _)| *n == c.name),
            _ => None,
        };
        if let Some((_, key)) = key {
            if !out.iter().any(|(k, _)| k == key) {
                out.push((key.clone(), alias));
            }
        }
    }
    Ok(out)
}

/// The declared type of a `sem_map` call, lower-cased (`text` when omitted).
fn map_type(f: &ScalarFunction) -> Result<String> {
    match f.args.len() {
        1 => Ok("text".to_string()),
        2 => match string_arg(f, 1) {
            Some(t) => Ok(t.trim().to_ascii_lowercase()),
            None => plan_err!("the second argument of sem_map must be a type name in quotes"),
        },
        n => plan_err!("sem_map takes a prompt and an optional type, got {n} arguments"),
    }
}

type Aliases = [((String, String), String)];

fn is_upper(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(_)
        | LogicalPlan::Aggregate(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Window(_)
        | LogicalPlan::Distinct(_) => true,
        // HAVING and QUALIFY: a filter over an aggregate or a window.
        LogicalPlan::Filter(f) => matches!(f.input.as_ref(), LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)),
        _ => false,
    }
}

fn rewrite_block(
    plan: LogicalPlan,
    options: &StrettoOptions,
    maps: &mut Vec<MapSpec>,
    aliases: &Aliases,
) -> Result<LogicalPlan> {
    if !is_upper(&plan) {
        return rewrite_core(plan, options, maps, aliases);
    }
    // Map columns the clauses above this node read (ORDER BY or HAVING calls, not in the SELECT list): they come up
    // from the pipeline through it.
    let pending: Vec<String> = maps.iter().map(|m| m.field.clone()).collect();
    // Nodes whose expressions name output columns keep those names when a call becomes a column.
    let names_outputs = matches!(plan, LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_));
    let clause = clause_of(&plan);
    let mut exprs = Vec::new();
    for e in plan.expressions() {
        if !expr_has_semantic(&e)? {
            exprs.push(e);
            continue;
        }
        let before = e.schema_name().to_string();
        let replaced = replace_maps(e, maps, aliases, clause)?;
        exprs.push(if names_outputs && !matches!(replaced, Expr::Alias(_)) {
            replaced.alias(before)
        } else {
            replaced
        });
    }
    let inputs = plan.inputs();
    if inputs.len() != 1 {
        return plan_err!("{clause} with {} inputs cannot hold semantic functions", inputs.len());
    }
    if !pending.is_empty() {
        match &plan {
            LogicalPlan::Projection(p) => {
                let outputs: Vec<String> = p.schema.fields().iter().map(|f| f.name().clone()).collect();
                for field in pending.iter().filter(|f| !outputs.contains(f)) {
                    exprs.push(Expr::Column(Column::from_name(field)));
                }
            }
            LogicalPlan::Aggregate(_) => {
                return plan_err!(
                    "sem_map('{}') stands above a GROUP BY of its block, but the pipeline runs on the rows before \
                     grouping: ask it in a subquery or CTE of its own, before the grouping (`SELECT ..., sem_map(...) \
                     AS m FROM t`, then group or filter by `m`) or after it (`FROM (SELECT ... GROUP BY ...) AS s`, \
                     the prompt naming `{{s.column}}`)",
                    // The maps pending here come first: this node's own calls were added after them.
                    maps.first().map_or("", |m| m.prompt.as_str())
                );
            }
            _ => {}
        }
    }
    let input = rewrite_block(inputs[0].clone(), options, maps, aliases)?;
    plan.with_new_exprs(exprs, vec![input])
}

fn clause_of(plan: &LogicalPlan) -> &'static str {
    match plan {
        LogicalPlan::Projection(_) => "the SELECT list",
        LogicalPlan::Aggregate(_) => "GROUP BY / an aggregate",
        LogicalPlan::Sort(_) => "ORDER BY",
        LogicalPlan::Limit(_) => "LIMIT",
        LogicalPlan::Window(_) => "a window function",
        LogicalPlan::Distinct(_) => "DISTINCT",
        LogicalPlan::Filter(_) => "HAVING",
        _ => "this part of the query",
    }
}

/// The FROM/WHERE part of the block: semantic filters out of WHERE and inner-join ON clauses, the pipeline in
/// their place.
fn rewrite_core(
    plan: LogicalPlan,
    options: &StrettoOptions,
    maps: &mut Vec<MapSpec>,
    aliases: &Aliases,
) -> Result<LogicalPlan> {
    let mut filters = Vec::new();
    let mut post = Vec::new();
    let relational = match plan {
        LogicalPlan::Filter(f) => {
            let mut keep = Vec::new();
            for c in split_conjunction_owned(f.predicate) {
                if let Some(prompt) = filter_prompt(&c, "WHERE")? {
                    filters.push(prompt);
                } else if expr_has_semantic(&c)? {
                    post.push(replace_maps(c, maps, aliases, "WHERE")?);
                } else {
                    keep.push(c);
                }
            }
            let input = strip_joins(Arc::unwrap_or_clone(f.input), &mut filters)?;
            match conjunction(keep) {
                Some(p) => LogicalPlan::Filter(Filter::try_new(p, Arc::new(input))?),
                None => input,
            }
        }
        other => strip_joins(other, &mut filters)?,
    };
    if plan_has_semantic(&relational)? {
        return plan_err!("{ONE_BLOCK}");
    }
    // A conjunction holds a predicate once however often it is written: the same `sem_filter` twice (in WHERE, or
    // in WHERE and an ON clause) is one logical filter, profiled and run once, as the same `sem_map` twice is one map.
    let mut seen = std::collections::HashSet::new();
    filters.retain(|p| seen.insert(p.clone()));
    if filters.is_empty() && maps.is_empty() {
        return Ok(relational);
    }
    let spec = PipelineSpec { filters, maps: maps.clone(), options: options.clone() };
    let node = LogicalPlan::Extension(Extension { node: Arc::new(SemanticPipelineNode::try_new(relational, spec)?) });
    Ok(match conjunction(post) {
        Some(p) => LogicalPlan::Filter(Filter::try_new(p, Arc::new(node))?),
        None => node,
    })
}

/// Takes `sem_filter` conjuncts out of the ON clauses of the join tree.
fn strip_joins(plan: LogicalPlan, filters: &mut Vec<String>) -> Result<LogicalPlan> {
    let LogicalPlan::Join(mut join) = plan else { return Ok(plan) };
    let left = strip_joins(Arc::unwrap_or_clone(join.left), filters)?;
    let right = strip_joins(Arc::unwrap_or_clone(join.right), filters)?;
    if let Some(on) = join.filter.take() {
        let mut keep = Vec::new();
        for c in split_conjunction_owned(on) {
            if !expr_has_semantic(&c)? {
                keep.push(c);
                continue;
            }
            if join.join_type != JoinType::Inner {
                return plan_err!(
                    "a semantic function in the ON clause of a {} join: only inner joins (JOIN ... ON sem_filter(...)) \
                     can run as Stretto's semantic join",
                    join.join_type
                );
            }
            match filter_prompt(&c, "JOIN ... ON")? {
                Some(p) => filters.push(p),
                None => {
                    return plan_err!(
                        "in JOIN ... ON, `{c}`: a join condition can be a sem_filter(...) call, not a sem_map"
                    )
                }
            }
        }
        join.filter = conjunction(keep);
    }
    join.left = Arc::new(left);
    join.right = Arc::new(right);
    Ok(LogicalPlan::Join(join))
}

/// The prompt of a conjunct that is exactly one `sem_filter('...')` call; `None` for a conjunct without one; an
/// error for a `sem_filter` inside a larger expression (OR, NOT, a comparison), which one pipeline cannot run.
fn filter_prompt(c: &Expr, clause: &str) -> Result<Option<String>> {
    if let Some((SEM_FILTER, f)) = semantic_call(c) {
        return Ok(Some(prompt_of(f, SEM_FILTER)?));
    }
    if c.exists(|e| Ok(matches!(semantic_call(e), Some((SEM_FILTER, _)))))? {
        return plan_err!(
            "in {clause}, `{c}`: sem_filter(...) must be a condition of its own, AND-ed with the others (not under \
             OR, NOT or a comparison)"
        );
    }
    Ok(None)
}

fn string_arg(f: &ScalarFunction, i: usize) -> Option<&str> {
    match f.args.get(i)? {
        Expr::Literal(v, _) => literal_text(v),
        Expr::Cast(c) => match c.expr.as_ref() {
            Expr::Literal(v, _) => literal_text(v),
            _ => None,
        },
        _ => None,
    }
}

fn prompt_of(f: &ScalarFunction, name: &str) -> Result<String> {
    match string_arg(f, 0) {
        Some(p) => Ok(p.to_string()),
        None => plan_err!(
            "the prompt of {name} must be a string literal naming its columns in braces, e.g. \
             {name}('{{reviews.reviewtext}} is clearly positive'); got {}",
            f.args.first().map(|a| a.to_string()).unwrap_or_else(|| "no argument".into())
        ),
    }
}

/// Replaces every `sem_map` call in `e` with the column the pipeline produces for it (the same call twice is one
/// map); a `sem_filter` here is an error naming the clause.
fn replace_maps(e: Expr, maps: &mut Vec<MapSpec>, aliases: &Aliases, clause: &str) -> Result<Expr> {
    e.transform_up(|x| {
        let Some((name, f)) = semantic_call(&x) else { return Ok(Transformed::no(x)) };
        if name == SEM_FILTER {
            return plan_err!(
                "sem_filter(...) in {clause}: a semantic filter belongs in WHERE or JOIN ... ON; for a yes/no column \
                 write sem_map('...', 'boolean')"
            );
        }
        let prompt = prompt_of(f, name)?;
        let ty = map_type(f)?;
        parse_type(&ty)?;
        let field = match maps.iter().find(|m| m.prompt == prompt && m.ty == ty) {
            Some(m) => m.field.clone(),
            None => {
                let alias = aliases.iter().find(|((p, t), _)| *p == prompt && *t == ty).map(|(_, a)| a.as_str());
                let base = alias.filter(|a| !a.trim().is_empty()).unwrap_or("value").to_string();
                let mut column = base.clone();
                let mut k = 2;
                while maps.iter().any(|m| m.column == column) {
                    column = format!("{base}_{k}");
                    k += 1;
                }
                let field = format!("__stretto_map_{}", maps.len() + 1);
                maps.push(MapSpec { column, prompt, ty, field: field.clone() });
                field
            }
        };
        Ok(Transformed::yes(Expr::Column(Column::from_name(field))))
    })
    .data()
}
