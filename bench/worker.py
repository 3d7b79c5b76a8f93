"""One benchmark trial in a fresh process: `python -m bench.worker '<json task>'` prints `BENCH_RESULT <json>`.

Each variant runs in its own process because importing a profiler changes fastai for the whole process:
fastprofile adds a `before_draw` event; fastxtend 0.1.7 replaces `Callback.__call__`, `Learner._call_one`,
`Learner.all_batches` and adds `LogDispatch` to every new Learner."""
from __future__ import annotations
import contextlib, io, json, math, sys, time, tracemalloc
from .common import RESULT_TAG

VARIANTS = ('none', 'fastprofile-off', 'fastprofile', 'fastprofile-nosampler', 'fastxtend')

def setup_variant(variant:str):
    "Import what `variant` needs, and check that the other profiler was not pulled in"
    import torch
    torch.set_num_threads(1)
    if variant not in VARIANTS: raise ValueError(f"Unknown variant {variant!r}: valid values are {VARIANTS}")
    if variant.startswith('fastprofile'): import fastprofile.learner  # noqa: F401 (`Learner.profile`, the pair, fastai's loop with `before_draw`)
    if variant == 'fastxtend': import fastxtend.callback.profiler  # noqa: F401
    import fastai.basics  # noqa: F401

def check_clean(variant:str):
    "Fail if a module of the other profiler is loaded in this process"
    if variant in ('none', 'fastxtend') and 'fastprofile.lifecycle.loop' in sys.modules:
        raise RuntimeError(f"variant {variant!r}: fastprofile.lifecycle.loop was imported (it patches fastai)")
    if variant != 'fastxtend' and any(m.startswith('fastxtend') for m in sys.modules):
        raise RuntimeError(f"variant {variant!r}: fastxtend was imported (it patches fastai)")

def add_profiler(learn, variant:str):
    "Add the variant's profiler for the next fit (both profilers remove themselves after it)"
    if variant.startswith('fastprofile') and variant != 'fastprofile-off': learn.profile(show_report=False, logger_callback=None)
    if variant == 'fastprofile-nosampler':  # the defaults, less the `CallbackCostsProbe` (callback costs, loader timing): its share
        from fastprofile.lifecycle.session import Session
        from fastprofile.probes.callback_costs import CallbackCostsProbe
        s = Session.of(learn)
        s.probes = [p for p in s.probes if not isinstance(p, CallbackCostsProbe)]; s.profile.on_batch = None
    elif variant == 'fastxtend': learn.profile(mode='simple', show_report=False)

def time_phases(learn):
    "Wall and CPU time of the train and valid phases of each fit, around the learner's own methods (same in every variant)"
    from fastai.learner import Learner
    times = {'train': [], 'valid': [], 'train_cpu': [], 'valid_cpu': []}
    def _timed(phase, f, *args):
        t,c = time.perf_counter(),time.process_time()
        f(learn, *args)
        times[f'{phase}_cpu'].append(time.process_time() - c); times[phase].append(time.perf_counter() - t)
    def _train(): _timed('train', Learner._do_epoch_train)
    def _valid(ds_idx=1, dl=None): _timed('valid', Learner._do_epoch_validate, ds_idx, dl)
    learn._do_epoch_train,learn._do_epoch_validate = _train,_valid
    return times

# ---------------------------------------------------------------- overhead

def overhead(task:dict) -> dict:
    "Per-batch train time of `task['fits']` fits (after `warmup_fits`), with or without a profiler"
    variant,workload = task['variant'],task['workload']
    setup_variant(variant)
    from bench.common import mlp_learner, demo_learner
    learn = mlp_learner(**task.get('workload_kwargs', {})) if workload == 'mlp' else demo_learner(**task.get('workload_kwargs', {}))
    check_clean(variant)
    times = time_phases(learn)
    n_train,n_valid = len(learn.dls.train),len(learn.dls.valid)
    fits,self_oh,on,sampled = [],[],[],[]
    # fastprofile also alternates unprofiled fits in the same process: the pair's own cost, free of process-to-process noise
    # (order A B B A A B ... so that a drift over the process's life does not favour either); 'fastprofile-nosampler'
    # alternates with default-profiled fits instead: the CallbackCostsProbe's own cost, the same way
    profiling = variant in ('fastprofile', 'fastprofile-nosampler')
    paired = profiling and task.get('paired')
    plan = [(i, p) for i in range(task.get('warmup_fits', 1) + task['fits'])
            for p in (((True, False) if i % 2 else (False, True)) if paired else (True,))]
    try:
        for i,profiled in plan:
            if profiled: add_profiler(learn, variant)
            elif variant == 'fastprofile-nosampler': add_profiler(learn, 'fastprofile')  # its "other" fits: the defaults (the CallbackCostsProbe's share, in-process)
            t = time.perf_counter()
            learn.fit(1, lr=1e-3)
            fits.append(time.perf_counter() - t)
            on.append(profiled)
            if profiling and profiled:
                try: from fastprofile.engine.record import Row
                except ModuleNotFoundError: from fastprofile.record import Row  # a --baseline from before the subpackages
                rec = learn.simple_profile_record
                if rec.stats[Row('train','batch')].n != n_train - rec.warmup: raise RuntimeError("fastprofile did not time every batch")
                self_oh.append(rec.overhead_per_batch)
                costs = learn.simple_profile.facts.callback_costs  # the default profile samples callback costs: check it did
                if (variant == 'fastprofile') != (costs is not None and costs.batches.get('train', 0) > 0):
                    raise RuntimeError(f"{variant}: the CallbackCostsProbe {'did not sample' if variant == 'fastprofile' else 'ran'}")
                if costs is not None: sampled.append(dict(costs.batches))
            if variant == 'fastxtend' and len(learn.profile_results) == 0: raise RuntimeError("fastxtend made no results")
            if any('Profiler' in type(cb).__name__ for cb in learn.cbs): raise RuntimeError("a profiler callback stayed on the learner")
    finally:
        cleanup = getattr(learn, 'cleanup_demo', None)
        if cleanup: cleanup()
    w = task.get('warmup_fits', 1)
    keep = [j for j,(i,p) in enumerate(plan) if i >= w]
    pick = lambda xs, prof: [xs[j] for j in keep if on[j] == prof]
    return {'variant': variant, 'workload': workload, 'n_train': n_train, 'n_valid': n_valid,
            'train_s': pick(times['train'], True), 'valid_s': pick(times['valid'], True), 'train_cpu_s': pick(times['train_cpu'], True),
            'fit_s': pick(fits, True), 'self_overhead_s': self_oh[w:], 'sampled_batches': sampled[w:],
            'off_train_s': pick(times['train'], False), 'off_train_cpu_s': pick(times['train_cpu'], False)}

# ---------------------------------------------------------------- memory

def _traced(f):
    "Run `f()`; the bytes it leaves allocated and its peak, by tracemalloc, and its result"
    tracemalloc.start(); tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    keep = f()
    cur,peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return cur - base, peak - base, keep

def memory(task:dict) -> dict:
    "Profiler state after `n` recorded training batches, for each `n` in `task['ns']`, by tracemalloc"
    prof,out = task['profiler'],[]
    setup_variant('fastprofile' if prof == 'fastprofile' else 'fastxtend')
    learn = keep_learn() if prof != 'fastprofile' else None  # made outside the traced region
    drive = {'fastprofile': lambda n: _drive_fastprofile(n), 'fastxtend': lambda n: _drive_fastxtend(learn, n),
             'fastxtend-sim': lambda n: _simulate_fastxtend(learn, n)}[prof]
    for n in task['ns']:
        t = time.perf_counter()
        if n <= task.get('trace_max', math.inf): held,peak,keep = _traced(lambda: drive(n))
        else: held,peak,keep = None,None,drive(n)  # too slow under tracemalloc: counted by sys.getsizeof only
        extra = {'nbytes': keep.nbytes} if prof == 'fastprofile' else {'raw_values_bytes': _raw_bytes(keep)}
        out.append({'n': n, 'held': held, 'peak': peak, 'seconds': time.perf_counter() - t, **extra})
        del keep
    return {'profiler': prof, 'rows': out}

def _drive_fastprofile(n:int):
    "A `ProfileRecord` through `n` training batches exactly as the profiler pair marks them (real clock)"
    from fastprofile.engine.record import ProfileRecord
    rec = ProfileRecord()
    rec.before_fit(); rec.before_epoch(0); rec.before_phase('train')
    mark,clock = rec.mark,rec.clock
    for _ in range(n):
        mark(0); mark(1); mark(2); mark(3); mark(4); mark(5); mark(6); mark(7); mark(8); mark(9); mark(10); mark(11)
        rec.marks[12] = clock(); rec.end_batch(64)
    return rec

_LEARN = []
def keep_learn():
    "A tiny real Learner with fastxtend's profiler pair, made once per process (outside the traced region)"
    if not _LEARN:
        import torch
        from bench.common import mlp_learner
        learn = mlp_learner(n_batches=2, bs=64)
        learn.xb = (torch.zeros(64, 16),)
        _LEARN.append(learn)
    return _LEARN[0]

def _drive_fastxtend(learn, n:int):
    "fastxtend's real callback pair, its methods called in fastai's order for `n` training batches"
    from fastxtend.callback.profiler import SimpleProfilerCallback, SimpleProfilerPostCallback
    pre,post = SimpleProfilerCallback(show_report=False),SimpleProfilerPostCallback()
    learn.add_cbs([pre, post])
    learn.training = True
    learn.log_dispatch.before_fit()  # fastxtend's LogDispatch, which its profiler writes throughput to
    pre.before_fit(); post.before_fit(); pre.before_epoch(); pre.before_train()
    for _ in range(n):
        pre.before_draw(); pre.before_batch(); post.after_pred(); post.after_loss(); pre.before_backward()
        pre.before_step(); post.after_step(); pre.after_batch(); post.after_batch()
    learn.remove_cbs([pre, post])
    return pre

def _simulate_fastxtend(learn, n:int):
    "fastxtend's appends for `n` training batches without its callback dispatch: its own `_raw_values` dict, the same values"
    from fastai.torch_core import find_bs
    from fastxtend.callback.profiler import SimpleProfilerCallback
    pre = SimpleProfilerCallback(show_report=False)
    learn.add_cbs([pre])
    pre.before_fit()  # builds `_raw_values` exactly as in a fit
    rv,pc,xb = pre._raw_values,time.perf_counter,learn.xb
    adds = [rv[f'train_{a}'].append for a in ('draw','batch','forward','loss','backward','opt_step','zero_grad')]
    add_bs = rv['train_bs'].append
    for _ in range(n):
        t = pc()
        for a in adds: a(pc() - t)  # a fresh float per timed phase, as `time.perf_counter() - start` makes
        add_bs(find_bs(xb))
    learn.remove_cbs([pre])
    return pre

def _raw_bytes(pre) -> int:
    "Bytes held by fastxtend's `_raw_values` lists and the floats in them (sys.getsizeof, no sharing)"
    seen,total = set(),0
    for v in pre._raw_values.values():
        total += sys.getsizeof(v)
        for x in v:
            if id(x) not in seen: seen.add(id(x)); total += sys.getsizeof(x)
    return total

# ---------------------------------------------------------------- accuracy

def accuracy(task:dict) -> dict:
    "Each profiler's mean per phase on a workload whose phases sleep known times, the sleeps measured in place; then with no sleeps"
    prof = task['profiler']
    setup_variant(prof)
    from bench.accuracy import sleepy_learner
    sleeps = dict(task['sleeps'])
    learn,slept = sleepy_learner(sleeps, n_train=task['n_train'], n_valid=task['n_valid'], spin=task.get('spin', False))
    check_clean(prof)
    out = []
    for i in range(task['fits'] + task.get('floor_fits', 0)):
        if i == task['fits']:  # the same workload without sleeping: each phase's own work as the profiler sees it
            for k in sleeps: sleeps[k] = 0
        for v in slept.values(): v.clear()
        add_profiler(learn, prof)
        learn.fit(1, lr=1e-3)
        if prof == 'fastprofile':
            got = {f"{r['Phase']}_{r['Step'] or r['Action']}": float(r['Mean Duration'])
                   for _,r in learn.simple_profile_results.iterrows()}
        else:
            got = {f"{r['Phase']}_{r['Action']}": float(r['Mean Duration']) for _,r in learn.profile_results.iterrows()}
        # the first batch of each phase is left out by both profilers (warm-up / drop_first_batch): match that
        truth = {k: sum(v[1:])/len(v[1:]) for k,v in slept.items() if len(v) > 1}
        out.append({'sleep': i < task['fits'], 'profiler_mean': got, 'slept_mean': truth})
    return {'profiler': prof, 'fits': out}

# ---------------------------------------------------------------- per-fit fixed cost

FIXED_VARIANTS = {  # name -> (profiler, show the report)
    'none': (None, False), 'fastprofile': ('fastprofile', False), 'fastprofile-report': ('fastprofile', True),
    'fastxtend': ('fastxtend', False), 'fastxtend-report': ('fastxtend', True)}

def timed_fit(learn, variant:str, times:dict) -> dict:
    "One `learn.fit(1)` with `variant`'s profiler armed: wall time of the `profile()` call and around `learn.fit`, and the phases'"
    prof,report = FIXED_VARIANTS[variant]
    t = time.perf_counter()
    if prof == 'fastprofile': learn.profile(show_report=report, logger_callback=None)
    elif prof == 'fastxtend': learn.profile(mode='simple', show_report=report)
    arm = time.perf_counter() - t
    n = len(times['train'])
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):  # a non-terminal stream (a log file, a CI job): the report is rendered as text
        t,c = time.perf_counter(),time.process_time()
        learn.fit(1, lr=1e-3)
        wall,cpu = time.perf_counter() - t,time.process_time() - c
    if bool(shown.getvalue()) != report: raise RuntimeError(f"{variant}: the report was {'not ' if report else ''}shown")
    r = {'variant': variant, 'arm_s': arm, 'fit_s': wall, 'fit_cpu_s': cpu, 'phases_s': sum(times[p][n] for p in ('train','valid'))}
    if prof == 'fastprofile':
        res = learn.simple_profile
        r['own_cost_s'],r['fit_row_s'] = res.own_cost,res.record.fit_total
    if any('Profiler' in type(cb).__name__ for cb in learn.cbs): raise RuntimeError("a profiler callback stayed on the learner")
    return r

def fixed(task:dict) -> dict:
    "Wall time around `learn.fit` per variant: the first fit of this process ('fresh'), or `rounds` rounds of every variant after a warm-up ('same')"
    variants = task['variants']
    profs = {FIXED_VARIANTS[v][0] for v in variants} - {None}
    if len(profs) > 1: raise ValueError(f"one profiler per process, got {variants}")
    base = profs.pop() if profs else 'none'
    setup_variant(base)
    from bench.common import mlp_learner
    learn = mlp_learner(**task.get('workload_kwargs', {}))
    check_clean(base)
    times = time_phases(learn)
    if task['mode'] == 'fresh':
        if len(variants) != 1: raise ValueError("a fresh process times one variant's first fit")
        return {'mode': 'fresh', 'fits': [timed_fit(learn, variants[0], times)]}
    for v in variants: timed_fit(learn, v, times)  # warm-up: each variant's first fit (calibration, lazy imports) left out
    fits = []
    for r in range(task['rounds']):  # rotate the order each round, so no variant always follows the same one
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            fits.append(dict(timed_fit(learn, v, times), round=r))
    return {'mode': 'same', 'fits': fits, 'n_train': len(learn.dls.train), 'n_valid': len(learn.dls.valid)}

def fitcost(task:dict) -> dict:
    from .fitcost import work
    return work(task)

TASKS = {'overhead': overhead, 'memory': memory, 'accuracy': accuracy, 'fixed': fixed, 'fitcost': fitcost}

if __name__ == '__main__':
    task = json.loads(sys.argv[1])
    res = TASKS[task['kind']](task)
    print(RESULT_TAG + json.dumps(res, default=float), flush=True)
