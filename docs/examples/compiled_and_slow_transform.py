"The README's torch.compile and batch-transform examples, on the CPU. (1) An MLP profiled uncompiled, then `torch.compile`d: compile time apart from the steady state, recompiles with their reason, when compiling pays back. (2) An `after_batch` transform that takes 25 ms in the main process: named, its move into the loader's workers predicted, then applied and measured. Run: python docs/examples/compiled_and_slow_transform.py"
import time, torch
from torch import nn
from fastai.basics import *
from fastai.data.core import TfmdDL
from fasttransform import Transform
from fastprofile.all import *

class Pairs(torch.utils.data.Dataset):                      # 16 features -> their sum
    def __init__(self, n): self.x = torch.randn(n, 16); self.y = self.x.sum(1, keepdim=True)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return self.x[i], self.y[i]

def mlp(): return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

# (1) torch.compile: 40 training batches of 64 and a partial one of 16, 10 validation batches
set_seed(0)
dls = DataLoaders(TfmdDL(Pairs(64*40 + 16), bs=64, shuffle=True, num_workers=0), TfmdDL(Pairs(64*10), bs=64, num_workers=0))
learn = Learner(dls, mlp(), loss_func=MSELossFlat())
with learn.no_bar(): learn.profile(logger_callback=None, show_report=False).fit_one_cycle(2, 1e-3)  # uncompiled: the baseline
learn.model = torch.compile(learn.model)
with learn.no_bar(): learn.profile(logger_callback=None, plain=True).fit_one_cycle(2, 1e-3)

# (2) a batch transform that takes 25 ms: fastai runs a loader's `after_batch` in the main process
class SlowTfm(Transform):
    def __call__(self, b, **kwargs): time.sleep(.025); return b

set_seed(0)
dls = DataLoaders(TfmdDL(Pairs(64*60), bs=64, shuffle=True, num_workers=0, after_batch=[SlowTfm()]),
                  TfmdDL(Pairs(64*10), bs=64, num_workers=0, after_batch=[SlowTfm()]))
learn = Learner(dls, mlp(), loss_func=MSELossFlat())
with learn.no_bar(): learn.profile(logger_callback=None, plain=True).fit_one_cycle(1, 1e-3)
with learn.no_bar(): print(check_advice(learn, n_batches=50, n_valid=5, resource='batch_tfms'))  # apply the move, measure it
