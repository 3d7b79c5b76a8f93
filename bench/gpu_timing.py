"""The known-cost GPU workload: forward, backward and optimizer step each spin the GPU for a calibrated time.

`tests/test_gpu_timing.py` and the `timing` part of the GPU suite (`bench.gpu.timing`, workload 'known-cost') use it.
`python -m bench gpu --out DIR --parts timing` runs that part alone.
"""
import statistics
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
