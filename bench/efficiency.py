"""What fastprofile's efficiency measurements cost, and its FLOP counts beside Lightning's `measure_flops`.

    python -m bench.efficiency [--reps 30] [--trials 5]

CPU sections (always):
1. the FLOP counter's one-time set-up per process (`prepare_flop_counter`, at `learn.profile()`), in fresh processes;
2. the cost of counting one batch (forward + loss + backward under `FlopCount`, against the same step uncounted,
   interleaved), per model: this is what lands in the warm-up batch, once per fit;
3. in a profiled fit (tiny MLP): the `warmup` row and the per-batch `batch` row with `efficiency=True` and `False`,
   trials interleaved in one process: the counting shows in `warmup` only;
4. the idle callback's per-batch cost (its events through fastai's dispatch, as `pair_overhead` times the pair);
5. resident-memory reads (µs per call; a call reads them at its start, at each phase end and at its end).
GPU sections (only where CUDA is available): the CUDA peak-memory reads (µs per call and per sampled batch), and a
side-by-side of fastprofile's FLOPs/MFU with Lightning's `measure_flops` + `Throughput` on the same model.
Lightning is optional (`pip install --no-deps --target /tmp/ltf lightning-fabric lightning-utilities`, then
`PYTHONPATH=/tmp/ltf`): without it its columns say so. Tables go to stdout, progress to stderr.
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, time, types
from pathlib import Path
import torch
from torch import nn
from .common import machine_info, machine_md, md_table, fmt, median, iqr, quiet, ROOT

log = lambda s: print(s, file=sys.stderr, flush=True)

def lightning_throughput():
    "Lightning's `measure_flops`, `Throughput`, `get_available_flops` (from lightning_fabric or lightning.fabric), or None"
    for mod in ('lightning_fabric.utilities.throughput', 'lightning.fabric.utilities.throughput'):
        try:
            m = __import__(mod, fromlist=['measure_flops'])
            return types.SimpleNamespace(measure_flops=m.measure_flops, Throughput=m.Throughput,
                                         get_available_flops=m.get_available_flops, source=mod.split('.')[0])
        except Exception: continue
    return None

# ---------------------------------------------------------------- models

def models(device='cpu'):
    "(name, model, input batch, target batch): a tiny MLP (the profiler's worst case), a wider MLP, a small CNN"
    g = torch.Generator().manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    out = [('MLP 16-32-1, bs 64', nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)), torch.randn(64, 16, generator=g), 1),
           ('MLP 512-1024-1024-10, bs 256', nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                                         nn.Linear(1024, 10)), torch.randn(256, 512, generator=g), 10),
           ('CNN 3x32x32 (3 conv), bs 64', cnn, torch.randn(64, 3, 32, 32, generator=g), 10)]
    return [(n, m.to(device), x.to(device), torch.randn(len(x), k, generator=g).to(device)) for n,m,x,k in out]

def count_ops(fn) -> int:
    "Operations that reach a dispatch mode while `fn` runs (what the counter sees, one Python call each)"
    from torch.utils._python_dispatch import TorchDispatchMode
    class Count(TorchDispatchMode):
        n = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))
    with Count(): fn()
    return Count.n

# ---------------------------------------------------------------- 1. set-up per process

def setup_cost(runs:int=3) -> list:
    "Seconds of `prepare_flop_counter()` in fresh processes (torch, fastai and fastprofile already imported)"
    code = ("import time, torch, fastai.basics, fastprofile.probes.efficiency.flops as e; t=time.perf_counter(); e.prepare_flop_counter(); "
            "print(time.perf_counter()-t)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ['PYTHONPATH']] if os.environ.get('PYTHONPATH') else [])))
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        out.append(float(r.stdout.strip().splitlines()[-1]))
    return out

# ---------------------------------------------------------------- 2. counting one batch

def counted_batch_cost(reps:int, device='cpu') -> list:
    "Per model: ms of a training step uncounted and counted (medians, interleaved), ops, FLOPs per sample, Lightning's count"
    from fastprofile.probes.efficiency.flops import FlopCount, prepare_flop_counter
    prepare_flop_counter()
    sync = torch.cuda.synchronize if device != 'cpu' else (lambda: None)
    clock = time.perf_counter if device != 'cpu' else time.process_time
    lt,rows = lightning_throughput(),[]
    for name,model,x,y in models(device):
        loss_fn = nn.MSELoss()
        def step():
            loss = loss_fn(model(x), y); loss.backward(); model.zero_grad(set_to_none=True)
        def counted():
            with FlopCount() as fc:
                out = model(x); f = fc.total
                loss = loss_fn(out, y); b0 = fc.total; loss.backward(); b = fc.total - b0
            model.zero_grad(set_to_none=True)
            return f,b
        for _ in range(3): step(); counted()
        plain,cnt,diff = [],[],[]
        for _ in range(reps):  # pairs, each way round in turn; CPU time of this process (what it costs, not what others cost it)
            t = {}
            for f in ((step, counted) if len(plain) % 2 else (counted, step)):
                sync(); t0 = clock(); r = f(); sync(); t[f] = clock() - t0
                if f is counted: fwd,bwd = r
            plain.append(t[step]); cnt.append(t[counted]); diff.append(t[counted] - t[step])
        ops = count_ops(step)
        row = dict(model=name, plain_ms=1e3*median(plain), counted_ms=1e3*median(cnt), ops=ops, extra_ms=1e3*median(diff),
                   spread_ms=1e3*iqr(diff), fwd=fwd/len(x), bwd=bwd/len(x))
        if lt is not None:
            row['lt_fwd'] = lt.measure_flops(model, lambda: model(x))/len(x)
            row['lt_fwd_bwd'] = lt.measure_flops(model, lambda: model(x), lambda o: loss_fn(o, y))/len(x)
            model.zero_grad(set_to_none=True)
        rows.append(row)
        log(f"[bench] counting {name}: +{row['extra_ms']:.2f} ms")
    return rows

# ---------------------------------------------------------------- 3. in a profiled fit

def profiled_fit(trials:int) -> dict:
    "The `warmup` and per-batch rows of the tiny MLP fit with `efficiency=True` / `False`, interleaved trials"
    from .common import mlp_learner
    import fastprofile.learner  # noqa: F401  (patches Learner.profile)
    out = {True: {'warmup': [], 'batch': [], 'forward': [], 'fit': []}, False: {'warmup': [], 'batch': [], 'forward': [], 'fit': []}}
    for t in range(trials + 1):
        for eff in ((False, True) if t % 2 else (True, False)):
            learn = mlp_learner(n_batches=200, bs=64)
            learn.profile(logger_callback=None, show_report=False, efficiency=eff).fit(1, 1e-3)
            if t == 0: continue  # warm-up round
            r = learn.simple_profile_results.set_index(['Phase','Action','Step'])
            d = out[eff]
            d['warmup'].append(r.loc[('train','warmup',''),'Mean Duration'])
            d['batch'].append(r.loc[('train','batch',''),'Mean Duration'])
            d['forward'].append(r.loc[('train','batch','forward'),'Mean Duration'])
            d['fit'].append(r.loc[('fit','fit',''),'Total Time'])
        log(f"[bench] profiled fit trial {t}/{trials}")
    return out

# ---------------------------------------------------------------- 4. the idle callback per batch

def idle_dispatch_cost(n:int=200, rounds:int=60) -> dict:
    "µs per training batch that an idle `EfficiencyProbe` (after its warm-up work) adds through fastai's dispatch"
    from fastai.basics import Learner, Callback, L
    from fastprofile.lifecycle.callback import TIMED_EVENTS
    from fastprofile.probes.efficiency.probe import EfficiencyProbe
    fake = types.SimpleNamespace(training=True, xb=(torch.zeros(1),), train_iter=1)
    others = []
    for _ in range(4):  # stand-ins for TrainEvalCallback, Recorder, CastToTensor, ProgressCallback
        c = Callback(); c.learn = fake; others.append(c)
    idle = EfficiencyProbe(count_flops=False); idle.learn = fake
    idle._handlers = idle._per_phase  # in a stage, past the warm-up batches
    plain = Callback(); plain.learn = fake  # a fastai callback with no method, for comparison
    call = Learner._call_one
    events = ['before_batch','after_pred','after_loss','before_backward','after_backward','before_step','after_step','after_batch']
    def run(cbs):
        ns = types.SimpleNamespace(cbs=L(cbs))
        t0 = time.process_time()
        for _ in range(n):
            for e in events: call(ns, e)
        return (time.process_time() - t0)/n
    variants = {'none': others, 'idle EfficiencyProbe': others + [idle], 'fastai Callback, no method': others + [plain]}
    res = {k: [] for k in variants}
    for r in range(rounds):  # short chunks, the order rotated each round; differences taken within a round
        ks = list(variants)[r % 3:] + list(variants)[:r % 3]
        got = {k: run(variants[k]) for k in ks}
        for k in variants: res[k].append(got[k] - got['none'] if k != 'none' else got[k])
    return {k: 1e6*median(v) for k,v in res.items() if k != 'none'} | {'base_us': 1e6*median(res['none']),
            'spread_us': 1e6*iqr(res['idle EfficiencyProbe'])}

# ---------------------------------------------------------------- 5. memory reads

def timed_call(f, n:int=2000, rounds:int=5) -> float:
    "µs per call of `f` (best of `rounds`)"
    best = float('inf')
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best = min(best, (time.perf_counter() - t0)/n)
    return 1e6*best

def rss_costs() -> dict:
    from fastprofile.probes.efficiency.facts import rss_bytes, maxrss_bytes, mem_available
    return {'rss_bytes (/proc/self/statm)': timed_call(rss_bytes), 'maxrss_bytes (getrusage)': timed_call(maxrss_bytes),
            'mem_available (/proc/meminfo)': timed_call(mem_available)}

def cuda_costs() -> dict:
    "µs per call of the CUDA memory API the callback uses, with a model's worth of blocks allocated"
    dev = torch.device('cuda')
    keep = [torch.empty(2**k, device=dev) for k in range(10, 26) for _ in range(4)]  # an allocator with blocks of many sizes
    c = {'memory_allocated': timed_call(lambda: torch.cuda.memory_allocated(dev)),
         'max_memory_allocated': timed_call(lambda: torch.cuda.max_memory_allocated(dev)),
         'reset_peak_memory_stats': timed_call(lambda: torch.cuda.reset_peak_memory_stats(dev))}
    c['per sampled batch (1 + 3 reads, 3 resets)'] = c['memory_allocated'] + 3*c['max_memory_allocated'] + 3*c['reset_peak_memory_stats']
    del keep
    return c

# ---------------------------------------------------------------- GPU: beside Lightning

def gpu_side_by_side(batches:int=200) -> list:
    "fastprofile's FLOPs per sample, FLOP/s and MFU vs Lightning's `measure_flops` + `Throughput` on the same model, on the GPU"
    from fastai.basics import DataLoaders, Learner, MSELossFlat
    import fastprofile.learner  # noqa: F401
    lt,rows = lightning_throughput(),[]
    for name,model,x,y in models('cuda'):
        bs = len(x)
        g = torch.Generator().manual_seed(1)  # a loader of `batches` batches shaped like this model's input
        X = torch.randn(batches*bs, *x.shape[1:], generator=g); Y = torch.randn(batches*bs, y.shape[1], generator=g)
        dls = DataLoaders.from_dsets(list(zip(X, Y)), list(zip(X[:2*bs], Y[:2*bs])), bs=bs, device='cuda')
        learn = quiet(Learner(dls, model, loss_func=MSELossFlat()))
        learn.profile(logger_callback=None, show_report=False).fit(1, 1e-4)
        e = learn.simple_profile_efficiency
        row = dict(model=name, fp_fwd=e['forward_flops_per_sample'], fp_train=(e['forward_flops_per_sample'] or 0) + (e['backward_flops_per_sample'] or 0),
                   fp_fps=e['train_flops_per_second'], fp_phase_fps=e['train_phase_flops_per_second'], fp_mfu=e['mfu'],
                   fp_peak=e['peak_flops'], dtype=e['dtype'], mem=e['peak_memory'], device=torch.cuda.get_device_name())
        if lt is not None:
            opt,loss_fn = torch.optim.Adam(model.parameters(), 1e-4),nn.MSELoss()
            xb,yb = X[:bs].cuda(),Y[:bs].cuda()
            fpb = lt.measure_flops(model, lambda: model(xb), lambda o: loss_fn(o, yb))
            dtype = {'fp32': torch.float32, 'tf32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}.get(e['dtype'], torch.float32)
            avail = lt.get_available_flops(torch.device('cuda'), dtype)  # None where its table lacks this chip's name
            peak_src = 'Lightning' if avail else 'fastprofile (Lightning has no peak for this chip)'
            avail = avail or e['peak_flops']
            tp = lt.Throughput(available_flops=avail, window_size=min(100, batches - 1))
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for i in range(batches):  # Lightning's documented loop: synchronize, then update with the elapsed time
                b = slice(i*bs, (i+1)*bs)
                loss = loss_fn(model(X[b].cuda(non_blocking=True)), Y[b].cuda(non_blocking=True)); loss.backward(); opt.step(); opt.zero_grad()
                torch.cuda.synchronize()
                tp.update(time=time.perf_counter() - t0, batches=i+1, samples=(i+1)*bs, flops=fpb)  # FLOPs since the last update
            m = tp.compute()
            row.update(lt_train=fpb/bs, lt_fps=m.get('device/flops_per_sec'), lt_mfu=m.get('device/mfu'), lt_peak=avail, lt_peak_source=peak_src)
        rows.append(row)
        log(f"[bench] GPU side by side {name} done")
    return rows

# ---------------------------------------------------------------- tables

def tables(d:dict) -> str:
    L = ['## Efficiency (FLOPs, MFU, peak memory)', '',
         f"Command: `python -m bench.efficiency --reps {d['reps']} --trials {d['trials']}`"
         + (f" (Lightning: `{d['lightning']}` on PYTHONPATH)" if d['lightning'] else " (Lightning not importable: its columns are empty)") + '.', '']
    s = d['setup']
    L += ['### FLOP counter set-up, once per process (at `learn.profile()`, before any fit)', '',
          f"`prepare_flop_counter()` in {len(s)} fresh processes: median {median(s):.2f} s (min {min(s):.2f}, max {max(s):.2f}). "
          "It is the first dispatch of any `TorchDispatchMode`, which imports `torch._dynamo`; later calls cost nothing. "
          "It is paid before the fit and is not in the report's table.", '']
    hdr = ['model', 'step, uncounted (ms)', 'step, counted (ms)', 'counting adds (ms, median of pairs)', 'IQR of the pairs (ms)',
           'aten ops in the step', 'µs per op', 'forward FLOPs/sample', 'backward FLOPs/sample',
           'Lightning `measure_flops` fwd / fwd+bwd per sample']
    rows = []
    for r in d['counting']:
        lt = (f"{r['lt_fwd']:,.0f} / {r['lt_fwd_bwd']:,.0f}" + (' (same)' if r['lt_fwd'] == r['fwd'] and r['lt_fwd_bwd'] == r['fwd'] + r['bwd'] else ' (DIFFERENT)')
              if 'lt_fwd' in r else '—')
        rows.append([r['model'], fmt(r['plain_ms'], '.2f'), fmt(r['counted_ms'], '.2f'), fmt(r['extra_ms'], '+.2f'), fmt(r['spread_ms'], '.2f'),
                     r['ops'], fmt(1e3*r['extra_ms']/r['ops'], '.0f'), f"{r['fwd']:,.0f}", f"{r['bwd']:,.0f}", lt])
    L += ['### Counting one batch (what lands in the warm-up batch, once per fit)', '',
          f"Forward + loss + backward of each model on the CPU, {d['reps']} pairs (uncounted, counted; the order alternating), "
          "process CPU time, after 3 warm-ups; medians. The counter's cost is a Python call per operation: it grows with the "
          "number of operations, not with their size.", '',
          md_table(hdr, rows), '']
    f = d['fit']
    m = lambda eff,k: 1e3*median(f[eff][k])
    dm = lambda k: 1e3*median([a - b for a,b in zip(f[True][k], f[False][k])])  # within each trial round
    L += ['### In a profiled fit: tiny MLP (16-32-1), bs 64, 200 batches, 1 epoch', '',
          f"{d['trials']} trials of `learn.profile(efficiency=False)` and `(efficiency=True)`, interleaved in one process (after a warm-up "
          "round), the profiler's own (wall-clock) rows; medians. The counting lands in `warmup`; the per-batch rows must not move "
          "beyond the noise.", '',
          md_table(['row', 'efficiency=False', 'efficiency=True', 'difference (median of the trials\' differences)'],
                   [['train `warmup` (the counted batch), ms', fmt(m(False,'warmup'), '.2f'), fmt(m(True,'warmup'), '.2f'), fmt(dm('warmup'), '+.2f')],
                    ['train `batch` mean (statistics), µs', fmt(1e3*m(False,'batch'), '.1f'), fmt(1e3*m(True,'batch'), '.1f'), fmt(1e3*dm('batch'), '+.1f')],
                    ['train `forward` mean, µs', fmt(1e3*m(False,'forward'), '.1f'), fmt(1e3*m(True,'forward'), '.1f'), fmt(1e3*dm('forward'), '+.1f')],
                    ['fit total, ms', fmt(m(False,'fit'), '.1f'), fmt(m(True,'fit'), '.1f'), fmt(dm('fit'), '+.1f')]]), '']
    i = d['idle']
    L += ['### The idle callback per batch', '',
          f"The 8 per-batch events through `Learner._call_one` with 4 other callbacks (base {i['base_us']:.1f} µs/batch), "
          f"60 rounds of 200 batches, the three variants in rotating order, CPU time; median of the differences within a round "
          f"(IQR of the idle callback's: {i['spread_us']:.2f} µs):", '',
          md_table(['added to the learner', 'µs per batch'], [[k, fmt(v, '.2f')] for k,v in i.items() if k not in ('base_us','spread_us')]), '']
    L += ['### Memory reads', '', md_table(['call (CPU: resident memory)', 'µs per call'], [[k, fmt(v, '.1f')] for k,v in d['rss'].items()]),
          '', "A profiled call makes 3 of them at its start and end, 1 (`rss_bytes`) at each phase end: a few µs per epoch.", '']
    if d.get('cuda'):
        L += [md_table(['call (CUDA)', 'µs per call'], [[k, fmt(v, '.1f')] for k,v in d['cuda'].items()]), '',
              "Sampled only in the warm-up batches (one per epoch with `warmup=1`): off the per-batch path and out of the statistics.", '']
    else: L += ["CUDA memory calls: **not run (no GPU)**.", '']
    if d.get('gpu'):
        hdr = ['model', 'device', 'dtype', 'fastprofile fwd+bwd FLOPs/sample', 'Lightning `measure_flops` per sample',
               'fastprofile step FLOP/s', 'fastprofile MFU (peak)', 'Lightning device/flops_per_sec', 'Lightning device/mfu (peak)']
        rows = [[r['model'], r['device'], r['dtype'], f"{r['fp_train']:,.0f}", fmt(r.get('lt_train'), ',.0f'),
                 fmt(r['fp_fps'], '.3g'), f"{fmt(r['fp_mfu'], '.1%')} ({fmt(r['fp_peak'], '.3g')})",
                 fmt(r.get('lt_fps'), '.3g'), f"{fmt(r.get('lt_mfu'), '.1%')} ({fmt(r.get('lt_peak'), '.3g')})"] for r in d['gpu']]
        L += ['### GPU: beside Lightning', '', md_table(hdr, rows), '',
              "fastprofile's FLOP/s is the training step's (the `train / batch` row, warm-up excluded); Lightning's is its "
              "documented loop (synchronize per batch, elapsed time including the host's batch slicing and copy)."
              + ''.join(sorted({f" Lightning's MFU peak: {r['lt_peak_source']}." for r in d['gpu'] if r.get('lt_peak_source')})), '']
    else: L += ["GPU side-by-side with Lightning's `ThroughputMonitor`: **not run (no GPU)**.", '']
    return '\n'.join(L)

def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.efficiency', description=__doc__.splitlines()[0])
    ap.add_argument('--reps', type=int, default=30, help="repetitions of each step, counted and uncounted (default 30)")
    ap.add_argument('--trials', type=int, default=5, help="profiled fits per variant (default 5)")
    ap.add_argument('--json', type=Path, default=None, help="also write the raw measurements to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0,load0 = time.perf_counter(),os.getloadavg()[0]
    lt = lightning_throughput()
    d = {'machine': machine_info(), 'reps': a.reps, 'trials': a.trials, 'lightning': lt.source if lt else None}
    log('[bench] set-up per process'); d['setup'] = setup_cost()
    log('[bench] counting one batch'); d['counting'] = counted_batch_cost(a.reps)
    log('[bench] profiled fits'); d['fit'] = profiled_fit(a.trials)
    log('[bench] idle dispatch'); d['idle'] = idle_dispatch_cost()
    d['rss'] = rss_costs()
    if torch.cuda.is_available():
        d['cuda'] = cuda_costs()
        d['gpu'] = gpu_side_by_side()
    d['load'] = (load0, os.getloadavg()[0])
    md = '\n'.join([machine_md(d['machine']), '', tables(d), f"Run time: {time.perf_counter()-t0:.0f} s (one torch thread); "
                    f"1-minute load average {d['load'][0]:.1f} at the start, {d['load'][1]:.1f} at the end (on {os.cpu_count()} cores)."])
    print(md)
    if a.json: a.json.write_text(json.dumps(d, indent=1, default=str))

if __name__ == '__main__': main()
