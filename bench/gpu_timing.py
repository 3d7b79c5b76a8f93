"""GPU timing modes vs known GPU costs (needs a CUDA GPU).

    python -m bench.gpu_timing [--batches 200]

A workload whose forward, backward and optimizer step each spin the GPU for a calibrated time
(`torch.cuda._sleep`) is profiled with timing='wall', 'sync' and 'events', interleaved (wall sync events wall ...).
Prints, per mode, the mean per phase (GPU column for events) against the known cost, and each mode's cost
per batch against an unprofiled run.
"""
import argparse, statistics, sys, time
import torch
from torch import nn

def main(argv=None):
    ap = argparse.ArgumentParser(); ap.add_argument('--batches', type=int, default=200); ap.add_argument('--trials', type=int, default=3)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gpu_timing: no CUDA GPU here; this benchmark measures GPU timing modes and needs one."); return 0
    from fastai.basics import Learner, OptimWrapper, MSELossFlat, DataLoaders, set_seed
    from fastai.test_utils import synth_dbunch
    from fastprofile.all import SimpleProfilerCallback
    s,e = torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
    s.record(); torch.cuda._sleep(20_000_000); e.record(); torch.cuda.synchronize()
    per_ms = 20_000_000/s.elapsed_time(e)
    want = dict(forward=3., backward=6., opt_step=1.5)
    cyc = {k:int(v*per_ms) for k,v in want.items()}
    class Spin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): torch.cuda._sleep(cyc['forward']); return x.clone()
        @staticmethod
        def backward(ctx, g): torch.cuda._sleep(cyc['backward']); return g
    class M(nn.Module):
        def __init__(self): super().__init__(); self.lin = nn.Linear(1,1)
        def forward(self, x): return self.lin(Spin.apply(x))
    class SpinOpt(OptimWrapper):
        def step(self): torch.cuda._sleep(cyc['opt_step']); self.opt.step()
    def run(mode):
        set_seed(0)
        dls = synth_dbunch(bs=16, n_train=a.batches, n_valid=2, cuda=True)
        learn = Learner(dls, M().cuda(), loss_func=MSELossFlat(), opt_func=lambda p, lr: SpinOpt(p, torch.optim.SGD, lr=lr), lr=1e-3)
        if mode != 'none': learn.profile(timing=mode, show_report=False, logger_callback=None)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        with learn.no_bar(): learn.fit(1)
        torch.cuda.synchronize(); dt = (time.perf_counter()-t0)/a.batches
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
    for k,ms in want.items():
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
