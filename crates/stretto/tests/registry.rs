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
