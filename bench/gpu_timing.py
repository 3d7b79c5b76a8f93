"""GPU timing modes vs known GPU costs (needs a CUDA GPU).

    python -m bench.gpu_timing [--batches 200] [--trials 3]

A workload whose forward, backward and optimizer step each spin the GPU for a calibrated time
(`torch.cuda._sleep`) is profiled with timing='wall', 'sync' and 'events', interleaved (none wall sync events ...).
Prints, per mode, the mean per phase (GPU column for events) against the known cost, and each mode's cost
per batch against an unprofiled run. `tests/test_gpu_timing.py` uses the same workload.
"""
import argparse, statistics, sys, time
import torch
from torch import nn

WANT = dict(forward=3., backward=6., opt_step=1.5)  # ms of GPU work per phase

def cycles_for(ms:dict) -> dict:
    "`torch.cuda._sleep` cycles for each phase's wanted milliseconds, calibrated on this GPU (after a warm-up; median of 3)"
    torch.cuda.init()
    torch.cuda._sleep(1_000_000); torch.cuda.synchronize()  # loads the kernel and wakes the clocks up
    rates = []
    for _ in range(3):
        s,e = torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
        s.record(); torch.cuda._sleep(20_000_000); e.record(); torch.cuda.synchronize()
        rates.append(20_000_000/s.elapsed_time(e))
    per_ms = statistics.median(rates)
    return {k:int(v*per_ms) for k,v in ms.items()}

class Spin(torch.autograd.Function):
    "Identity whose forward calls `spin(fwd)` and whose backward calls `spin(bwd)`"
    @staticmethod
    def forward(ctx, x, spin, fwd, bwd):
        ctx.spin,ctx.bwd = spin,bwd
        spin(fwd); return x.clone()
    @staticmethod
    def backward(ctx, g):
        ctx.spin(ctx.bwd); return g, None, None, None

class SpinLayer(nn.Module):
    "A layer that keeps the GPU busy for `fwd` cycles in forward and `bwd` in backward (`spin`: `torch.cuda._sleep`)"
    def __init__(self, fwd:int, bwd:int, spin=None): super().__init__(); self.fwd,self.bwd,self.spin = fwd,bwd,spin
    # put it after a layer with parameters: on an input that needs no grad, its backward never runs
    def forward(self, x): return Spin.apply(x, self.spin or torch.cuda._sleep, self.fwd, self.bwd)

def known_cost_learner(cycles:dict, spin=None, cuda:bool=True, n_batches:int=40, n_valid:int=4):
    "A fastai `Learner` whose forward, backward and optimizer step each call `spin(cycles[phase])` once per batch"
    from fastai.basics import Learner, OptimWrapper, MSELossFlat, set_seed
    from fastai.test_utils import synth_dbunch
    spin = spin or torch.cuda._sleep
    class SpinOpt(OptimWrapper):
        def step(self): spin(cycles['opt_step']); self.opt.step()
    set_seed(0)
    dls = synth_dbunch(bs=16, n_train=n_batches, n_valid=n_valid, cuda=cuda)
    model = nn.Sequential(nn.Linear(1, 1), SpinLayer(cycles['forward'], cycles['backward'], spin))
    return Learner(dls, model.cuda() if cuda else model, loss_func=MSELossFlat(), lr=1e-3,
                   opt_func=lambda params, lr: SpinOpt(params, torch.optim.SGD, lr=lr))

def main(argv=None):
    ap = argparse.ArgumentParser(); ap.add_argument('--batches', type=int, default=200); ap.add_argument('--trials', type=int, default=3)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_timing: no CUDA GPU here; this benchmark measures GPU timing modes and needs one."); return 0
    import fastprofile.all  # noqa: F401 (Learner.profile)
    cyc = cycles_for(WANT)
    from fastai.basics import Callback
    class Steady(Callback):
        "Seconds per training batch after the first `skip` (the profiler's calibration and warm-up left out)"
        order,skip = 2000,10
        def after_batch(self):
            if not self.training: return
            if self.iter == self.skip-1: torch.cuda.synchronize(); self.t0 = time.perf_counter()
        def after_train(self):
            torch.cuda.synchronize(); self.per_batch = (time.perf_counter()-self.t0)/(self.n_iter-self.skip)
    def run(mode):
        learn = known_cost_learner(cyc, n_batches=a.batches, n_valid=2)
        learn.add_cb(Steady())
        if mode != 'none': learn.profile(timing=mode, show_report=False, logger_callback=None)
        with learn.no_bar(): learn.fit(1)
        dt = learn.steady.per_batch
        res = learn.simple_profile_results.set_index(['Phase','Action','Step']) if mode != 'none' else None
        return dt, res, (learn.simple_profile_record.overhead_per_batch if mode != 'none' else 0.)
    modes = ['none','wall','sync','events']
    per = {m:[] for m in modes}; last = {}
    for t in range(a.trials):
        for m in modes:
            dt,res,ovh = run(m); per[m].append(dt); last[m] = (res, ovh)
    base = statistics.median(per['none'])
    print(f"# GPU timing modes ({torch.cuda.get_device_name()}, torch {torch.__version__}, {a.batches} batches x {a.trials} trials)\n")
    print("| phase | known | wall | sync | events (GPU) | events error vs sync |\n|---|---:|---:|---:|---:|---:|")
    for k,ms in WANT.items():
        w = last['wall'][0].loc[('train','batch',k),'Mean Duration']*1e3
        sy = last['sync'][0].loc[('train','batch',k),'Mean Duration']*1e3
        ev = last['events'][0].loc[('train','batch',k),'GPU Mean Duration']*1e3
        print(f"| {k} | {ms:.2f} ms | {w:.2f} ms | {sy:.2f} ms | {ev:.2f} ms | {100*(ev-sy)/sy:+.1f}% |")
    print("\n| mode | median step | vs no profiler | self-measured overhead |\n|---|---:|---:|---:|")
    for m in modes:
        med = statistics.median(per[m])
        print(f"| {m} | {med*1e3:.3f} ms | {100*(med/base-1):+.2f}% | {last[m][1]*1e6:.1f} µs |")
    return 0

if __name__ == '__main__': sys.exit(main())
