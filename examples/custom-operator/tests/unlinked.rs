//! A binary that depends on the plugin crate but never names it: rustc leaves the crate out, and the registry's
//! self-check says which plugin is missing instead of silently offering fewer operators.

#[test]
fn a_binary_that_forgets_to_link_the_plugin_gets_an_error_naming_it() {
    let home = tempfile::tempdir().unwrap();
    let session = stretto::Session::builder(home.path()).memo_off().build().unwrap();
    let registry = session.registry();
    assert!(registry.get("lexicon").is_err(), "the operator of an unlinked crate must not be there");
    let e = registry.require_plugins(&["stretto-example-custom-operator"]).unwrap_err().to_string();
    assert!(e.contains("stretto-example-custom-operator"), "{e}");
}
