"""Part `nvtx`: the ranges of `learn.annotate(nvtx=True)`, checked in a `torch.profiler` trace and at the NVTX calls.

A small conv net is trained for one epoch under `torch.profiler` (CPU and CUDA activities), annotated, and profiled by
fastprofile with `timing='events'` at the same time. Counted per range name (`fastai.train`, `fastai.draw`, ...): the
`user_annotation` spans in the trace (the `record_function` ranges), their GPU projections (`gpu_user_annotation`),
and the `torch.cuda.nvtx.range_push` calls, each against the count that the batches imply. `torch.profiler` does not
record NVTX itself (Kineto has no NVTX marker activity), so the NVTX side is checked at the calls: every push is
matched by a pop, with the right names; an NVTX tool such as Nsight Systems would show these ranges."""
from __future__ import annotations
import json, os, tempfile
from collections import Counter
from .common import Deadline, Results, log, merged, quiet_fit, free

DEFAULTS = dict(device='cuda', batches=12, valid=3, bs=32, size=32)

def expected_counts(n_train:int, n_valid:int) -> dict:
    "How often each range opens in one epoch of `n_train` training and `n_valid` validation batches"
    return {'fastai.train':1, 'fastai.valid':1, 'fastai.draw':n_train + n_valid, 'fastai.batch':n_train + n_valid,
            'fastai.forward':n_train, 'fastai.predict':n_valid, 'fastai.loss':n_train + n_valid,
            'fastai.backward':n_train, 'fastai.opt_step':n_train, 'fastai.zero_grad':n_train}

def trace_counts(path) -> tuple:
    "Counts of `fastai.*` spans in a Chrome trace from `torch.profiler`: (host ranges, GPU projections)"
    evs = json.loads(open(path).read())['traceEvents']
    cpu,gpu = Counter(),Counter()
    for e in evs:
        name = e.get('name', '')
        if e.get('ph') != 'X' or not name.startswith('fastai.'): continue
        if e.get('cat') == 'user_annotation': cpu[name] += 1
        elif e.get('cat') == 'gpu_user_annotation': gpu[name] += 1
    return dict(cpu),dict(gpu)

def run(cfg:dict, res:Results, deadline:Deadline):
    "The `nvtx` part"
    import torch, torch.cuda.nvtx as nvtx
    from torch.profiler import profile, ProfilerActivity
    import fastprofile.learner, fastprofile.analysis.trace  # noqa: F401 (Learner.profile, Learner.annotate)
    from .data import image_pool, image_tfms, pool_dls, conv_net, learner
    cfg = merged(DEFAULTS, cfg)
    device = cfg['device']
    on_gpu = torch.device(device).type == 'cuda'
    res['config'] = cfg
    n,v = cfg['batches'],cfg['valid']
    dls = pool_dls(image_pool(2, cfg['bs'], cfg['size'], pin=on_gpu), n, pin=on_gpu, after_batch=image_tfms(),
                   device=device, n_valid=v)
    learn = learner(dls, conv_net(16, 1).to(device))
    learn.annotate(nvtx=True)
    res['nvtx_on'] = bool(learn.record_function.nvtx)
    learn.profile(timing='events', show_report=False, logger_callback=None)
    pushes,pops,depths = [],[0],[]
    real_push,real_pop = nvtx.range_push,nvtx.range_pop
    def push(msg):
        pushes.append(msg); d = real_push(msg); depths.append(d); return d
    def pop(): pops[0] += 1; return real_pop()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    fd,path = tempfile.mkstemp(suffix='.json'); os.close(fd)
    nvtx.range_push,nvtx.range_pop = push,pop
    try:
        with profile(activities=activities) as prof: quiet_fit(learn)
        prof.export_chrome_trace(path)
    finally: nvtx.range_push,nvtx.range_pop = real_push,real_pop
    try: cpu,gpu = trace_counts(path)
    finally: os.unlink(path)
    want = expected_counts(n, v)
    ranges = {k:dict(expected=c, torch_profiler=cpu.get(k, 0), gpu=gpu.get(k, 0), nvtx=pushes.count(k)) for k,c in want.items()}
    res['ranges'] = ranges
    res['unexpected'] = sorted(set(cpu) - set(want))
    res['nvtx'] = dict(pushes=len(pushes), pops=pops[0], max_depth=max(depths, default=None), depths_seen=sorted(set(depths))[:8])
    res['gpu_activity'] = on_gpu
    r = learn.simple_profile_results
    res['fastprofile_gpu_columns'] = bool('GPU Mean Duration' in r and r['GPU Mean Duration'].notna().any())
    res['checks'] = dict(
        torch_profiler=all(x['torch_profiler'] == x['expected'] for x in ranges.values()),
        nvtx_calls=all(x['nvtx'] == x['expected'] for x in ranges.values()) and len(pushes) == pops[0],
        gpu_projection=(all(ranges[k]['gpu'] > 0 for k in ('fastai.forward','fastai.backward','fastai.opt_step')) if on_gpu else None),
        profiled_together=res['fastprofile_gpu_columns'])
    log(f"checks: {res['checks']}", 'nvtx')
    del learn; free(device)
