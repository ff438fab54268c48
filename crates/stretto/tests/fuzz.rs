//! Hostile or broken input for every parser a user can feed: each input parses or returns a typed error, never a
//! panic, an unbounded allocation or a hang. Property-based (proptest), bounded so CI stays quick.

use std::io::Write;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

fn cases() -> ProptestConfig {
    ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
    path
}

/// `bytes` with a few positions overwritten and maybe cut short: broken copies of a valid file.
fn mutate(bytes: &[u8], edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for &(at, v) in edits {
        if !b.is_empty() {
            let i = at % b.len();
            b[i] = v;
        }
    }
    if let Some(c) = cut {
        b.truncate(c % (b.len() + 1));
    }
    b
}

fn edits() -> impl Strategy<Value = (Vec<(usize, u8)>, Option<usize>)> {
    (proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), proptest::option::of(any::<usize>()))
}

/// Text made of the characters query syntax cares about.
fn query_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just(".".to_string()),
            Just(" -- ".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just("reviews.reviewtext".to_string()),
            "[a-z ]{0,6}",
            any::<char>().prop_map(|c| c.to_string()),
        ],
        0..16,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn query_strings_and_prompt_references(q in query_text(), raw in ".{0,64}") {
        for s in [&q, &raw] {
            let _ = stretto::engine::parse_query(s);
            let _ = stretto::core::op::parse_references(s);
        }
    }

    #[test]
    fn profile_and_plan_documents((e, cut) in edits()) {
        let dir = tempfile::tempdir().unwrap();
        let profile = serde_json::to_vec(&serde_json::json!({
            "format": "stretto.profile/v1", "query": "q", "population": 4, "tuples": ["0", "1", "2"],
            "logical": [{"name": "f", "kind": "filter"}],
            "physical": [
                {"name": "f/gold", "logical": "f", "cost": 1.0, "scores": [0.9, 0.1, 0.7], "gold": true},
                {"name": "f/cheap", "logical": "f", "cost": 0.1, "scores": [0.8, 0.3, null], "gold": false}
            ]
        })).unwrap();
        let path = write(dir.path(), "profile.json", &mutate(&profile, &e, cut));
        if let Ok(p) = stretto::optim::profile::Profile::read(&path) {
            let _ = stretto::optim::problem::Problem::from_profile(&p);
        }
        let plan = serde_json::to_vec(&serde_json::json!({
            "format": "stretto.plan/v1",
            "stages": [{"physical": "f/cheap", "lower": 0.2, "upper": 0.7}, {"physical": "f/gold", "lower": 0.5}],
        })).unwrap();
        let path = write(dir.path(), "plan.json", &mutate(&plan, &e, cut));
        let _ = stretto::core::format::PlanFile::read(&path);
    }

    #[test]
    fn csv_ndjson_and_parquet_readers(bytes in proptest::collection::vec(any::<u8>(), 0..512), (e, cut) in edits()) {
        let dir = tempfile::tempdir().unwrap();
        let csv = b"id,text,ok\n1,\"a, b\",true\n2,plain,false\n3,\"multi\nline\",\n";
        let json = b"{\"id\": 1, \"text\": \"a\"}\n{\"id\": 2, \"text\": null}\n";
        for (name, valid) in [("t.csv", &csv[..]), ("t.ndjson", &json[..])] {
            for b in [bytes.clone(), mutate(valid, &e, cut)] {
                let path = write(dir.path(), name, &b);
                let _ = stretto::io::read_path(&path);
            }
        }
        // A valid Parquet file, then broken copies of it.
        let batch = stretto::io::read_csv(&write(dir.path(), "v.csv", csv), &Default::default()).unwrap();
        let good = dir.path().join("good.parquet");
        stretto::io::write(&batch, &good, stretto::FileFormat::Parquet).unwrap();
        let valid = std::fs::read(&good).unwrap();
        for b in [bytes.clone(), mutate(&valid, &e, cut)] {
            let _ = stretto::io::read_path(&write(dir.path(), "t.parquet", &b));
        }
    }

    #[test]
    fn gguf_headers((e, cut) in edits(), header in proptest::collection::vec(any::<u8>(), 0..64)) {
        let dir = tempfile::tempdir().unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stretto-models/tests/fixtures/qwen2-tiny/model.gguf");
        let valid = std::fs::read(fixture).unwrap();
        // Edits land in the header and metadata (the first 4 KiB), where lengths and counts live.
        let e: Vec<(usize, u8)> = e.into_iter().map(|(at, v)| (at % 4096, v)).collect();
        let mut spliced = b"GGUF".to_vec();
        spliced.extend_from_slice(&header);
        for b in [mutate(&valid, &e, cut), spliced] {
            let path = write(dir.path(), "m.gguf", &b);
            if let Ok(g) = stretto::models::gguf::Gguf::open(&path) {
                let _ = g.meta("general.architecture");
                let _ = stretto::models::tokenizer::from_gguf(&g);
            }
        }
    }

    #[test]
    fn kv_records(len in prop_oneof![0u64..256, any::<u64>()], tail in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{\"__metadata__\":{\"format\":\"1\"},");
        bytes.extend_from_slice(&tail);
        let _ = stretto::kv::store::decode_record(Path::new("record.safetensors"), &bytes);
        let _ = stretto::kv::store::decode_record(Path::new("record.safetensors"), &tail);
    }

    #[test]
    fn pickled_state_dicts(pickle in proptest::collection::vec(any::<u8>(), 0..256)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.pth");
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        let options: zip::write::SimpleFileOptions = Default::default();
        zip.start_file("archive/data.pkl", options).unwrap();
        // A protocol-2 header and the start of a dict, then anything.
        zip.write_all(&[0x80, 0x02, b'}', b'q', 0]).unwrap();
        zip.write_all(&pickle).unwrap();
        zip.finish().unwrap();
        let _ = stretto::models::torch::read_state_dict(&path);
        let _ = stretto::models::torch::read_state_dict(&write(dir.path(), "raw.pth", &pickle));
    }

    #[test]
    fn image_files(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let dir = tempfile::tempdir().unwrap();
        for name in ["x.png", "x.jpg"] {
            let mut b = match name { "x.png" => b"\x89PNG\r\n\x1a\n".to_vec(), _ => vec![0xff, 0xd8, 0xff] };
            b.extend_from_slice(&bytes);
            let _ = stretto::kv::vision::preprocess(&write(dir.path(), name, &b));
        }
    }
}

/// Every one-byte change of a valid Parquet file, at every position, to a few values: each read is a value or a
/// typed error. (The random cases above once found a corrupt encoding on which the `parquet` crate's RLE decoder
/// asserts; this sweep finds such bytes every time.)
#[test]
fn every_one_byte_change_of_a_parquet_file_reads_or_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let csv = b"id,text,ok\n1,\"a, b\",true\n2,plain,false\n3,\"multi\nline\",\n";
    let batch = stretto::io::read_csv(&write(dir.path(), "v.csv", csv), &Default::default()).unwrap();
    let good = dir.path().join("good.parquet");
    stretto::io::write(&batch, &good, stretto::FileFormat::Parquet).unwrap();
    let valid = std::fs::read(&good).unwrap();
    let (mut read, mut damaged) = (0, 0);
    for at in 0..valid.len() {
        for v in [0x00, 0xff, 0x7f, 0x10] {
            if valid[at] == v {
                continue;
            }
            let path = write(dir.path(), "t.parquet", &mutate(&valid, &[(at, v)], None));
            match stretto::io::read_path(&path) {
                Ok(_) => read += 1,
                Err(e) => {
                    assert!(e.to_string().contains("t.parquet"), "{e}");
                    damaged += 1;
                }
            }
        }
    }
    assert!(read > 0 && damaged > 0, "{read} read, {damaged} refused");
}
