"""Accuracy: a Learner whose every phase sleeps a known time; each profiler's mean per phase vs the time slept.

draw sleeps in the DataLoader's `create_batch`, forward/predict in the model, loss in the loss function, backward
in a custom `autograd.Function`, opt_step and zero_grad in an `Optimizer` subclass. Every sleep is also timed in
place with `perf_counter` (`time.sleep` overshoots by tens of µs): that measured sleep is the truth each profiler's
mean is compared with. What a phase does besides sleeping (collating 8 tiny items, a 4->1 linear layer) is part
of the error, and is a few µs to tens of µs."""
from __future__ import annotations
import time
from collections import defaultdict
from .common import run_worker, fastxtend_dir, PredecessorUnavailable, median, md_table, fmt

SLEEPS = dict(draw=.004, forward=.003, loss=.001, backward=.005, opt_step=.002, zero_grad=.001)  # seconds
ROWS = (('train','draw','draw'), ('train','forward','forward'), ('train','loss','loss'), ('train','backward','backward'),
        ('train','opt_step','opt_step'), ('train','zero_grad','zero_grad'),
        ('valid','draw','draw'), ('valid','predict','forward'), ('valid','loss','loss'))

def sleepy_learner(sleeps:dict, n_train:int=60, n_valid:int=10, bs:int=8, spin:bool=False):
    "A real fastai Learner whose phases sleep (or busy-wait, if `spin`) `sleeps[phase]` seconds; also the dict of sleeps measured in place"
    import torch
    from torch import nn
    from fastai.basics import DataLoaders, Learner, MSELossFlat
    from fastai.data.load import DataLoader
    from fastai.optimizer import Optimizer, sgd_step
    from .common import quiet
    slept = defaultdict(list)
    pc = time.perf_counter
    def nap(key, dt):
        if not dt: return  # no-sleep runs: nothing added to the phase
        t = pc()
        if spin:
            while pc() - t < dt: pass
        else: time.sleep(dt)
        slept[key].append(pc() - t)

    class SleepyDL(DataLoader):
        "Sleeps `sleeps['draw']` while making each batch"
        def create_batch(self, b):
            nap(f'{self.phase}_draw', sleeps['draw'])
            return super().create_batch(b)

    class SleepyBackward(torch.autograd.Function):
        "Identity whose backward sleeps `sleeps['backward']`"
        @staticmethod
        def forward(ctx, x): return x.view_as(x)
        @staticmethod
        def backward(ctx, g):
            nap('train_backward', sleeps['backward']); return g

    class SleepyModel(nn.Module):
        def __init__(self):
            super().__init__(); self.lin = nn.Linear(4, 1)
        def forward(self, x):
            nap('train_forward' if self.training else 'valid_predict', sleeps['forward'])
            return SleepyBackward.apply(self.lin(x))

    mse = MSELossFlat()
    def loss_func(pred, y):
        nap('train_loss' if torch.is_grad_enabled() else 'valid_loss', sleeps['loss'])
        return mse(pred, y)

    class SleepyOptimizer(Optimizer):
        "fastai SGD whose step and zero_grad sleep"
        def step(self, closure=None):
            nap('train_opt_step', sleeps['opt_step']); return super().step(closure)
        def zero_grad(self):
            nap('train_zero_grad', sleeps['zero_grad']); return super().zero_grad()

    g = torch.Generator().manual_seed(0)
    x = torch.randn((n_train + n_valid)*bs, 4, generator=g); y = x.sum(1, keepdim=True)
    items = list(zip(x, y))
    tdl = SleepyDL(items[:n_train*bs], bs=bs, shuffle=True, drop_last=True); tdl.phase = 'train'
    vdl = SleepyDL(items[n_train*bs:], bs=bs); vdl.phase = 'valid'
    learn = Learner(DataLoaders(tdl, vdl), SleepyModel(), loss_func=loss_func,
                    opt_func=lambda params, lr: SleepyOptimizer(params, [sgd_step], lr=lr))
    return quiet(learn),slept

def collect(trials:int=2, fits:int=2, floor_fits:int=2, n_train:int=60, n_valid:int=10, spin:bool=False, log=print) -> dict:
    "Per-phase means of both profilers, interleaved trials in fresh processes"
    try: fx = fastxtend_dir()
    except PredecessorUnavailable as e:
        log(f"[bench] PREDECESSOR UNAVAILABLE, its columns are left out: {e}")
        fx = None
    profs = ['fastprofile'] + (['fastxtend'] if fx else [])
    out = {p: [] for p in profs}
    for t in range(trials):
        for p in profs:
            r = run_worker({'kind':'accuracy', 'profiler':p, 'sleeps':SLEEPS, 'n_train':n_train, 'n_valid':n_valid,
                            'fits':fits, 'floor_fits':floor_fits, 'spin':spin}, predecessor=fx if p == 'fastxtend' else None)
            out[p] += r['fits']
            log(f"[bench] accuracy ({'busy-wait' if spin else 'sleep'}) trial {t+1}/{trials} {p} done")
    return {'spin': spin, 'trials': trials, 'fits': fits, 'n_train': n_train, 'n_valid': n_valid, 'results': out}

def tables(data:dict) -> str:
    "Markdown table: per phase, the sleep asked, and for each profiler the sleep measured in its run, its mean, error and floor"
    res = data['results']
    hdr = ['phase', 'wait asked']
    for p in res: hdr += [f'{p}: waited (timed in place)', f'{p}: mean', f'{p}: error µs (%)', f'{p}: no-wait mean µs', f'{p}: error − no-wait µs']
    rows,errs = [],{p: [] for p in res}
    for phase,step,sk in ROWS:
        key = f'{phase}_{step}'
        row = [f'{phase} {step}', f"{1e3*SLEEPS[sk]:.1f} ms"]
        for p,fs in res.items():
            floor = median([f['profiler_mean'][key] for f in fs if not f['sleep'] and key in f['profiler_mean']])
            fs = [f for f in fs if f['sleep'] and key in f['profiler_mean'] and key in f['slept_mean']]
            slept,m = median([f['slept_mean'][key] for f in fs]),median([f['profiler_mean'][key] for f in fs])
            e = median([f['profiler_mean'][key] - f['slept_mean'][key] for f in fs])  # paired within each fit
            errs[p].append(abs(e))
            row += [f"{1e3*slept:.3f} ms", f"{1e3*m:.3f} ms", f"{1e6*e:+.0f} ({100*e/slept:+.1f}%)", f"{1e6*floor:.0f}", f"{1e6*(e-floor):+.0f}"]
        rows.append(row)
    how = 'busy-waits (spins on `perf_counter`)' if data['spin'] else 'sleeps (`time.sleep`)'
    lines = [f"### Every phase {how} a known time", '',
             f"Per phase: {', '.join(f'{k} {1e3*v:g} ms' for k,v in SLEEPS.items())} (valid `predict` as forward). "
             f"{data['trials']} trials × {data['fits']} fits of {data['n_train']} train + {data['n_valid']} valid batches (bs 8) per profiler, "
             "each trial a fresh process. The truth is each fit's own waits, timed in place; the first batch of each phase is "
             "left out on both sides (warm-up / `drop_first_batch`). Error = profiler mean − waited mean within the same fit: "
             "it holds the phase's own work besides waiting (collating, the loss, fastai's event dispatch) and any profiler "
             "time that lands inside the phase. The no-wait mean is the same profiler's mean for that phase with every wait "
             "set to 0; error − no-wait is what that does not explain"
             + (" (after a real sleep the phase's own work runs slower: caches and CPU wake-up)." if not data['spin'] else '.')
             + " Medians over fits.", '', md_table(hdr, rows), '']
    for p,e in errs.items():
        lines.append(f"- {p}: error up to {1e6*max(e):.0f} µs, mean |error| {1e6*sum(e)/len(e):.0f} µs over {len(e)} phases.")
    return '\n'.join(lines) + '\n'

def main(log=print, raw:dict|None=None) -> str:
    "Both accuracy tables: real sleeps, and busy-waits (no wake-up effects)"
    sleep,spin = collect(log=log),collect(spin=True, log=log)
    if raw is not None: raw['accuracy_sleep'],raw['accuracy_busy_wait'] = sleep,spin
    return '## Accuracy\n\n' + tables(sleep) + '\n' + tables(spin)

if __name__ == '__main__': print(main())
