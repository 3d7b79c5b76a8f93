"""Part `overhead`: what `learn.profile()`'s defaults cost a host-bound GPU step, each default off in turn, beside
Lightning's simple profiler against Lightning with none.

The workload is the one round 4 measured: `Linear(512,512)-ReLU-Linear(512,10)`, bs 256, Adam, batches ready in host
memory (a fastai `DataLoader(bs=None)` over a list of batches; Lightning gets a torch `DataLoader(batch_size=None)` over
the same list), so the host bounds the step (~3 ms). Everything runs in this one process; each round runs every variant
once at each length, in a rotating order (the variants interleaved, A B C ... then B C ... A), and each fit is timed
from outside: wall seconds around `learn.fit` / `trainer.fit`, the GPU synchronized before and after. A variant's time
for a fit of n training batches is a + b·n: b (per batch) from the 400- and 20-batch fits, a (per fit) the rest; its
cost is the median over rounds of its b and a minus plain fastai's (Lightning's profiler: minus Lightning's plain) in
the same round. `first_fit` is the process's first profiled fit (a short one, after plain fastai's own first fits)
minus the median of the later short fits of the same variant: what the first call costs beyond the steady state.
`CUDA events alone` is the default against the default with `timing='wall'` in the same round: what recording events on
one batch in `GPU_EVERY` (and resolving them) costs a batch, measured from outside.
The goals (issue 32): ≤ 30 µs a batch, ≤ 5 ms a fit without the report, ≤ 15 ms with it shown, the first fit ≤ 30 ms more."""
from __future__ import annotations
import contextlib, io, math, time, warnings
from .common import Deadline, Results, log, median, merged, sync, free

QUIET = dict(show_report=False, logger_callback=None)
STAND_IN_GPU = dict(timing='events', efficiency=True)  # what 'auto' picks on a GPU, asked for by name where `torch.cuda` is stood in on a CPU
VARIANTS = {  # name -> `learn.profile` options (None: no profiler)
    'plain': None,
    'default': {},
    'telemetry off': dict(telemetry=False),
    'layers off': dict(layers=False),
    'efficiency off': dict(efficiency=False),
    'events off (wall)': dict(timing='wall'),
    'all off': dict(telemetry=False, layers=False, efficiency=False, timing='wall'),
    'report shown': dict(show_report=True, plain=True),
}
LIGHTNING = ('lightning plain', 'lightning simple')
APART = {'CUDA events alone': ('default', 'events off (wall)')}  # a cost measured as one variant against another of the same round
GOALS = dict(per_batch=30e-6, per_fit=5e-3, per_fit_shown=15e-3, first_fit=30e-3)

DEFAULTS = dict(device='cuda', rounds=5, long=400, short=20, valid=4, bs=256, width=512, n_out=10, lightning=True,
                variants=None)  # `variants`: names to run (None: all)

def _batches(n, c, seed=0):
    "`n` ready batches (x, y) in host memory"
    import torch
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(c['bs'], c['width'], generator=g), torch.randint(0, c['n_out'], (c['bs'],), generator=g)) for _ in range(n)]

def _model(c):
    from torch import nn
    return nn.Sequential(nn.Linear(c['width'], c['width']), nn.ReLU(), nn.Linear(c['width'], c['n_out']))

def fastai_fit(c:dict, n:int, profile:dict|None, data:dict):
    "Seconds around one `learn.fit(1)` of `n` training batches (the GPU synchronized at both ends), with `learn.profile(**profile)` unless None"
    import torch
    from fastai.basics import Learner, DataLoader, DataLoaders, CrossEntropyLossFlat, Adam
    dev = torch.device(c['device'])
    dls = DataLoaders(DataLoader(data['train'][:n], bs=None), DataLoader(data['valid'], bs=None), device=dev)
    learn = Learner(dls, _model(c).to(dev), loss_func=CrossEntropyLossFlat(), opt_func=Adam)
    bars = [cb for cb in learn.cbs if type(cb).__name__ == 'ProgressCallback']
    out = io.StringIO()
    with learn.removed_cbs(bars), learn.no_logging(), warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter('ignore', UserWarning)
        if profile is not None: learn.profile(**{**QUIET, **(STAND_IN_GPU if dev.type == 'cpu' else {}), **profile})
        sync(dev); t0 = time.perf_counter()
        learn.fit(1)
        sync(dev); t = time.perf_counter() - t0
    del learn; free(dev)
    return t

def lightning_fit(c:dict, n:int, profiler:str|None, data:dict):
    "Seconds around one `trainer.fit` of `n` training batches with Lightning (`profiler=None` or 'simple'); its summary goes to a buffer"
    import torch, lightning as L
    from torch.utils.data import DataLoader
    class Module(L.LightningModule):
        def __init__(self): super().__init__(); self.model = _model(c)
        def training_step(self, b, i): x,y = b; return torch.nn.functional.cross_entropy(self.model(x), y)
        def validation_step(self, b, i): x,y = b; self.log('valid_loss', torch.nn.functional.cross_entropy(self.model(x), y))
        def configure_optimizers(self): return torch.optim.Adam(self.parameters(), lr=1e-3)
    gpu = torch.device(c['device']).type == 'cuda'
    tr = L.Trainer(max_epochs=1, accelerator='gpu' if gpu else 'cpu', devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, profiler=profiler)
    m = Module()
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        warnings.simplefilter('ignore')
        sync(c['device']); t0 = time.perf_counter()
        tr.fit(m, DataLoader(data['train'][:n], batch_size=None), DataLoader(data['valid'], batch_size=None))
        sync(c['device']); t = time.perf_counter() - t0
    del tr, m; free(c['device'])
    return t

def _lightning_ok() -> str|None:
    "None when Lightning imports here, else why not"
    try: import lightning  # noqa: F401
    except Exception as e: return f"Lightning does not import ({type(e).__name__}: {e})"
    return None

def fit_once(name:str, c:dict, n:int, data:dict) -> float:
    if name == 'lightning plain': return lightning_fit(c, n, None, data)
    if name == 'lightning simple': return lightning_fit(c, n, 'simple', data)
    return fastai_fit(c, n, VARIANTS[name], data)

def summarize(times:dict, c:dict) -> dict:
    "Per-batch and per-fit cost of each variant against its baseline (then `APART`'s), the median over rounds of the paired differences"
    L,S = c['long'],c['short']
    slope = lambda r: (r['long'] - r['short'])/(L - S)
    icpt = lambda r: r['short'] - S*slope(r)
    out = {}
    against = [(name, rounds, 'lightning plain' if name.startswith('lightning') else 'plain') for name,rounds in times.items()]
    against += [(name, times[a], b) for name,(a,b) in APART.items() if a in times]
    for name,rounds,base in against:
        if name == base or base not in times: continue
        pairs = [(r, b) for r,b in zip(rounds, times[base]) if r and b and 'long' in r and 'short' in r and 'long' in b and 'short' in b]
        if not pairs: continue
        per_batch = median([slope(r) - slope(b) for r,b in pairs])
        per_fit = median([icpt(r) - icpt(b) for r,b in pairs])
        base_batch = median([slope(b) for _,b in pairs])
        out[name] = dict(baseline=base, per_batch=per_batch, per_fit=per_fit, share=per_batch/base_batch if base_batch > 0 else math.nan,
                         base_per_batch=base_batch, rounds=len(pairs))
    return out

def goals(summary:dict, first_fit:float|None) -> dict:
    "Each goal of issue 32 with its figure and whether it is met (None: not measured)"
    d,shown = summary.get('default') or {},summary.get('report shown') or {}
    ok = lambda v,g: None if v is None or (isinstance(v, float) and math.isnan(v)) else v <= g
    return {'per_batch': dict(value=d.get('per_batch'), goal=GOALS['per_batch'], met=ok(d.get('per_batch'), GOALS['per_batch'])),
            'per_fit': dict(value=d.get('per_fit'), goal=GOALS['per_fit'], met=ok(d.get('per_fit'), GOALS['per_fit'])),
            'per_fit_shown': dict(value=shown.get('per_fit'), goal=GOALS['per_fit_shown'], met=ok(shown.get('per_fit'), GOALS['per_fit_shown'])),
            'first_fit': dict(value=first_fit, goal=GOALS['first_fit'], met=ok(first_fit, GOALS['first_fit']))}

def run(config:dict, res:Results, deadline:Deadline):
    c = merged(DEFAULTS, config)
    names = [n for n in VARIANTS if c['variants'] is None or n in c['variants']]
    if 'plain' not in names: names.insert(0, 'plain')
    why = _lightning_ok() if c['lightning'] else "not asked for (`lightning=False`)"
    if why is None: names += list(LIGHTNING)
    else: res['lightning'] = why
    res['settings'] = dict(c, variants=names)
    data = dict(train=_batches(c['long'], c), valid=_batches(c['valid'], c, seed=1))
    # warm-up: CUDA, the allocator, cuBLAS, fastai's first fit; then the process's first profiled fit
    for _ in range(2): fastai_fit(c, c['short'], None, data)
    first = fastai_fit(c, c['short'], {}, data)
    res['first_fit_seconds'] = first
    if 'lightning plain' in names: lightning_fit(c, c['short'], None, data)
    res.save()
    times = {n:[] for n in names}
    est = None
    for k in range(c['rounds']):
        t0 = time.monotonic()
        if est is not None and deadline.left() < 1.2*est:
            res['stopped'] = f"{k} of {c['rounds']} rounds: the part's time was running out"; break
        order = names[k % len(names):] + names[:k % len(names)]
        row = {n:{} for n in names}
        for n in order:
            for length,key in ((c['long'], 'long'), (c['short'], 'short')):
                row[n][key] = fit_once(n, c, length, data)
        for n in names: times[n].append(row[n])
        est = time.monotonic() - t0
        res['times'] = times
        res['summary'] = s = summarize(times, c)
        shorts = [r['short'] for r in times.get('default', [])]
        res['first_fit'] = first - median(shorts) if shorts else None
        res['goals'] = goals(s, res['first_fit'])
        res.save()
        log(f"round {k+1}/{c['rounds']} in {est:.1f} s: default +{1e6*(s.get('default') or {}).get('per_batch', math.nan):.1f} µs a batch", 'overhead')
