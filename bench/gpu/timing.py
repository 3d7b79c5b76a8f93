"""Part `timing`: each phase timed with `timing='events'`, `'sync'` and `'wall'` against a synchronized truth, on four workloads.

The truth is a separate run of the same workload with CUDA events at every phase boundary and a synchronize after
each: a phase's span then holds its own GPU work and host time and nothing queued before it. `timing='events'` gives
two times per phase, its wall time and its GPU span; both are compared, and so is the longer of the two (`events_cost`),
which is how the diagnosis reads a phase's cost and what the truth measures (a phase alone costs the longer of its
host work and its GPU work). Runs of one workload (truth, no profiler, wall, sync, events) are interleaved over
`trials`, in a rotating order; figures are medians over the trials of the per-run means.
The overhead is the step time (wall clock, GPU synchronized at both ends, warm-up left out) against the run with no
profiler. The drift warning (`engine.notes.gpu_notes`) is expected on a phase whose wall time in the events run is
mostly waiting: wall minus truth is at least half its wall time and at least 5% of the step."""
from __future__ import annotations
import math, re, time
from .common import Deadline, Results, log, median, merged, quiet_fit, free, step_timer, sync, load_xresnet

PHASES = ('draw','forward','loss','backward','opt_step','zero_grad','other','step')
MODES = ('truth','none','wall','sync','events')
ROWS = {'draw':('train','draw',''), 'batch':('train','batch',''), 'other':('train','batch','other'),
        **{s:('train','batch',s) for s in ('forward','loss','backward','opt_step','zero_grad')}}

DEFAULTS = dict(
    select=None, # names of the workloads to run (None: all)
    device='cuda', trials=3, skip=6, run_s=0.6, min_batches=30, max_batches=400, warm_batches=12,
    workloads={
        'xresnet18': dict(kind='xresnet18', bs=64, size=128),
        'transformer': dict(kind='transformer', bs=32, seq=128, d=256, heads=8, layers=2),
        'mlp': dict(kind='mlp', bs=512, n_in=1024, width=2048, depth=3),
        'known-cost': dict(kind='known-cost', ms=dict(forward=3., backward=6., opt_step=1.5)),
    })

# ---------------------------------------------------------------- the synchronized truth

SYNCS_IN_STEP = 11  # the truth's synchronizes between a batch's first mark (draw start) and its last (batch end)

def truth_callbacks(skip:int, device='cuda'):
    "Two callbacks (first and last at each event) that record a CUDA event at each phase boundary, with a synchronize"
    import torch
    from fastai.callback.core import Callback
    # The phases' ends are marked first at an event (record, then synchronize: the event closes the phase's GPU work),
    # their starts last (synchronize, then record: the phase starts on an idle GPU, no synchronize inside it)
    ENDS = dict(before_batch='batch_start', after_pred='forward_end', after_loss='loss_end', after_backward='backward_end',
                after_step='opt_step_end', after_batch='zero_grad_end')
    STARTS = dict(before_draw='draw_start', before_batch='forward_start', after_pred='loss_start',
                  before_backward='backward_start', before_step='opt_step_start', after_step='zero_grad_start')
    evs = {k:torch.cuda.Event(enable_timing=True) for k in (*ENDS.values(), *STARTS.values(), 'batch_end')}
    spans = {p:[] for p in PHASES}
    def end(name): evs[name].record(); sync(device)
    def start(name): sync(device); evs[name].record()
    def batch_done(learn):
        if learn.iter < skip: return
        el = lambda a,z: evs[a].elapsed_time(evs[z])/1e3
        d = dict(draw=el('draw_start','batch_start'), forward=el('forward_start','forward_end'),
                 loss=el('loss_start','loss_end'), backward=el('backward_start','backward_end'),
                 opt_step=el('opt_step_start','opt_step_end'), zero_grad=el('zero_grad_start','zero_grad_end'))
        batch = el('batch_start','batch_end')
        d['other'] = batch - sum(d[k] for k in ('forward','loss','backward','opt_step','zero_grad'))
        d['step'] = d['draw'] + batch
        for k,v in d.items(): spans[k].append(v)
    class TruthEnds(Callback):
        order = -3000
        def __call__(self, event):
            if event in ENDS and self.training: end(ENDS[event])
        def before_draw(self): pass  # defined, so that fastprofile's `before_draw` is sent to this callback
    class TruthStarts(Callback):
        order = 3500
        def __call__(self, event):
            if event not in STARTS and event != 'after_batch' or not self.training: return
            if event == 'after_batch': end('batch_end'); batch_done(self.learn)
            else: start(STARTS[event])
        def before_draw(self): pass
    return [TruthEnds(), TruthStarts()],spans

def mark_cost(device='cuda', n:int=200) -> float:
    "Host seconds of one truth mark (an event recorded, a synchronize) on an idle GPU: subtracted from the truth's `other` and step"
    import torch
    ev = torch.cuda.Event(enable_timing=True)
    for _ in range(10): ev.record(); sync(device)
    t0 = time.perf_counter()
    for _ in range(n): ev.record(); sync(device)
    return (time.perf_counter() - t0)/n

# ---------------------------------------------------------------- workloads

def workload_maker(w:dict, device='cuda'):
    "A function `make(n_batches) -> Learner` for the workload `w`, its data made once; and the known GPU ms per phase, if any"
    import torch
    from .data import image_pool, tensor_pool, image_tfms, pool_dls, transformer, mlp, learner
    kind,on_gpu = w['kind'],torch.device(device).type == 'cuda'
    if kind == 'known-cost':
        from bench.gpu_timing import known_cost_learner
        from .common import spin_per_ms
        cycles = {k:int(v*spin_per_ms()) for k,v in w['ms'].items()}
        return (lambda n: known_cost_learner(cycles, cuda=on_gpu, n_batches=n, n_valid=1)),dict(w['ms'])
    if kind == 'xresnet18':
        pool,tfms = image_pool(4, w['bs'], w['size'], pin=on_gpu),image_tfms()
        model = lambda: load_xresnet().xresnet18(n_out=10)
    elif kind == 'transformer':
        pool,tfms = tensor_pool(4, (w['bs'], w['seq'], w['d']), pin=on_gpu),None
        model = lambda: transformer(w['d'], w['heads'], w['layers'])
    elif kind == 'mlp':
        pool,tfms = tensor_pool(4, (w['bs'], w['n_in']), pin=on_gpu),None
        model = lambda: mlp(w['n_in'], w['width'], w['depth'])
    else: raise ValueError(f"unknown workload kind {kind!r}: valid kinds are xresnet18, transformer, mlp, known-cost")
    def make(n):
        torch.manual_seed(0)
        return learner(pool_dls(pool, n, pin=on_gpu, after_batch=tfms, device=device), model())
    return make,None

# ---------------------------------------------------------------- one run

def phases_from(results, col:str='Mean Duration') -> dict:
    "Mean seconds of each phase of a training batch from `learn.simple_profile_results` (`col`: wall or GPU column)"
    r = results.set_index(['Phase','Action','Step'])[col]
    get = lambda k: float(r.get(ROWS[k], math.nan))
    d = {k:get(k) for k in ROWS if k != 'batch'}
    d['step'] = d['draw'] + get('batch')
    return d

WARNING = re.compile(r"^Warning: (.+?) wall time \(")

def flagged_phases(notes:list) -> list:
    "The phases that `gpu_notes` warns are mostly waiting for earlier GPU work"
    out = []
    for n in notes:
        m = WARNING.match(n)
        if m: out.append('other' if m.group(1).startswith("the batch's `other`") else m.group(1))
    return out

def longer(a:float, b:float) -> float:
    "The larger of two times, NaN only if both are"
    return a if math.isnan(b) else b if math.isnan(a) else max(a, b)

def measure(make, mode:str, n:int, skip:int, device='cuda') -> dict:
    "One fit of `n` training batches in `mode` ('truth', 'none', 'wall', 'sync' or 'events'): step time and phases"
    learn = make(n)
    timer = step_timer(skip, device); learn.add_cb(timer)
    spans = None
    if mode == 'truth':
        cbs,spans = truth_callbacks(skip, device); learn.add_cbs(cbs)
    elif mode != 'none':
        learn.profile(timing=mode, warmup=skip, show_report=False, logger_callback=None)
    t0 = time.perf_counter()
    quiet_fit(learn)
    out = dict(step=timer.per_batch, fit_s=time.perf_counter() - t0)
    if mode == 'truth': out['phases'] = {k:(sum(v)/len(v) if v else math.nan) for k,v in spans.items()}; out['batches'] = len(spans['step'])
    elif mode != 'none':
        from fastprofile.engine.notes import gpu_notes
        rec,res = learn.simple_profile_record,learn.simple_profile_results
        assert rec.timing == mode, (rec.timing, mode)
        out['phases'] = phases_from(res)
        out['self_overhead'] = rec.overhead_per_batch
        if mode == 'events':
            g = out['gpu_phases'] = phases_from(res, 'GPU Mean Duration')
            out['cost_phases'] = {p:longer(out['phases'][p], g[p]) for p in PHASES}  # a phase's cost, as the diagnosis reads it
            out['notes'] = gpu_notes(rec)
    del learn; free(device)
    return out

# ---------------------------------------------------------------- one workload

def expected_waits(truth:dict, wall:dict, step:float, share:float=.05) -> list:
    "Phases whose wall time is mostly waiting for GPU work queued earlier: wall - truth >= half the wall time and >= `share` of the step"
    out = []
    for p in PHASES[:-1]:
        w,t = wall.get(p, math.nan),truth.get(p, math.nan)
        if math.isnan(w) or math.isnan(t): continue
        if w - t >= .5*w and w - t >= share*step: out.append(p)
    return out

def summarize(runs:dict, mark:float=0.) -> dict:
    "Medians over the trials of each mode's step and phases, errors against the truth, overheads and the drift check"
    steps = {m:median([r['step'] for r in rs]) for m,rs in runs.items()}
    med = lambda m, key: {p:median([r[key].get(p, math.nan) for r in runs[m]]) for p in PHASES} if runs.get(m) else {}
    truth = med('truth', 'phases')
    for p in ('other','step'):  # the truth's own marks inside the batch, taken out
        if p in truth: truth[p] -= SYNCS_IN_STEP*mark
    timed = {'events':med('events', 'gpu_phases'), 'events_cost':med('events', 'cost_phases'), 'sync':med('sync', 'phases'),
             'wall':med('wall', 'phases')}
    err = {m:{p:(v[p]/truth[p] - 1 if truth.get(p) else math.nan) for p in PHASES} for m,v in timed.items() if v}
    # overhead per trial against that trial's run with no profiler (interleaved: drift cancels), then the median
    ovh = {}
    for m in ('wall','sync','events'):
        pairs = [(a['step'], b['step']) for a,b in zip(runs.get(m, []), runs.get('none', []))]
        ovh[m] = dict(median=median([a/b - 1 for a,b in pairs]), trials=[a/b - 1 for a,b in pairs],
                      self_measured=median([r.get('self_overhead', math.nan) for r in runs.get(m, [])]))
    out = dict(steps=steps, truth=truth, timed=timed, events_wall=med('events', 'phases'), rel_error=err, overhead=ovh)
    if runs.get('events') and truth:
        notes = runs['events'][-1].get('notes', [])
        step = truth.get('step', math.nan)
        each = [flagged_phases(r.get('notes', [])) for r in runs['events']]
        fired = [p for p in PHASES if 2*sum(p in f for f in each) > len(each)]  # in most trials
        out['drift'] = dict(expected=expected_waits(truth, out['events_wall'], step), fired=fired, fired_each_trial=each, notes=notes)
    return out

def run_workload(name:str, w:dict, cfg:dict, deadline:Deadline, device='cuda', mark:float=0., share:float=math.inf,
                 out:dict|None=None, save=lambda: None) -> dict:
    "Plan the batches and trials of workload `w` to fit its `share` of the time left, run its modes interleaved; `out` summarized after each trial"
    make,known = workload_maker(w, device)
    skip = cfg['skip']
    t0 = time.perf_counter()
    warm = measure(make, 'none', cfg['warm_batches'], min(skip, cfg['warm_batches']-1), device)  # CUDA init, cuDNN, allocator
    setup = max(time.perf_counter() - t0 - warm['step']*cfg['warm_batches'], 0.)
    est = warm['step']
    n = int(min(max(cfg['run_s']/est if est > 0 else cfg['max_batches'], cfg['min_batches']), cfg['max_batches'])) + skip
    per_run = setup + 1.3*n*est  # a profiled or truth run costs a little more than a plain one
    left = deadline.left() - 5
    per_trial = len(MODES)*per_run
    trials = int(min(cfg['trials'], (min(share, deadline.left()) - (time.perf_counter() - t0) - 5)//per_trial))
    if trials < 1 and left >= per_trial: trials = 1  # one trial, if the part's time allows it, before none
    out = out if out is not None else {}
    out.update(config=w, batches=n-skip, skip=skip, trials=max(trials, 0), est_step=est, known_ms=known)
    if trials < 1:
        out['skipped'] = f"not enough time left ({left:.0f} s for ~{per_trial:.0f} s of runs)"
        return out
    runs = {m:[] for m in MODES}
    for t in range(trials):
        order = MODES[t % len(MODES):] + MODES[:t % len(MODES)]
        for m in order: runs[m].append(measure(make, m, n, skip, device))
        out.update(summarize(runs, mark), runs=runs, trials_done=t+1)
        save()  # a part stopped later keeps this workload's finished trials
        log(f"{name}: trial {t+1}/{trials} done ({deadline.elapsed():.0f} s into the part)", 'timing')
    return out

def run(cfg:dict, res:Results, deadline:Deadline):
    "The `timing` part: every workload, results saved after each"
    cfg = merged(DEFAULTS, cfg)
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    res['config'] = {k:v for k,v in cfg.items() if k != 'workloads'}
    res['workloads'] = {}
    res['mark_cost'] = mark = mark_cost(cfg['device'])
    res['syncs_in_step'] = SYNCS_IN_STEP
    names = [n for n in cfg['workloads'] if cfg['select'] is None or n in cfg['select']]
    for i,name in enumerate(names):
        w = cfg['workloads'][name]
        share = deadline.left()/(len(names) - i)  # a fair share of what is left; what it does not use goes to the next
        log(f"{name}: start ({deadline.left():.0f} s left, {share:.0f} s for this one)", 'timing')
        out = res['workloads'][name] = dict(config=w)
        try: run_workload(name, w, cfg, deadline, cfg['device'], mark, share, out, res.save)
        except Exception as e:
            import traceback
            out.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{name}: FAILED {type(e).__name__}: {e}", 'timing')
        res.save()
