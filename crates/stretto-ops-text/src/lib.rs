//! # stretto-ops-text
//!
//! Physical operators over text columns, each contributed to the [`Registry`](stretto_core::op::Registry) by an
//! `inventory::submit!`ed [`OperatorFactory`](stretto_core::op::OperatorFactory).
//!
//! - [`llm`]: LLM filters and maps over precomputed KV caches, one rung per (model, compression ratio);
//! - [`embedding`]: cosine similarity of sentence embeddings (MiniLM, MPNet) between item and predicate;
//! - [`keyword`]: a cheap, exact filter, useful as a first cascade stage and in tests;
//! - [`join`]: semantic joins, operators that judge the pairs of a predicate over two tables with each side seen
//!   apart: the LLM over the first text's cached past (`llm-pair`), project-then-join (`project-pair`, the
//!   reference of predicates that compare one property of the two sides) and the sides' embedding cosine
//!   (`embed-pair`).
//!
//! Each operator implements only what is its own (which tasks it accepts, one evaluation over its items); the
//! framework's [`RegisteredOp`](stretto_core::op::RegisteredOp) memoises every answer by (operator, task, item)
//! and reports what it cost to compute.
//!
//! ```
//! stretto_ops_text::link(); // make sure this crate's registrations are linked into the binary
//! let registry = stretto_core::op::Registry::discover(&stretto_core::OpContext::new("/tmp/stretto-home"))?;
//! let kw = registry.get("keyword")?;
//! assert_eq!(kw.properties().family, "keyword");
//! # Ok::<(), stretto_core::CoreError>(())
//! ```

#![warn(missing_docs)]

pub mod codegen;
pub mod embedding;
pub mod join;
pub mod keyword;
pub mod llm;
pub mod normalize;

/// This crate's name as registered in the plugin registry.
pub const PLUGIN: &str = "stretto-ops-text";

stretto_core::inventory::submit! {
    stretto_core::op::PluginCrate { name: PLUGIN }
}

/// Forces the linker to keep this crate and its `inventory` registrations.
///
/// rustc drops a dependency that no code names, and its `submit!`s vanish with it. Calling this from the binary
/// (the `stretto` facade's `link()` does) makes that impossible.
#[inline(never)]
pub fn link() -> &'static str {
    std::hint::black_box(PLUGIN)
}

/// How a registry's models run (threads, execution provider), in the KV runtime's terms.
pub fn runtime(ctx: &stretto_core::OpContext) -> stretto_kv::runtime::RuntimeOptions {
    stretto_kv::runtime::RuntimeOptions::new(ctx.threads, ctx.cuda())
}

/// The process's shared copy of decoder `model` with `weights`, as `ctx` runs it, held by `ctx`
/// ([`models`](stretto_core::OpContext::models)) for as long as the context lives.
pub fn decoder(
    ctx: &stretto_core::OpContext,
    model: &str,
    weights: stretto_kv::convert::Weights,
) -> stretto_kv::Result<std::sync::Arc<stretto_kv::Decoder>> {
    let dec = stretto_kv::pool::decoder_with(&ctx.model_home, runtime(ctx), model, weights)?;
    ctx.models.hold(&dec);
    Ok(dec)
}

/// `identity` (what an operator's memoised answers from decoder `model` are kept under) marked with the system prompt
/// the catalog sets for `model` ([`stretto_kv::models::system_prompt`]), where it sets one: answers a model gave
/// under another system prompt (its template's default, before the catalog set one) are then never read as its
/// answers now. Unchanged for a model that keeps its converted default, so their memoised answers stay valid.
/// A user's own model's is marked with its registration too ([`under_registration`]).
pub fn under_model(ctx: &stretto_core::OpContext, identity: String, model: &str) -> stretto_core::Result<String> {
    let identity = match stretto_kv::models::system_prompt(model) {
        Some(text) => format!("{identity}#system:{}", &stretto_core::memo::memo_key("system", text, "")[..12]),
        None => identity,
    };
    under_registration(ctx, identity, model)
}

/// `identity` (what answers from `model`, a decoder or an encoder, are memoised under) marked, for a model the user
/// registered, with its registration ([`stretto_kv::prepare::registration_id`]): another file registered under the
/// same name never reads the answers of the one before. A catalog model's is unchanged.
///
/// A name that is neither in the catalog nor registered has no identity: an operator's factory refuses such a name,
/// so it is met only while the model is being registered again (its old registration is withdrawn first), and its
/// answers must then be neither read nor kept under the bare name, which no registration owns.
pub fn under_registration(
    ctx: &stretto_core::OpContext,
    identity: String,
    model: &str,
) -> stretto_core::Result<String> {
    if stretto_kv::models::spec(model).is_ok() {
        return Ok(identity);
    }
    match stretto_kv::prepare::registration_id(&ctx.model_home, model) {
        Some(r) => Ok(stretto_kv::prepare::with_registration(identity, Some(&r))),
        None => Err(stretto_core::CoreError::operator(
            identity.split('#').next().unwrap_or(&identity),
            format!(
                "model `{model}` is neither a catalog model nor registered under {} (is it being registered \
                 again?): register it with `--model {model}=PATH` on the command line, `.model(\"{model}\", PATH)` \
                 in a session",
                ctx.model_home.display()
            ),
        )),
    }
}

/// The process's shared copy of sentence encoder `model`, as `ctx` runs it, held by `ctx`.
pub fn embedder(
    ctx: &stretto_core::OpContext,
    model: &str,
) -> stretto_kv::Result<std::sync::Arc<stretto_kv::embed::Embedder>> {
    let enc = stretto_kv::pool::embedder(&ctx.model_home, runtime(ctx), model)?;
    ctx.models.hold(&enc);
    Ok(enc)
}

/// The process's shared copy of the image classifier, as `ctx` runs it, held by `ctx`.
pub fn classifier(ctx: &stretto_core::OpContext) -> stretto_kv::Result<std::sync::Arc<stretto_kv::vision::Classifier>> {
    let c = stretto_kv::pool::classifier(&ctx.model_home, runtime(ctx))?;
    ctx.models.hold(&c);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::under_model;

    #[test]
    fn answers_of_a_model_whose_catalog_sets_a_system_prompt_are_kept_under_it() {
        let ctx = stretto_core::OpContext::new("/nonexistent/stretto-home");
        let under_system_prompt = |id: String, model: &str| under_model(&ctx, id, model).unwrap();
        // SmolLM2 keeps its template's prompt: its identities, and the answers memoised under them, are unchanged.
        assert_eq!(under_system_prompt("llm:smollm2-135m".into(), "smollm2-135m"), "llm:smollm2-135m");
        // The 1.5B's answers under the catalog's prompt are not those it gave under Qwen's default.
        let id = under_system_prompt("llm:qwen2.5-coder-1.5b".into(), "qwen2.5-coder-1.5b");
        let mark = id.strip_prefix("llm:qwen2.5-coder-1.5b#system:").unwrap_or_else(|| panic!("{id}"));
        assert_eq!(mark.len(), 12);
        assert!(mark.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }

    #[test]
    fn a_model_neither_in_the_catalog_nor_registered_has_no_identity_for_answers() {
        // (As while its name is registered again: the old registration is withdrawn first.) Its answers were kept
        // under the bare name before, where any later window would have read them as its own.
        let ctx = stretto_core::OpContext::new("/nonexistent/stretto-home");
        let e = under_model(&ctx, "llm:mine#yes-no".into(), "mine").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("llm:mine") && text.contains("`mine` is neither") && text.contains("--model mine="),
            "{text}"
        );
        assert!(super::under_registration(&ctx, "embed:mine".into(), "mine").is_err());
        assert!(super::under_registration(&ctx, "minilm".into(), "minilm").is_ok_and(|id| id == "minilm"));
    }
}
