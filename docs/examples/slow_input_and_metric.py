"The README's diagnosis example: a loader whose items take 1 ms to build, a metric that costs 20 ms per validation batch. Run: python docs/examples/slow_input_and_metric.py"
import time, torch
from torch import nn
from fastai.basics import *
from fastprofile.all import *

class SlowItems(torch.utils.data.Dataset):                  # a dataset whose items take 1 ms to build
    def __init__(self, n): self.x = torch.randn(n, 32); self.y = self.x.sum(1, keepdim=True)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): time.sleep(.001); return self.x[i], self.y[i]

class SlowMetric(AvgMetric):                                 # a metric that costs 20 ms per validation batch
    def accumulate(self, learn): time.sleep(.02); super().accumulate(learn)

def make_learner():
    "The example's learner: 2048 slow items in batches of 32, loaded in the main process; the slow metric"
    set_seed(0)
    dls = DataLoaders.from_dsets(SlowItems(2048), SlowItems(512), bs=32, num_workers=0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    return Learner(dls, model, loss_func=MSELossFlat(), metrics=SlowMetric(mae))

if __name__ == '__main__':
    learn = make_learner()
    with learn.no_bar(): learn.profile(logger_callback=None, plain=True).fit_one_cycle(2, 1e-3)
    with learn.no_bar(): print(check_advice(learn))  # apply the fix for a short window and measure it
