"""Kernel probe for the W8A8 note: one linear layer of Qwen2.5-0.5B's shapes, x [8, 30, K] (a batch of question
passes), 1 thread: f32 MatMul, MatMulNBits (8 and 4 bits, block 32/128, with and without zero points, accuracy
level 4 and 0) and DynamicQuantizeLinear + MatMulIntegerToFloat; ms per call and mean relative error."""
import numpy as np, onnx, onnxruntime as ort, time
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng=np.random.default_rng(0)
def sess(graph):
    m=h.make_model(graph, opset_imports=[h.make_opsetid("",17),h.make_opsetid("com.microsoft",1)])
    m.ir_version=9
    o=ort.SessionOptions(); o.intra_op_num_threads=1; o.inter_op_num_threads=1
    o.graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])
def bench(s, x, n=20):
    s.run(None,{"x":x}); t=time.perf_counter()
    for _ in range(n): s.run(None,{"x":x})
    return (time.perf_counter()-t)/n*1e3
def nbits(W, bits, block, zp, acc):
    N,K=W.shape; nb=K//block
    Wb=W.reshape(N,nb,block)
    if zp:
        mn=np.minimum(Wb.min(-1),0); mx=np.maximum(Wb.max(-1),0)
        qmax=2**bits-1; sc=(mx-mn)/qmax; sc[sc==0]=1
        z=np.clip(np.round(-mn/sc),0,qmax).astype(np.uint8)
        q=np.clip(np.round(Wb/sc[...,None])+z[...,None],0,qmax).astype(np.uint8)
    else:
        half=2**(bits-1); sc=np.abs(Wb).max(-1)/(half-1); sc[sc==0]=1
        q=(np.clip(np.round(Wb/sc[...,None]),-half,half-1)+half).astype(np.uint8); z=None
    if bits==4:
        qp=(q[...,0::2] | (q[...,1::2]<<4)).astype(np.uint8)
    else: qp=q
    inits=[nh.from_array(qp,"B"),nh.from_array(sc.reshape(-1).astype(np.float32),"S")]
    ins=["x","B","S"]
    if zp:
        if bits==4:
            zz=z if nb%2==0 else np.concatenate([z,np.zeros((N,1),np.uint8)],1)
            zz=(zz[:,0::2]|(zz[:,1::2]<<4)).astype(np.uint8)
        else: zz=z
        inits.append(nh.from_array(zz.reshape(-1),"Z")); ins.append("Z")
    node=h.make_node("MatMulNBits",ins,["y"],domain="com.microsoft",K=K,N=N,bits=bits,block_size=block,accuracy_level=acc)
    return h.make_graph([node],"g",[h.make_tensor_value_info("x",T.FLOAT,[None,None,K])],[h.make_tensor_value_info("y",T.FLOAT,None)],inits)
def f32(W):
    node=h.make_node("MatMul",["x","W"],["y"])
    return h.make_graph([node],"g",[h.make_tensor_value_info("x",T.FLOAT,[None,None,W.shape[1]])],[h.make_tensor_value_info("y",T.FLOAT,None)],[nh.from_array(W.T.copy(),"W")])
def dyn(W):
    # per-channel symmetric int8 weights; dynamic uint8 activations
    sc=np.abs(W).max(1)/127; q=np.round(W/sc[:,None]).astype(np.int8)
    nodes=[h.make_node("DynamicQuantizeLinear",["x"],["xq","xs","xz"]),
           h.make_node("MatMulIntegerToFloat",["xq","W","xs","S","xz"],["y"],domain="com.microsoft")]
    return h.make_graph(nodes,"g",[h.make_tensor_value_info("x",T.FLOAT,[None,None,W.shape[1]])],[h.make_tensor_value_info("y",T.FLOAT,None)],[nh.from_array(q.T.copy(),"W"),nh.from_array(sc.astype(np.float32),"S")])
for (N,K) in [(4864,896),(896,4864),(896,896)]:
    W=(rng.standard_normal((N,K))*0.02).astype(np.float32)
    x=rng.standard_normal((8,30,K)).astype(np.float32)
    ref=x@W.T
    res={}
    for name,g in [("f32",f32(W)),("q8b128",nbits(W,8,128,False,4)),("q8b32",nbits(W,8,32,False,4)),("q4b32",nbits(W,4,32,False,4)),("q4b32zp",nbits(W,4,32,True,4)),("q4b128",nbits(W,4,128,False,4)),("q4b32acc0",nbits(W,4,32,False,0)),("dyn8",dyn(W))]:
        try:
            s=sess(g); y=s.run(None,{"x":x})[0]; err=np.abs(y-ref).mean()/np.abs(ref).mean()
            res[name]=(bench(s,x),err)
        except Exception as e: res[name]=str(e)[:80]
    print(N,K,{k:(f"{v[0]:.2f}ms",f"{v[1]:.3f}") if isinstance(v,tuple) else v for k,v in res.items()})

# The same with outlier channels in the activations (every 97th ×20), at three batch shapes; dynamic int8 with
# int8 weights (s8), 7-bit weights (s7, no u8×s8 saturation) and uint8 weights (u8).
def dynv(W, mode):
    if mode=="s8": sc=np.abs(W).max(1)/127; q=np.round(W/sc[:,None]).astype(np.int8); zp=None
    elif mode=="s7": sc=np.abs(W).max(1)/63; q=np.round(W/sc[:,None]).astype(np.int8); zp=None
    else: sc=np.abs(W).max(1)/127; q=(np.round(W/sc[:,None])+128).astype(np.uint8); zp=np.full(W.shape[0],128,np.uint8)
    ins=["xq","W","xs","S","xz"]+(["Z"] if zp is not None else [])
    inits=[nh.from_array(q.T.copy(),"W"),nh.from_array(sc.astype(np.float32),"S")]+([nh.from_array(zp,"Z")] if zp is not None else [])
    nodes=[h.make_node("DynamicQuantizeLinear",["x"],["xq","xs","xz"]),
           h.make_node("MatMulIntegerToFloat",ins,["y"],domain="com.microsoft")]
    return h.make_graph(nodes,"g",[h.make_tensor_value_info("x",T.FLOAT,[None,None,W.shape[1]])],[h.make_tensor_value_info("y",T.FLOAT,None)],inits)
for (N,K) in [(4864,896),(896,896)]:
  W=(rng.standard_normal((N,K))*0.02).astype(np.float32)
  # outlier activations like real LLMs
  for (b,sl) in [(8,30),(8,12),(1,20)]:
    x=rng.standard_normal((b,sl,K)).astype(np.float32); x[...,::97]*=20
    ref=x@W.T; res={}
    for name,g in [("f32",f32(W)),("q8b128",nbits(W,8,128,False,4)),("s8",dynv(W,"s8")),("s7",dynv(W,"s7")),("u8",dynv(W,"u8"))]:
        s=sess(g); y=s.run(None,{"x":x})[0]; err=np.abs(y-ref).mean()/np.abs(ref).mean()
        res[name]=f"{bench(s,x):.2f}ms/{err:.3f}"
    print('outliers',N,K,b,sl,res)
