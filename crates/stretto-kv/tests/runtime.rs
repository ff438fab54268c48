//! ONNX Runtime loaded from the pinned wheel runs a graph built in Rust with the Model Editor API.

use ort::editor::{Graph, Model, Node, Opset, ONNX_DOMAIN};
use ort::memory::Allocator;
use ort::value::{Outlet, Shape, SymbolicDimensions, Tensor, TensorElementType, ValueType};
use stretto_core::context::default_home;
use stretto_kv::runtime::{environment, session_builder};

fn outlet(name: &str, dims: &[i64]) -> Outlet {
    Outlet::new(
        name,
        ValueType::Tensor {
            ty: TensorElementType::Float32,
            shape: Shape::new(dims.iter().copied()),
            dimension_symbols: SymbolicDimensions::empty(dims.len()),
        },
    )
}

#[test]
fn matmul_add_graph_matches_rust() -> Result<(), Box<dyn std::error::Error>> {
    let home = default_home();
    // First: load the library from the pinned wheel before any other ort call.
    let env = environment(&home)?;
    let (n, k, m) = (3usize, 4usize, 2usize);
    let w: Vec<f32> = (0..k * m).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..m).map(|i| i as f32 - 0.5).collect();
    let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();

    let mut graph = Graph::new()?;
    graph.set_inputs([outlet("x", &[n as i64, k as i64])])?;
    graph.set_outputs([outlet("y", &[n as i64, m as i64])])?;
    let mut wt = Tensor::<f32>::new(&Allocator::default(), [k as i64, m as i64])?;
    wt.extract_tensor_mut().1.copy_from_slice(&w);
    let mut bt = Tensor::<f32>::new(&Allocator::default(), [m as i64])?;
    bt.extract_tensor_mut().1.copy_from_slice(&b);
    graph.add_initializer("w", wt, false)?;
    graph.add_initializer("b", bt, false)?;
    graph.add_node(Node::new("MatMul", ONNX_DOMAIN, "matmul", ["x", "w"], ["xw"], [])?)?;
    graph.add_node(Node::new("Add", ONNX_DOMAIN, "add", ["xw", "b"], ["y"], [])?)?;
    let mut model = Model::new([Opset::new(ONNX_DOMAIN, 22)?])?;
    model.set_graph(graph)?;
    let mut session = model.into_session(&session_builder(&home, 1)?)?;

    let input = Tensor::<f32>::from_array((Shape::new([n as i64, k as i64]), x.clone()))?;
    let mut outputs = session.run(ort::inputs![input])?;
    let y = outputs.remove("y").ok_or("no output y")?;
    let (_, got) = y.try_extract_tensor::<f32>()?;
    for r in 0..n {
        for c in 0..m {
            let expected: f32 = (0..k).map(|i| x[r * k + i] * w[i * m + c]).sum::<f32>() + b[c];
            assert!((got[r * m + c] - expected).abs() < 1e-5, "({r},{c}): {} vs {expected}", got[r * m + c]);
        }
    }
    // One environment per process: asking again returns the same one.
    assert!(std::ptr::eq(env, environment(&home)?));
    Ok(())
}

#[test]
fn runtime_options_choose_the_provider_per_session_and_key_the_pool() {
    use stretto_kv::runtime::{execution_providers, RuntimeOptions};
    let home = default_home();
    let cpu = RuntimeOptions::new(1, false);
    assert_eq!(execution_providers(cpu).unwrap().len(), 1, "the CPU alone");
    let cuda = RuntimeOptions::new(1, true);
    if cfg!(feature = "cuda") {
        assert_eq!(execution_providers(cuda).unwrap().len(), 2, "CUDA first, then the CPU");
    } else {
        let e = session_builder(&home, cuda).err().expect("CUDA without the feature is refused").to_string();
        assert!(e.contains("--features cuda"), "{e}");
        // A CUDA registry's model never shares a CPU registry's copy: loading it fails rather than reuse one.
        let _cpu = stretto_kv::pool::embedder(&home, cpu, "minilm").unwrap();
        assert!(stretto_kv::pool::embedder(&home, cuda, "minilm").is_err());
    }
    // Same options, same copy; other threads, another copy.
    let a = stretto_kv::pool::embedder(&home, cpu, "minilm").unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &stretto_kv::pool::embedder(&home, 1usize, "minilm").unwrap()));
    assert!(!std::sync::Arc::ptr_eq(&a, &stretto_kv::pool::embedder(&home, 2usize, "minilm").unwrap()));
}
