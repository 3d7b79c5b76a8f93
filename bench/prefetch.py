"""Throughput of `CudaPrefetchCallback` against the plain fastai loop and against the ideal bound (GPU only).

    python -m bench.prefetch                      # the three regimes below (from the repository root)
    python -m bench.prefetch --regime balanced --batches 60 --json out.json

Synthetic pinned uint8 image batches come from a fastai `DataLoader` whose `W` workers each take `t_load`
seconds per batch; the GPU `after_batch` is `IntToFloatTensor` + `Normalize`; a conv net has tunable compute.
Each part is first measured alone:

- `T_load` = t_load / W (and the loader's measured rate, without any GPU work),
- `T_h2d`: copying one pinned batch to the GPU; `T_tfm`: `after_batch` on the GPU (CUDA events),
- `T_comp`: forward, backward and optimizer step on a staged batch (CUDA events),
- `T_host`: fastai's per-batch host work (callbacks, the Recorder's sync) with the data already staged and a
  model that does no work.

Then the training throughput without (R0) and with (R1) the callback, in batches/s over the training batches
after `--skip` warm-up batches, and the ideal bound B1 = 1 / max(T_load, T_h2d + T_tfm, T_comp + T_host).
In the 'balanced' regime the model's depth is chosen at run time, the smallest whose T_comp reaches
T_h2d + T_tfm on this GPU, and the workers' load time is set so that T_load is half of that; the other two
regimes use fixed settings. The printed component times say which bound actually holds on your GPU (tune
with --t-load, --workers, --size, --channels, --depth). R0 and R1 are interleaved over --trials runs (medians).
"""
import argparse, functools, json, math, statistics, sys, time
import torch
from torch import nn
from fastai.basics import *
from fastai.data.core import TfmdDL
from fastai.data.transforms import IntToFloatTensor, Normalize

REGIMES = {
    # t_load: seconds per batch in one worker; size: image side; channels/depth: the model's compute
    'balanced':      dict(t_load=None, workers=6, size=192, channels=64, depth=None),  # None: calibrated, see above
    'load-bound':    dict(t_load=0.300, workers=4, size=192, channels=128, depth=4),
    'compute-bound': dict(t_load=0.020, workers=6, size=128, channels=256, depth=10),
}


class SlowBatch:
    "A `create_batch` that takes `t_load` seconds and returns a fresh uint8 image batch with labels"
    def __init__(self, bs, size, t_load):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (bs, 3, size, size), dtype=torch.uint8, generator=g)
        self.y = torch.randint(0, 10, (bs,), generator=g)
        self.t_load = t_load
    def __call__(self, items):
        t0 = time.perf_counter()
        x,y = TensorImage(self.x.clone()),TensorCategory(self.y.clone())
        time.sleep(max(0., self.t_load - (time.perf_counter()-t0)))
        return (x, y)


def make_dls(bs, size, t_load, workers, n_batches, device='cuda'):
    "Pinned train loader of `n_batches` slow batches (and a one-batch valid loader) with GPU transforms"
    tfms = [IntToFloatTensor(), Normalize.from_stats([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], cuda=device=='cuda')]
    mk = lambda n, w: TfmdDL(list(range(n*bs)), bs=bs, num_workers=w, pin_memory=device=='cuda', after_batch=tfms,
                              create_batch=SlowBatch(bs, size, t_load), persistent_workers=False)
    return DataLoaders(mk(n_batches, workers), mk(1, 0), device=device)


def make_model(channels, depth):
    layers = [nn.Conv2d(3, channels, 4, stride=4), nn.ReLU()]
    for _ in range(depth): layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


@functools.lru_cache(None)
def _hold_cycles(ms=100.):
    from bench.gpu_timing import cycles_for
    return cycles_for(dict(hold=ms))['hold']


def cuda_time(f, n=20, warmup=3):
    "Mean GPU seconds of `f()` on the current stream, by CUDA events; the GPU starts only once all `n` calls are queued"
    for _ in range(warmup): f()
    s,e = torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(_hold_cycles())  # holds the GPU while the host queues: no host time in the span
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e)/1e3/n


class Rate(Callback):
    "Training batches per second after `skip` warm-up batches"
    order = 100
    def __init__(self, skip=5): self.skip = skip
    def before_train(self): self.t0,self.n = None,0
    def after_batch(self):
        if not self.training: return
        if self.iter==self.skip-1: torch.cuda.synchronize(); self.t0 = time.perf_counter()
        elif self.iter>=self.skip: self.n += 1
    def after_train(self):
        torch.cuda.synchronize()
        self.per_s = self.n/(time.perf_counter()-self.t0) if self.t0 and self.n else float("nan")


class StagedBatches:
    "A loader of `n` copies of one batch already on the GPU"
    def __init__(self, b, n): self.b,self.n = b,n
    def __len__(self): return self.n
    def __iter__(self): return (self.b for _ in range(self.n))


def learner(dls, model, cbs=None):
    return Learner(dls, model, loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=1e-3, cbs=cbs)


def measure(regime, bs, n_batches, skip, t_load, workers, size, channels, depth, trials=3):
    from fastprofile.prefetch import CudaPrefetchCallback
    if t_load is None or depth is None: t_load,depth = balance(bs, size, workers, channels, t_load, depth)
    dls = make_dls(bs, size, t_load, workers, n_batches)
    dl = dls.train
    model = make_model(channels, depth).cuda()
    # the loader alone, without GPU work: its own rate
    host_dl = dl.new(device=None, after_batch=None)
    it = iter(host_dl); b = next(it); t0 = time.perf_counter(); k = 0
    for b in it: k += 1
    t_load_measured = (time.perf_counter()-t0)/max(k, 1)
    t_h2d,t_tfm,(xb,yb) = transfer_times(dl, b)
    t_comp = compute_time(model, xb, yb)
    # fastai's host work alone: staged data, a model that does no work
    idle = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 10)).cuda()
    hl = learner(DataLoaders(StagedBatches((xb, yb), n_batches), StagedBatches((xb, yb), 1), device='cuda'), idle,
                 cbs=Rate(skip))
    with hl.no_logging(): hl.fit(1)
    t_host = 1/hl.rate.per_s
    # the loop without and with prefetch, interleaved (R0 R1 R0 R1 ...): medians
    rates = {'R0': [], 'R1': []}
    for _ in range(trials):
        for name in ('R0', 'R1'):
            cbs = [Rate(skip)] + ([CudaPrefetchCallback()] if name == 'R1' else [])
            l = learner(dls, make_model(channels, depth).cuda(), cbs=cbs)
            with l.no_logging(): l.fit(1)
            rates[name].append(l.rate.per_s)
            if name=='R1': assert l.cuda_prefetch.active
            del l; torch.cuda.empty_cache()
    r0,r1 = statistics.median(rates['R0']),statistics.median(rates['R1'])
    T_load = t_load/workers
    b1 = 1/max(T_load, t_h2d+t_tfm, t_comp+t_host)
    return dict(regime=regime, bs=bs, t_load=t_load, workers=workers, depth=depth, T_load=T_load,
                T_load_measured=t_load_measured, T_h2d=t_h2d, T_tfm=t_tfm, T_comp=t_comp, T_host=t_host,
                R0=r0, R1=r1, R0_trials=rates['R0'], R1_trials=rates['R1'], B1=b1, R1_R0=r1/r0, R1_B1=r1/b1)


def transfer_times(dl, b):
    "GPU seconds to copy the host batch `b` (pinned) to the GPU, and to run `dl`'s `after_batch` on it; the batch made"
    hb = tuple(o.pin_memory() for o in b)
    t_h2d = cuda_time(lambda: [o.to('cuda', non_blocking=True) for o in hb])
    gb = tuple(o.to('cuda') for o in hb)
    return t_h2d,cuda_time(lambda: dl.after_batch(gb)),dl.after_batch(gb)


def compute_time(model, xb, yb, n=20):
    "GPU seconds of one training step of `model` (forward, loss, backward, SGD step, zero_grad) on a staged batch"
    loss_func,opt = CrossEntropyLossFlat(),SGD(model.parameters(), lr=1e-3, mom=0.9)
    def step():
        loss = loss_func(model(xb), yb); loss.backward(); opt.step(); opt.zero_grad()
    return cuda_time(step, n=n)


def balance(bs, size, workers, channels, t_load=None, depth=None, max_depth=16):
    "The smallest depth whose compute reaches the copy and transforms (T_h2d + T_tfm), and a t_load for T_load = half that"
    dl = make_dls(bs, size, 0., 0, 2).train
    t_h2d,t_tfm,(xb,yb) = transfer_times(dl, next(iter(dl.new(device=None, after_batch=None))))
    if depth is None:
        for depth in range(max_depth + 1):
            if compute_time(make_model(channels, depth).cuda(), xb, yb, n=5) >= t_h2d + t_tfm: break
    if t_load is None: t_load = workers*(t_h2d + t_tfm)/2
    return t_load,depth


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--regime', default='all', choices=['all', *REGIMES])
    p.add_argument('--bs', type=int, default=64)
    p.add_argument('--batches', type=int, default=50, help='training batches per run')
    p.add_argument('--skip', type=int, default=5, help='warm-up batches left out of the rates')
    for k in ('t_load', 'workers', 'size', 'channels', 'depth'):
        p.add_argument('--'+k.replace('_','-'), type=type(REGIMES['load-bound'][k]), default=None,
                       help='override the regime setting')
    p.add_argument('--trials', type=int, default=3, help='interleaved runs of R0 and R1 (medians)')
    p.add_argument('--json', default=None, help='also write the results to this file')
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench.prefetch needs a CUDA GPU: prefetching is a pass-through on CPU, so there is nothing to measure")
    res = []
    for name in (REGIMES if a.regime=='all' else [a.regime]):
        cfg = {k: (getattr(a, k) if getattr(a, k) is not None else v) for k,v in REGIMES[name].items()}
        res.append(measure(name, a.bs, a.batches, a.skip, trials=a.trials, **cfg))
    ms = lambda s: f"{s*1e3:.1f} ms"
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, bs {a.bs}, {a.batches} batches\n")
    print("| regime | T_load | T_h2d | T_tfm | T_comp | T_host | R0 | R1 | B1 | R1/R0 | R1/B1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['regime']} | {ms(r['T_load'])} (measured {ms(r['T_load_measured'])}) | {ms(r['T_h2d'])} | "
              f"{ms(r['T_tfm'])} | {ms(r['T_comp'])} | {ms(r['T_host'])} | {r['R0']:.1f} batches/s | "
              f"{r['R1']:.1f} batches/s | {r['B1']:.1f} batches/s | {r['R1_R0']:.2f}x | {r['R1_B1']:.0%} |")
    if a.json:
        clean = lambda v: None if isinstance(v, float) and math.isnan(v) else v  # strict JSON: no NaN
        out = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, bs=a.bs, batches=a.batches, trials=a.trials,
                   results=[{k:(clean(v) if not isinstance(v, list) else [clean(x) for x in v]) for k,v in r.items()} for r in res])
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == '__main__': main()
