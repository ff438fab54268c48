//! Contrastive questions with the real SmolLM2-135M: the model derives an opposite, and the question built from it
//! tells reviews apart by the answer words' meaning.

use stretto_core::context::default_home;
use stretto_kv::contrast::{derive_opposite, propose_opposite, ContrastQuestion};
use stretto_kv::decoder::{Decoder, Step, Want};

const SUBJECT: &str = "the text above";

#[test]
fn smollm2_derives_an_opposite_and_its_question_separates_sentiment() {
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).unwrap();
    let statement = "the text above is clearly positive";
    let opposite = derive_opposite(&dec, SUBJECT, statement).unwrap().expect("an opposite");
    assert_eq!(opposite, "the text above is clearly negative");
    let q = ContrastQuestion::new(&dec, SUBJECT, statement, &opposite).unwrap().expect("distinct answers");
    assert_eq!(q.question, "Question: is the text above clearly positive or clearly negative?");
    assert_eq!(q.lead, "the text above is clearly");
    assert_eq!((q.yes, q.no), (dec.token_id(" positive").unwrap(), dec.token_id(" negative").unwrap()));
    assert_eq!(q.tokens, dec.encode(&dec.answer_suffix(&q.question, &q.lead)).unwrap());
    // A warm and a scathing review: the warm one leans to the statement, the scathing one to its opposite.
    let score = |review: &str| {
        let (past, _) = dec.prefill(&dec.encode(&dec.item_prefix(review)).unwrap(), false).unwrap();
        let o = dec.run(&[Step { past: Some(&past), tokens: &q.tokens }], Want::default()).unwrap();
        o[0].logits[q.yes as usize] - o[0].logits[q.no as usize]
    };
    let warm = score("A tender, beautifully acted film that stays with you long after the credits roll.");
    let cold = score("Two hours of my life I will never get back; the script is lazy and the jokes fall flat.");
    assert!(warm > cold, "warm {warm} vs scathing {cold}");
}

#[test]
fn a_statement_without_a_copula_becomes_a_choice_and_identical_answers_have_none() {
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).unwrap();
    let q =
        ContrastQuestion::new(&dec, SUBJECT, "the text above praises the cast", "the text above criticises the cast")
            .unwrap()
            .unwrap();
    assert_eq!(
        q.question,
        "Question: which is true: the text above praises the cast, or the text above criticises the cast?"
    );
    assert_eq!(q.lead, "the text above");
    assert_ne!(q.yes, q.no);
    assert_eq!(
        ContrastQuestion::new(&dec, SUBJECT, "the text above is long", "The text above is long.").unwrap(),
        None
    );
}

#[test]
fn a_contrast_protocol_asks_the_derived_question_and_falls_back_to_yes_no_without_an_opposite() {
    use stretto_kv::models::FilterProtocol;
    use stretto_kv::tasks::{filter_prompt, protocol_prompt};
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).unwrap();
    let (contrast, yes_no) = (FilterProtocol::parse("contrast").unwrap(), FilterProtocol::parse("yes-no").unwrap());
    // Its words come from the predicate: the fixed-words prompt refuses it with a usage error, not a panic.
    let e = filter_prompt(&dec, contrast, "the text above is clearly positive").unwrap_err().to_string();
    assert!(e.contains("contrast_prompt"), "{e}");

    let (p, asked) = protocol_prompt(&dec, contrast, SUBJECT, "the text above is clearly positive").unwrap();
    assert_eq!(asked, contrast);
    assert_eq!(p.text, "Question: is the text above clearly positive or clearly negative?\nthe text above is clearly");
    assert_eq!(p.answers, (dec.token_id(" positive").unwrap(), dec.token_id(" negative").unwrap()));
    assert_eq!(
        p.tokens,
        dec.encode(&dec.answer_suffix(
            "Question: is the text above clearly positive or clearly negative?",
            "the text above is clearly"
        ))
        .unwrap()
    );
    // Its text is what those tokens say, chat markers included, for an engine that takes text.
    assert_eq!(
        p.suffix,
        dec.answer_suffix(
            "Question: is the text above clearly positive or clearly negative?",
            "the text above is clearly"
        )
    );

    // SmolLM2 only echoes a few-shot example for this one: the Yes/No question, exactly as that protocol asks it.
    let statement = "the text above praises the acting or the cast";
    let (p, asked) = protocol_prompt(&dec, contrast, SUBJECT, statement).unwrap();
    assert_eq!(asked, yes_no);
    assert_eq!(p, filter_prompt(&dec, yes_no, statement).unwrap());
}

#[test]
fn a_near_synonym_offered_as_an_opposite_is_refused_on_the_way_back() {
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).unwrap();
    let statement = "the text above describes footwear";
    // One way, SmolLM2 offers a synonym; its "opposite" is not footwear again, so there is no contrast.
    let one_way = propose_opposite(&dec, SUBJECT, statement).unwrap().expect("a proposal");
    assert_eq!(one_way, "the text above describes a shoe");
    assert_eq!(derive_opposite(&dec, SUBJECT, statement).unwrap(), None);
}

/// A derived opposite is kept in the memo directory and read back rather than derived again; a torn line is
/// skipped, and without a directory nothing is kept.
#[test]
fn a_derived_opposite_is_kept_and_read_back() {
    use stretto_kv::contrast::{derive_question_kept, OPPOSITES_FILE};
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let memo = dir.path().join("memo");
    let statement = "the text above is clearly positive";
    let q = derive_question_kept(&dec, Some(&memo), SUBJECT, statement).unwrap().expect("an opposite");
    assert_eq!(q.question, "Question: is the text above clearly positive or clearly negative?");
    let path = memo.join(OPPOSITES_FILE);
    let kept = std::fs::read_to_string(&path).unwrap();
    assert_eq!(kept.lines().count(), 1, "{kept}");
    assert!(kept.contains("\"the text above is clearly negative\""), "{kept}");
    // Read back, not derived again: the question follows what the file keeps.
    std::fs::write(&path, kept.replace("clearly negative", "clearly lukewarm")).unwrap();
    let q = derive_question_kept(&dec, Some(&memo), SUBJECT, statement).unwrap().unwrap();
    assert_eq!(q.question, "Question: is the text above clearly positive or clearly lukewarm?");
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1, "nothing added");
    // Without a directory the model derives its own, and nothing is written.
    let q = derive_question_kept(&dec, None, SUBJECT, statement).unwrap().unwrap();
    assert_eq!(q.question, "Question: is the text above clearly positive or clearly negative?");
    // A torn line is skipped; another statement's derivation is added after it, and its absence kept too.
    let mut torn = std::fs::read_to_string(&path).unwrap();
    torn.push_str("{\"model\":\"smollm2-135m\",\"deriv");
    std::fs::write(&path, torn).unwrap();
    let other = "the text above mentions a price";
    let derived = stretto_kv::contrast::derive_opposite(&dec, SUBJECT, other).unwrap();
    let kept = derive_question_kept(&dec, Some(&memo), SUBJECT, other).unwrap();
    assert_eq!(kept.is_some(), derived.is_some());
    let lines: Vec<String> = std::fs::read_to_string(&path).unwrap().lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[2].contains(&format!("\"opposite\":{}", serde_json::to_string(&derived).unwrap())), "{lines:?}");
    assert_eq!(derive_question_kept(&dec, Some(&memo), SUBJECT, other).unwrap(), kept);
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3, "read back, nothing added");
}

/// A join's side projection keeps what it derived (the property's two values, then their opposite) in the same
/// file, and a later call reads both back rather than generating again; without a directory nothing is kept.
#[test]
fn a_property_question_keeps_its_values_and_opposite_and_reads_them_back() {
    use stretto_kv::contrast::{property_question, property_question_kept, OPPOSITES_FILE};
    let dec = Decoder::load(&default_home(), "smollm2-135m", 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let memo = dir.path().join("memo");
    let derived = property_question(&dec, SUBJECT, "sentiment").unwrap().expect("two values");
    assert!(!memo.exists(), "property_question keeps nothing");
    let q = property_question_kept(&dec, Some(&memo), SUBJECT, "sentiment").unwrap();
    assert_eq!(q.as_ref(), Some(&derived));
    let path = memo.join(OPPOSITES_FILE);
    let kept = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = kept.lines().collect();
    assert_eq!(lines.len(), 2, "the values, then their opposite: {kept}");
    assert!(lines[0].contains("\"values\":[\"positive\",\"negative\"]"), "{kept}");
    assert!(lines[1].contains("\"opposite\":\"the sentiment of the text above is negative\""), "{kept}");
    // Read back, not derived again: the question follows what the file keeps (the kept opposite must still be the
    // second value, so both are changed alike).
    std::fs::write(&path, kept.replace("negative", "lukewarm")).unwrap();
    let q = property_question_kept(&dec, Some(&memo), SUBJECT, "sentiment").unwrap().expect("kept values");
    assert_eq!(q.question, "Question: is the sentiment of the text above positive or lukewarm?");
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2, "nothing added");
    // A property the file keeps no values for: derived, and its values line added.
    let colour = property_question(&dec, SUBJECT, "colour").unwrap();
    assert_eq!(property_question_kept(&dec, Some(&memo), SUBJECT, "colour").unwrap(), colour);
    assert!(std::fs::read_to_string(&path).unwrap().lines().count() >= 3);
}
