"""W8A8 probe (#21): can ONNX Runtime's dynamic int8 GEMM (DynamicQuantizeLinear + MatMulIntegerToFloat, int8
per-output-channel weights, uint8 activations with one scale per tensor) make a faster rung than the f32 decoder
without moving its answers?

Usage: python probe.py MODEL MODE DATASET N   (MODEL a catalog folder under ~/.cache/stretto/models with onnx/,
e.g. qwen2.5-coder-0.5b; DATASET movie|rotowire; N sampled items, seed 42)
MODE: s8 every linear layer; s8-nbdown the same but ffn_down as 8-bit MatMulNBits (block 128); nball every linear layer as 8-bit MatMulNBits (the catalog's int8 rung); -nbhead also the LM head; s8-nbrest:L1,... dynamic int8 on those layers, MatMulNBits on the rest; s8:ffn_gate,ffn_up,... only those; s8-nohead lm_head kept f32; r8 one activation
scale per token (MatMulInteger + Cast + Mul); s8-rdown per token on ffn_down only; s8-sm SmoothQuant (alpha
$ALPHA, default 0.5) calibrated on the last 12 reviews of the movie data.
Prints ms per item of the question pass (batch 8, left-padded pasts, 1 thread) for f32 and the quantized graph, the
share of decisions that agree (at f32's median, at 0, and each at its own median), the mean log-odds change and the
rank correlation of the Yes/No log-odds. Needs: pip install onnxruntime==1.31.1 onnx tokenizers numpy.
"""
import numpy as np, onnx, onnxruntime as ort, time, sys, csv, os, json
from onnx import helper as h, numpy_helper as nh, TensorProto as T
from tokenizers import Tokenizer
DATA=os.path.join(os.path.dirname(os.path.abspath(__file__)),'../../../../data')
WORK=os.environ.get('W8A8_DIR','/tmp/stretto-w8a8')
model=sys.argv[1]; mode=sys.argv[2]  # mode: s8 / s7
src=os.path.expanduser(f"~/.cache/stretto/models/{model}/onnx")
dst=f"{WORK}/{model}-{mode}"
def calib_stats():
    m=onnx.load(src+"/decoder.onnx")
    inits={i.name for i in m.graph.initializer}
    xs=sorted({n.input[0] for n in m.graph.node if n.op_type=="MatMul" and len(n.input)>1 and n.input[1] in inits})
    for x in xs: m.graph.output.append(h.make_tensor_value_info(x,T.FLOAT,None))
    o=ort.SessionOptions(); o.intra_op_num_threads=2
    cd=f"{WORK}/calib-{model}"; os.makedirs(cd,exist_ok=True)
    onnx.save(m,cd+"/decoder.onnx",save_as_external_data=True,location="decoder.onnx.data")
    s=ort.InferenceSession(cd+"/decoder.onnx",o,providers=["CPUExecutionProvider"])
    tk=Tokenizer.from_file(src+"/tokenizer.json"); cfg=json.load(open(src+"/config.json"))
    rows=list(csv.DictReader(open(DATA+"/movie/reviews_1000.csv")))
    amax={}
    for r in rows[-12:]:
        ids=tk.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"+r["reviewtext"]+"\nAnswer the question about the text above with Yes or No.\nQuestion: is it true that the review is clearly positive?<|im_end|>\n<|im_start|>assistant\nAnswer:",add_special_tokens=False).ids
        n=len(ids); feed={"input_ids":np.array([ids],np.int64),"attention_mask":np.ones((1,n),np.int64),"position_ids":np.arange(n)[None]}
        for i in range(cfg["layers"]):
            for w in ("key","value"): feed[f"past_key_values.{i}.{w}"]=np.zeros((1,cfg["kv_heads"],0,cfg["head_dim"]),np.float32)
        out=s.run(xs,feed)
        for x,v in zip(xs,out):
            a=np.abs(v).reshape(-1,v.shape[-1]).max(0); amax[x]=np.maximum(amax.get(x,0),a)
    return amax
if not os.path.exists(dst+"/decoder.onnx"):
    AM=calib_stats() if "sm" in mode else {}
    WM={}  # per input: the largest |weight| of each input channel over the layers that read it
    os.makedirs(dst,exist_ok=True)
    m=onnx.load(src+"/decoder.onnx")
    inits={i.name:i for i in m.graph.initializer}
    new=[]; drop=set(); add=[]; seen=set()
    for n in m.graph.node:
        if n.op_type=="MatMul" and len(n.input)>1 and n.input[1] in inits:
            wm=np.abs(nh.to_array(inits[n.input[1]])).max(1); WM[n.input[0]]=np.maximum(WM.get(n.input[0],0),wm)
    for n in m.graph.node:
        b1=n.input[1] if len(n.input)>1 else ""
        skip=("nohead" in mode and (b1.startswith("lm_head") or b1.startswith("output.weight"))) or ("nodown" in mode and "ffn_down" in b1) or (":" in mode and not any(("."+w+".") in b1 for w in mode.split(":")[1].split(",")))
        if ("nball" in mode or ("nbrest" in mode and skip) or ("nbdown" in mode and "ffn_down" in b1) or ("nbhead" in mode and (b1.startswith("lm_head") or b1.startswith("output.weight")))) and n.op_type=="MatMul" and b1 in inits and len(inits[b1].dims)==2:
            # ffn_down as 8-bit MatMulNBits (block 128, symmetric, int8 compute): blockwise activation scales keep
            # the SwiGLU outlier channels that one scale per tensor loses.
            W=nh.to_array(inits[b1]).T.copy(); N,K=W.shape; nb=K//128; Wb=W.reshape(N,nb,128)
            sc=np.abs(Wb).max(-1)/127; sc[sc==0]=1
            q=(np.clip(np.round(Wb/sc[...,None]),-128,127)+128).astype(np.uint8)
            drop.add(b1); add+=[nh.from_array(q,b1+"_nq"),nh.from_array(sc.reshape(-1).astype(np.float32),b1+"_ns")]
            new.append(h.make_node("MatMulNBits",[n.input[0],b1+"_nq",b1+"_ns"],list(n.output),domain="com.microsoft",K=K,N=N,bits=8,block_size=128,accuracy_level=4))
            continue
        if n.op_type=="MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims)==2 and not skip:
            W=nh.to_array(inits[n.input[1]])  # [K][N]
            x0=n.input[0]
            if "sm" in mode and x0 in AM:
                alpha=float(os.environ.get("ALPHA","0.5")); wmax=WM[x0]; sm=np.maximum(AM[x0],1e-5)**alpha/np.maximum(wmax,1e-5)**(1-alpha)
                W=W*sm[:,None]
                if x0+"_sm" not in seen:
                    seen.add(x0+"_sm"); add.append(nh.from_array((1/sm).astype(np.float32),x0+"_ism"))
                    new.append(h.make_node("Mul",[x0,x0+"_ism"],[x0+"_smx"]))
                n.input[0]=x0+"_smx"
            qmax=63 if mode.startswith("s7") else 127
            sc=np.abs(W).max(0)/qmax; sc[sc==0]=1
            q=np.clip(np.round(W/sc[None,:]),-qmax,qmax).astype(np.int8)
            b=n.input[1]; drop.add(b)
            add+= [nh.from_array(q,b+"_q"), nh.from_array(sc.astype(np.float32),b+"_s")]
            x=n.input[0]
            rowwise = mode.startswith("r8") or "smr" in mode or ("rdown" in mode and "ffn_down" in b)
            if rowwise:
                if x+"_rq" not in seen:
                    seen.add(x+"_rq")
                    new+= [h.make_node("Abs",[x],[x+"_abs"]), h.make_node("ReduceMax",[x+"_abs"],[x+"_amax"],keepdims=1,axes=[-1]),
                           h.make_node("Max",[x+"_amax","EPS"],[x+"_am2"]), h.make_node("Div",[x+"_am2","C127"],[x+"_rs"]),
                           h.make_node("Div",[x,x+"_rs"],[x+"_xs"]), h.make_node("Round",[x+"_xs"],[x+"_xr"]),
                           h.make_node("Add",[x+"_xr","C128"],[x+"_xo"]), h.make_node("Cast",[x+"_xo"],[x+"_rq"],to=T.UINT8)]
                new+= [h.make_node("MatMulInteger",[x+"_rq",b+"_q","ZP128"],[n.name+"_i32"]), h.make_node("Cast",[n.name+"_i32"],[n.name+"_f"],to=T.FLOAT),
                       h.make_node("Mul",[n.name+"_f",x+"_rs"],[n.name+"_f2"]), h.make_node("Mul",[n.name+"_f2",b+"_s"],list(n.output))]
            else:
              if x not in seen:
                seen.add(x); new.append(h.make_node("DynamicQuantizeLinear",[x],[x+"_dq",x+"_ds",x+"_dz"],name=n.name+"_dql"))
              new.append(h.make_node("MatMulIntegerToFloat",[x+"_dq",b+"_q",x+"_ds",b+"_s",x+"_dz"],list(n.output),domain="com.microsoft",name=n.name+"_mm"))
        else: new.append(n)
    add+=[nh.from_array(np.array([-1],np.int64),"AX_LAST"),nh.from_array(np.array(1e-8,np.float32),"EPS"),nh.from_array(np.array(127,np.float32),"C127"),nh.from_array(np.array(128,np.float32),"C128"),nh.from_array(np.array(128,np.uint8),"ZP128")]
    keep=[i for i in m.graph.initializer if i.name not in drop]+add
    del m.graph.node[:]; m.graph.node.extend(new)
    del m.graph.initializer[:]; m.graph.initializer.extend(keep)
    if not any(o.domain=="com.microsoft" for o in m.opset_import): m.opset_import.append(h.make_opsetid("com.microsoft",1))
    onnx.save(m,dst+"/decoder.onnx",save_as_external_data=True,location="decoder.onnx.data")
def sess(p):
    o=ort.SessionOptions(); o.intra_op_num_threads=1; o.inter_op_num_threads=1
    return ort.InferenceSession(p+"/decoder.onnx",o,providers=["CPUExecutionProvider"])
ref=sess(src); qs=sess(dst)
cfg=json.load(open(src+"/config.json")); print(cfg)
tok=Tokenizer.from_file(src+"/tokenizer.json")
L=[i.name for i in ref.get_inputs() if i.name.startswith("past_key_values")]
nl=len(L)//2
pk=ref.get_inputs()[3].shape; kvh,hd=pk[1],pk[3]
ds=sys.argv[3]
if ds=="movie":
    rows=list(csv.DictReader(open(DATA+"/movie/reviews_1000.csv")))
    texts=[r["reviewtext"] for r in rows]; pred="the review is clearly positive"
else:
    rows=list(csv.DictReader(open(DATA+"/rotowire/reports.csv")))
    k=[c for c in rows[0] if "report" in c.lower() or "text" in c.lower()][0]; texts=[r[k] for r in rows]; pred="the report says the home team won"
rng=np.random.default_rng(42); idx=rng.choice(len(texts),int(sys.argv[4]),replace=False)
sysmsg="You are a helpful assistant."
q=f"\nAnswer the question about the text above with Yes or No.\nQuestion: is it true that {pred}?<|im_end|>\n<|im_start|>assistant\nAnswer:"
qids=tok.encode(q,add_special_tokens=False).ids
yes=tok.encode(" Yes",add_special_tokens=False).ids[0]; no=tok.encode(" No",add_special_tokens=False).ids[0]
def run(s,ids,mask,pos,past):
    feed={"input_ids":ids,"attention_mask":mask,"position_ids":pos}
    for i in range(nl): feed[f"past_key_values.{i}.key"]=past[2*i]; feed[f"past_key_values.{i}.value"]=past[2*i+1]
    return s.run(None,feed)
outs=[o.name for o in ref.get_outputs()]
pasts=[]
for j in idx:
    ids=tok.encode(f"<|im_start|>system\n{sysmsg}<|im_end|>\n<|im_start|>user\n{texts[j]}",add_special_tokens=False).ids[:1500]
    n=len(ids); e=np.zeros((1,kvh,0,hd),np.float32)
    r=run(ref,np.array([ids],np.int64),np.ones((1,n),np.int64),np.arange(n)[None],[e]*(2*nl))
    pres=[r[outs.index(f"present.{i}.{w}")] for i in range(nl) for w in ("key","value")]
    pasts.append(pres)
def batch_pass(s,group):
    P=max(p[0].shape[2] for p in group); B=len(group); S=len(qids)
    past=[np.zeros((B,kvh,P,hd),np.float32) for _ in range(2*nl)]; mask=np.zeros((B,P+S),np.int64); pos=np.zeros((B,S),np.int64)
    for b,p in enumerate(group):
        n=p[0].shape[2]
        for t in range(2*nl): past[t][b,:,P-n:]=p[t][0]
        mask[b,P-n:]=1; pos[b]=n+np.arange(S)
    r=s.run(["logits"],{**{"input_ids":np.array([qids]*B,np.int64),"attention_mask":mask,"position_ids":pos},**{f"past_key_values.{i}.{w}":past[2*i+(w=="value")] for i in range(nl) for w in ("key","value")}})[0]
    return r[:,yes]-r[:,no]
res={}
for name,s in [("f32",ref),("q",qs),("f32b",ref),("qb",qs)]:
    lo=[]; t=time.perf_counter()
    for g in range(0,len(pasts),8): lo+=list(batch_pass(s,pasts[g:g+8]))
    res[name]=(np.array(lo),(time.perf_counter()-t)/len(pasts)*1e3)
a,b=res["f32b"][0],res["qb"][0]
print(model,mode,ds,f"f32 {res['f32b'][1]:.1f}ms q {res['qb'][1]:.1f}ms speedup {res['f32b'][1]/res['qb'][1]:.2f} agree {np.mean((a>np.median(a))==(b>np.median(a))):.3f} agree0 {np.mean((a>0)==(b>0)):.3f} mad {np.abs(a-b).mean():.3f} std {a.std():.3f} shift {(b-a).mean():.3f} ownmed {np.mean((a>np.median(a))==(b>np.median(b))):.3f} rankcorr {np.corrcoef(np.argsort(np.argsort(a)),np.argsort(np.argsort(b)))[0,1]:.3f}")
