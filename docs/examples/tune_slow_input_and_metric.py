"The README's tune example: the learner of slow_input_and_metric.py (items that take 1 ms to build, loaded in the main process; a metric that costs 20 ms per validation batch), tuned and kept, then compared with itself before. Run: python docs/examples/tune_slow_input_and_metric.py"
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

set_seed(0)
dls = DataLoaders.from_dsets(SlowItems(2048), SlowItems(512), bs=32, num_workers=0)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
learn = Learner(dls, model, loss_func=MSELossFlat(), metrics=SlowMetric(mae))
with learn.no_bar(): learn.profile(logger_callback=None, show_report=False).fit_one_cycle(2, 1e-3)
learn.simple_profile.save('before.json')
res = learn.tune(apply=True, progress=False)                 # measure each change, keep the best, measured together
print(res.report.plain())
with learn.no_bar(): learn.profile(logger_callback=None, show_report=False).fit_one_cycle(2, 1e-3)
print(compare('before.json', learn, names=('before', 'tuned'), rows='main').plain())
