//! Registry discovery from a separate test binary: this binary only reaches the operator crates through the
//! facade, which is exactly the situation in which rustc would drop an unreferenced plugin crate.

use stretto_core::op::Registry;

fn ctx() -> stretto::OpContext {
    stretto::OpContext::new(std::env::temp_dir().join("stretto-registry-test"))
}

#[test]
fn facade_links_every_plugin_and_its_operators() {
    let registry = stretto::registry_for(&ctx()).expect("all plugins linked");
    for p in stretto::PLUGINS {
        assert!(registry.plugins().contains(p), "{p} missing from {:?}", registry.plugins());
    }
    let kw = registry.get("keyword").expect("keyword operator registered by stretto-ops-text");
    assert_eq!(kw.properties().family, "keyword");
    assert!(registry.factories().any(|f| f.name == "keyword" && f.plugin == "stretto-ops-text"));
}

#[test]
fn missing_plugin_is_named() {
    let registry = Registry::discover(&ctx()).unwrap();
    let err = registry.require_plugins(&["stretto-ops-text", "stretto-ops-audio"]).unwrap_err().to_string();
    assert!(err.contains("stretto-ops-audio") && !err.contains("stretto-ops-text,"), "{err}");
}

#[test]
fn unknown_operator_lists_registered_ones() {
    let registry = stretto::registry_for(&ctx()).unwrap();
    let err = registry.get("gpt-17").unwrap_err().to_string();
    assert!(err.contains("gpt-17") && err.contains("keyword"), "{err}");
    let err = registry.build("keyword", &serde_json::json!({"bogus": 1})).unwrap_err().to_string();
    assert!(err.contains("keyword") && err.contains("bogus"), "{err}");
}

#[test]
fn a_registry_can_keep_only_some_operators() {
    let mut registry = stretto::registry_for(&ctx()).unwrap();
    let compressed = |op: &stretto_core::op::RegisteredOp| op.properties().compression.is_some_and(|r| r > 0.0);
    let before = registry.operators().count();
    assert!(registry.operators().any(|(op, _)| compressed(op)), "the default ladder has compressed rungs");
    registry.retain_operators(|op| !compressed(op));
    assert!(registry.operators().count() < before);
    assert!(registry.operators().all(|(op, _)| !compressed(op)));
    assert!(registry.get("keyword").is_ok(), "the others stay");
    assert!(registry.get("llm:smollm2-135m@expected-attention-0.50").is_err());
}
