//! Codegen map: a local coder LLM writes a small extraction program, which runs in a sandbox.
//!
//! The program is an *extraction spec*: a regular expression whose first capture group is the value. That is the
//! sandbox: a spec is data for the `regex` engine, which has no file, process or network access, matches in time
//! linear in the input (no catastrophic backtracking), and is built under hard size limits; inputs are truncated
//! to a bounded length. Anything else the model writes (Python, Perl code blocks, look-arounds the engine does not
//! run) is rejected with the reason, and the model is asked to repair its program a bounded number of times; a
//! spec that matches none of the sample values is repaired the same way. A program that still fails is rejected
//! and the operator extracts nothing (no value, confidence 0) rather than guessing. No spec is asked for where at
//! most half of the coder's own reference answers are written in their samples (a judgement, not an extraction:
//! [`out_of_reach`]), and repairs stop once the model repeats a spec: failed syntheses cost less.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use regex::{Regex, RegexBuilder};
use stretto_core::memo::{memo_key, Memo, MemoEntry};
use stretto_core::op::{
    parse_config, LogicalKind, Modality, OpOutput, OpProperties, OperatorFactory, PhysicalOp, SemanticTask, ValueType,
};
use stretto_core::{CoreError, OpContext, Result};

use crate::llm::about_the_text;
use crate::normalize::{map_identity, normalize_choice};
use stretto_kv::choice::closed_choices;

/// Compiled-program size limit (bytes of the regex engine's program).
pub const SIZE_LIMIT: usize = 1 << 20;
/// Longest input a program sees (characters); the rest is cut off.
pub const MAX_INPUT: usize = 20_000;

/// Why a program was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SandboxError {
    /// Not a regular expression the engine accepts (code, look-around, backreferences...).
    #[error("rejected: not a valid extraction spec ({0})")]
    Invalid(String),
    /// Over the size limits.
    #[error("rejected: the spec exceeds the sandbox's size limits ({0})")]
    TooLarge(String),
    /// No capture group to take the value from.
    #[error("rejected: the spec has no capture group for the value")]
    NoGroup,
}

/// A sandboxed extraction program.
#[derive(Debug, Clone)]
pub struct Program {
    spec: String,
    re: Regex,
}

impl Program {
    /// Compiles a spec under the sandbox's limits.
    pub fn compile(spec: &str) -> std::result::Result<Self, SandboxError> {
        let re = RegexBuilder::new(spec)
            .size_limit(SIZE_LIMIT)
            .dfa_size_limit(SIZE_LIMIT)
            .nest_limit(64)
            .build()
            .map_err(|e| match e {
                regex::Error::CompiledTooBig(n) => SandboxError::TooLarge(format!("over {n} bytes")),
                other => SandboxError::Invalid(other.to_string().lines().last().unwrap_or_default().trim().to_string()),
            })?;
        if re.captures_len() < 2 {
            return Err(SandboxError::NoGroup);
        }
        Ok(Self { spec: spec.to_string(), re })
    }

    /// The spec's text.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The first capture of the first match in (the bounded prefix of) `text`.
    pub fn run(&self, text: &str) -> Option<String> {
        let end = text.char_indices().nth(MAX_INPUT).map_or(text.len(), |(i, _)| i);
        let caps = self.re.captures(&text[..end])?;
        caps.iter().skip(1).flatten().next().map(|m| m.as_str().trim().to_string()).filter(|s| !s.is_empty())
    }
}

/// The spec inside a model's reply: a fenced block if there is one, else the first non-empty line; Python raw
/// string wrappers (`r"..."`) are removed.
pub fn spec_from_reply(reply: &str) -> String {
    let body = match reply.split("```").nth(1) {
        Some(block) => {
            let mut lines = block.lines();
            let first = lines.next().unwrap_or_default().trim();
            // A language tag line (```regex, ```python) is not part of the spec.
            if first.is_empty() || first.chars().all(|c| c.is_ascii_alphabetic()) {
                lines.collect::<Vec<_>>().join("\n")
            } else {
                block.to_string()
            }
        }
        None => reply.to_string(),
    };
    let line = body.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    let line = line.strip_prefix("r\"").and_then(|l| l.strip_suffix('"')).unwrap_or(line);
    let line = line.strip_prefix("r'").and_then(|l| l.strip_suffix('\'')).unwrap_or(line);
    line.trim_matches('`').to_string()
}

/// Configuration.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodegenConfig {
    /// The coder LLM.
    #[serde(default = "default_model")]
    pub model: String,
    /// Sample values shown to the model.
    #[serde(default = "default_samples")]
    pub samples: usize,
    /// Repair rounds after a failing program.
    #[serde(default = "default_repairs")]
    pub repairs: usize,
    /// A fixed spec instead of a generated one (for users who write their own extractor).
    #[serde(default)]
    pub program: Option<String>,
}

fn default_model() -> String {
    "qwen2.5-coder-0.5b".into()
}
fn default_samples() -> usize {
    3
}
fn default_repairs() -> usize {
    2
}

/// The codegen map operator.
#[derive(Debug)]
pub struct CodegenMap {
    name: String,
    props: OpProperties,
    config: CodegenConfig,
    programs: Mutex<HashMap<String, Option<Program>>>,
    ctx: OpContext,
    memo: OnceLock<Option<Memo>>,
}

impl CodegenMap {
    /// Builds it (cheap; the coder loads when a program is first needed).
    pub fn new(config: CodegenConfig, ctx: &OpContext) -> Result<Self> {
        let bad = |m: String| CoreError::OperatorConfig { factory: "codegen-map".into(), message: m };
        // A catalog decoder or one the user registered; an encoder cannot write programs.
        stretto_kv::prepare::check_decoder_name(&ctx.model_home, &config.model).map_err(|e| bad(e.to_string()))?;
        if let Some(p) = &config.program {
            Program::compile(p).map_err(|e| bad(format!("program `{p}`: {e}")))?;
        }
        // A fixed program is part of the operator's identity (memoised answers are keyed by it).
        let name = match &config.program {
            Some(p) => format!("codegen:fixed-{}", &memo_key("codegen", p, "")[..12]),
            None => format!("codegen:{}", config.model),
        };
        Ok(Self {
            name,
            props: OpProperties {
                kind: LogicalKind::Map,
                family: "codegen-map".into(),
                modality: Modality::Text,
                model: config.program.is_none().then(|| config.model.clone()),
                compression: None,
                tunable: true,
                gold: false,
                cost_hint: 1e-4,
                score_range: (0.0, 1.0),
            },
            config,
            programs: Mutex::new(HashMap::new()),
            ctx: ctx.clone(),
            memo: OnceLock::new(),
        })
    }

    fn memo(&self) -> Option<&Memo> {
        self.memo.get_or_init(|| self.ctx.open_memo(&self.name)).as_ref()
    }

    /// The program for a task: fixed, memoised, or synthesised (with repairs) from sample items.
    pub fn program(&self, task: &SemanticTask, samples: &[String]) -> Result<Option<Program>> {
        if let Some(p) = &self.config.program {
            return Ok(Program::compile(p).ok());
        }
        let mut programs = self.programs.lock().map_err(|_| CoreError::operator(&self.name, "lock poisoned"))?;
        if let Some(p) = programs.get(&task.prompt) {
            return Ok(p.clone());
        }
        let key = memo_key(
            &crate::under_model(&self.ctx, self.name.clone(), &self.config.model)?,
            &task.prompt,
            "__program__",
        );
        if let Some(e) = self.memo().and_then(|m| m.get(&key)) {
            let p = e.value.as_deref().and_then(|s| Program::compile(s).ok());
            programs.insert(task.prompt.clone(), p.clone());
            return Ok(p);
        }
        let start = Instant::now();
        let (program, log) = synthesize(&self.ctx, &self.config, task, samples)?;
        for line in &log {
            tracing::info!(operator = %self.name, "{line}");
        }
        if let Some(m) = self.memo() {
            m.put(vec![MemoEntry {
                key,
                score: None,
                value: program.as_ref().map(|p| p.spec().to_string()),
                confidence: None,
                seconds: start.elapsed().as_secs_f64(),
            }])?;
        }
        programs.insert(task.prompt.clone(), program.clone());
        Ok(program)
    }
}

/// Asks the coder for reference answers on the samples, then for a spec; checks the spec in the sandbox and against
/// the reference answers, and repairs it up to `repairs` times.
/// Returns the accepted program (if any) and a log of every attempt.
pub fn synthesize(
    ctx: &OpContext,
    config: &CodegenConfig,
    task: &SemanticTask,
    samples: &[String],
) -> Result<(Option<Program>, Vec<String>)> {
    let _span = tracing::info_span!("codegen", model = %config.model).entered();
    let dec = crate::decoder(ctx, &config.model, stretto_kv::convert::Weights::F32)
        .map_err(|e| CoreError::operator_failed("codegen", e))?;
    let field = task.output.as_ref().map_or("value".to_string(), |o| o.0.replace('_', " "));
    let shown: Vec<String> =
        samples.iter().take(config.samples).map(|s| s.chars().take(400).collect::<String>()).collect();
    // Reference answers for the samples, from the coder itself reading each one: the program must reproduce them,
    // which catches programs that match the wrong thing (a player's points instead of the team's).
    let ty = task.output.as_ref().map(|o| o.1).unwrap_or(ValueType::String);
    let instruction = about_the_text(&task.prompt).replace("the text above", "the text");
    let choices = closed_choices(&instruction);
    let normalize = |raw: &str, ty| normalize_choice(raw, ty, choices.as_deref());
    let mut answers = Vec::with_capacity(shown.len());
    for s in &shown {
        let ids = dec
            .encode(&dec.chat_prompt(&format!("{s}\n\n{instruction}. Reply with the value only.")))
            .map_err(|e| CoreError::operator_failed("codegen", e))?;
        // (Only the answer's first line is read: the decoding stops there.)
        let g = dec
            .generate_line(&[stretto_kv::decoder::Step { past: None, tokens: &ids }], 16)
            .map_err(|e| CoreError::operator_failed("codegen", e))?
            .remove(0);
        answers.push(normalize(&g.text, ty));
    }
    let examples = shown
        .iter()
        .zip(&answers)
        .enumerate()
        .map(|(i, (s, a))| format!("Text {}:\n{s}\nExpected {field}: {}", i + 1, a.as_deref().unwrap_or("(none)")))
        .collect::<Vec<_>>()
        .join("\n\n");
    let mut request = format!(
        "Write one regular expression with exactly one capturing group that extracts the {field} from texts like \
         these. Task: {instruction}.\n\n{examples}\n\nReply with the regular expression only, in a ```regex block."
    );
    let mut log = vec![format!("reference answers: {answers:?}")];
    // A program can only extract what is written in the text: where at most half the reference answers are (a
    // sentiment, a topic, a judgement), no spec can reproduce them and asking for one costs tens of seconds.
    if ty == ValueType::String && out_of_reach(&shown, &answers) {
        log.push("no spec asked: at most half the reference answers appear in their sample's text".into());
        return Ok((None, log));
    }
    let mut tried: Vec<String> = Vec::new();
    for attempt in 0..=config.repairs {
        let ids = dec.encode(&dec.chat_prompt(&request)).map_err(|e| CoreError::operator_failed("codegen", e))?;
        let g = dec
            .generate(&[stretto_kv::decoder::Step { past: None, tokens: &ids }], 96)
            .map_err(|e| CoreError::operator_failed("codegen", e))?
            .remove(0);
        let spec = spec_from_reply(&g.text);
        // A repair that repeats an earlier spec shows the feedback is not moving the model (decoding is greedy);
        // further rounds are taken to fail likewise, a heuristic that saves their decoding.
        if tried.contains(&spec) {
            log.push(format!("attempt {attempt}: `{spec}` repeats an earlier spec; repairs stopped"));
            break;
        }
        tried.push(spec.clone());
        let check = |p: &Program| -> (Vec<Option<String>>, usize, usize, bool) {
            let got: Vec<Option<String>> = shown.iter().map(|s| p.run(s).and_then(|v| normalize(&v, ty))).collect();
            let known = answers.iter().filter(|a| a.is_some()).count();
            let right = got.iter().zip(&answers).filter(|(g, a)| a.is_some() && g == a).count();
            let hits = got.iter().filter(|g| g.is_some()).count();
            // Agree with the reference on most samples that have one; with no reference at all, just match.
            let ok = (known > 0 && 2 * right > known) || (known == 0 && hits > 0);
            (got, known, right, ok)
        };
        let feedback = match Program::compile(&spec) {
            Err(e) => format!("{e}"),
            Ok(p) => {
                let (got, known, right, ok) = check(&p);
                if ok {
                    log.push(format!("attempt {attempt}: accepted `{spec}` ({right}/{known} reference answers)"));
                    return Ok((Some(p), log));
                }
                // A value pattern that finds the right kind of value in the wrong place (the first four digits of
                // a Message-ID instead of the Date header's year) is repaired by anchoring it on the label of the
                // line where the expected values sit, when the samples share one.
                if let Some(anchored) = anchor_on_label(&spec, &shown, &answers).and_then(|a| Program::compile(&a).ok())
                {
                    let (_, known, right, ok) = check(&anchored);
                    if ok {
                        log.push(format!(
                            "attempt {attempt}: `{spec}` anchored on its line label as `{}` ({right}/{known} reference answers)",
                            anchored.spec()
                        ));
                        return Ok((Some(anchored), log));
                    }
                }
                let wrong: Vec<String> = got
                    .iter()
                    .zip(&answers)
                    .enumerate()
                    .filter(|(_, (g, a))| g != a)
                    .map(|(i, (g, a))| {
                        format!(
                            "on text {} it gave {} instead of {}",
                            i + 1,
                            g.as_deref().unwrap_or("nothing"),
                            a.as_deref().unwrap_or("nothing")
                        )
                    })
                    .collect();
                format!("wrong: {}", wrong.join("; "))
            }
        };
        log.push(format!("attempt {attempt}: `{spec}` {feedback}"));
        // Where the expected values sit: the line around each one, so the model can anchor on its context.
        let context: Vec<String> = shown
            .iter()
            .zip(&answers)
            .filter_map(|(s, a)| {
                let a = a.as_deref()?;
                let line = s.lines().find(|l| l.contains(a))?;
                Some(format!("`{}`", line.trim().chars().take(120).collect::<String>()))
            })
            .collect();
        request.push_str(&format!(
            "\n\nYour previous answer `{spec}` was {feedback}. The expected values appear in these lines: {}. \
             Anchor the expression on the words around the value. Rust's regex engine has no look-around or \
             backreferences. Write a better regular expression with one capturing group.",
            context.join(", ")
        ));
    }
    Ok((None, log))
}

/// Whether the reference answers are mostly not in their samples' text, so no extraction spec can reproduce them:
/// at most half of the known answers appear in their sample (compared in lower case). With no known answer there is
/// nothing to judge by, and the spec is asked for.
pub fn out_of_reach(samples: &[String], answers: &[Option<String>]) -> bool {
    let known: Vec<(&String, &str)> =
        samples.iter().zip(answers).filter_map(|(s, a)| a.as_deref().map(|a| (s, a))).collect();
    let present = known.iter().filter(|(s, a)| s.to_lowercase().contains(&a.to_lowercase())).count();
    !known.is_empty() && 2 * present <= known.len()
}

/// The label that opens a line (`Date:`, `Subject:`, `X-From:`): text before the first colon, short and free of
/// other punctuation.
fn line_label(line: &str) -> Option<&str> {
    let l = line.trim_start();
    let i = l.find(':')?;
    let label = &l[..i];
    (i > 0 && i <= 40 && label.chars().all(|c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' '))
        .then_some(&l[..=i])
}

/// `spec` anchored on the label shared by the lines holding the expected answers: `(?m)^\s*Date:[^\n]*?` + spec
/// (without its own start anchor). `None` when the samples' answer lines do not share a label.
pub fn anchor_on_label(spec: &str, samples: &[String], answers: &[Option<String>]) -> Option<String> {
    let mut labels = samples.iter().zip(answers).filter_map(|(s, a)| {
        let a = a.as_deref()?;
        // The first line holding the answer as a whole token.
        let word = Regex::new(&format!(r"(?:^|\W){}(?:\W|$)", regex::escape(a))).ok()?;
        s.lines().find(|l| word.is_match(l)).and_then(line_label)
    });
    let first = labels.next()?;
    if !labels.all(|l| l == first) {
        return None;
    }
    let value = spec.strip_prefix("(?m)").unwrap_or(spec);
    let value = value.strip_prefix('^').unwrap_or(value);
    Some(format!(r"(?m)^[ \t]*{}[^\n]*?{value}", regex::escape(first)))
}

impl PhysicalOp for CodegenMap {
    fn name(&self) -> &str {
        &self.name
    }

    fn properties(&self) -> &OpProperties {
        &self.props
    }

    fn accept(&self, task: &SemanticTask) -> Result<String> {
        // A closed-choice map's values are its choices: kept apart from values memoised before choices were read.
        let identity = map_identity(&self.name, &about_the_text(&task.prompt));
        // A program its model wrote depends on the system prompt too; a fixed one on nothing the model says.
        Ok(match self.config.program {
            Some(_) => identity,
            None => crate::under_model(&self.ctx, identity, &self.config.model)?,
        })
    }

    fn evaluate_items(&self, task: &SemanticTask, items: &[String]) -> Result<(OpOutput, Vec<f64>)> {
        let start = Instant::now();
        let program = self.program(task, items)?;
        let ty = task.output.as_ref().map(|o| o.1).unwrap_or(ValueType::String);
        // A closed-choice map's values are its listed words, as the LLM maps answer it.
        let choices = closed_choices(&about_the_text(&task.prompt));
        let values: Vec<Option<String>> = items
            .iter()
            .map(|t| program.as_ref().and_then(|p| p.run(t)).and_then(|v| normalize_choice(&v, ty, choices.as_deref())))
            .collect();
        let confidences = values.iter().map(|v| if v.is_some() { 1.0 } else { 0.0 }).collect();
        // Synthesis (once per task) is paid by the batch that needed it; matching itself costs microseconds.
        let each = (start.elapsed().as_secs_f64() / items.len().max(1) as f64).max(1e-7);
        Ok((OpOutput::Values { values, confidences }, vec![each; items.len()]))
    }

    /// Generating the program is the one-off setup: tens of seconds of decoding on 2 CPU cores.
    fn one_off_setup(&self) -> bool {
        true
    }
}

stretto_core::inventory::submit! {
    OperatorFactory {
        name: "codegen-map",
        plugin: crate::PLUGIN,
        about: "a coder LLM writes a regex extraction spec once per task; it runs sandboxed on every tuple",
        ladder: |_| vec![serde_json::json!({"model": "qwen2.5-coder-0.5b"})],
        build: |c, ctx| Ok(Arc::new(CodegenMap::new(parse_config("codegen-map", c)?, ctx)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_attempts_are_stopped_and_reported() {
        // Code instead of a spec: refused before anything runs.
        for code in [r#"(?{ system("cat /etc/passwd") })"#, "(?<=x)(\\d+)", "(?P<x>a)(?P=x)", "(\\d+)\\1"] {
            let e = Program::compile(code).unwrap_err();
            assert!(matches!(e, SandboxError::Invalid(_)), "{code}: {e:?}");
            assert!(e.to_string().starts_with("rejected"));
        }
        // Python that happens to parse as a pattern is only a pattern: its parentheses are groups and its dots match
        // any character, so it finds text shaped like it and returns that text, never a file's contents.
        let py = Program::compile("import os; (open('/etc/passwd').read())").unwrap();
        assert_eq!(py.run("import os; open('/etc/passwd').read()"), None, "literal parentheses are not matched");
        assert_eq!(py.run("import os; open'/etc/passwd'_read").as_deref(), Some("open'/etc/passwd'_read"));
        // A program built to exhaust memory is over the size limit.
        assert!(matches!(Program::compile("(a{1000}){1000}{1000}").unwrap_err(), SandboxError::TooLarge(_)));
        assert_eq!(Program::compile("\\d+").unwrap_err(), SandboxError::NoGroup);
        // The classic catastrophic-backtracking spec ends (the engine is linear-time) and finds nothing.
        let p = Program::compile("^(a+)+$").unwrap();
        let evil = format!("{}!", "a".repeat(MAX_INPUT - 100));
        assert!(p.run(&evil).is_none());
    }

    #[test]
    fn a_value_pattern_is_anchored_on_the_shared_line_label() {
        let samples: Vec<String> = [
            "Message-ID: <1234.1075.JavaMail>\nDate: Mon, 14 May 2001 16:39:00 -0700\nSubject: 1999 budget",
            "Message-ID: <9876.5432.JavaMail>\nDate: Fri, 4 Jan 2002 09:00:00 -0800\nSubject: hi",
        ]
        .map(String::from)
        .to_vec();
        let answers = vec![Some("2001".to_string()), Some("2002".to_string())];
        // The coder's pattern grabs the Message-ID's digits.
        let naive = Program::compile(r"(\d{4})").unwrap();
        assert_eq!(naive.run(&samples[0]).as_deref(), Some("1234"));
        let anchored = anchor_on_label(r"^(\d{4})", &samples, &answers).unwrap();
        let p = Program::compile(&anchored).unwrap();
        assert_eq!(p.run(&samples[0]).as_deref(), Some("2001"));
        assert_eq!(p.run(&samples[1]).as_deref(), Some("2002"));
        // Answers on lines with different labels (or none) give no anchor.
        let mixed = vec![Some("2001".to_string()), Some("hi".to_string())];
        assert_eq!(anchor_on_label(r"(\d{4})", &samples, &mixed), None);
        assert_eq!(anchor_on_label(r"(\d{4})", &samples, &[None, None]), None);
    }

    #[test]
    fn answers_not_written_in_the_text_are_out_of_a_programs_reach() {
        let samples: Vec<String> =
            ["Great phone, the Pixel 7 by Google.", "Terrible shoes from Nike.", "A mug."].map(String::from).to_vec();
        let some = |a: &str| Some(a.to_string());
        // Brands written in the text (in any case): a spec can find them.
        assert!(!out_of_reach(&samples, &[some("google"), some("Nike"), None]));
        // Two of three present: still within reach.
        assert!(!out_of_reach(&samples, &[some("Google"), some("Nike"), some("positive")]));
        // Judgements that are not in the text: out of reach.
        assert!(out_of_reach(&samples, &[some("positive"), some("negative"), some("neutral")]));
        // Half present is not most.
        assert!(out_of_reach(&samples[..2], &[some("Google"), some("negative")]));
        // Nothing known: nothing to judge by.
        assert!(!out_of_reach(&samples, &[None, None, None]));
    }

    #[test]
    fn specs_are_read_from_replies_and_extract() {
        assert_eq!(spec_from_reply("```regex\n(\\d+) points\n```"), "(\\d+) points");
        assert_eq!(spec_from_reply("Here: r\"(\\d+) - \\d+\""), "Here: r\"(\\d+) - \\d+\"");
        assert_eq!(spec_from_reply("r\"(\\d+) - \\d+\""), "(\\d+) - \\d+");
        let p = Program::compile(r"\) (\d+) - \d+").unwrap();
        assert_eq!(p.run("The Hawks (46 - 12) beat the Magic (19 - 41) 95 - 88 on Friday").as_deref(), Some("95"));
        assert_eq!(p.run("no score"), None);
    }
}
