"The workload behind the 0.1.0 fixtures (`tests/fixtures/v0_1_0/`): its data functions live here so that the pickles can find them"
import torch
from fastai.basics import Datasets, Learner, MSELossFlat
from fastai.test_utils import RegModel

def x_of(i): return torch.tensor([float(i % 7)])
def y_of(i): return torch.tensor([2.*(i % 7) + 1])

def learner(path):
    "A 24 + 8 item regression learner, batches of 4"
    dls = Datasets(list(range(32)), [[x_of], [y_of]], splits=[list(range(24)), list(range(24, 32))]).dataloaders(bs=4)
    return Learner(dls, RegModel(), loss_func=MSELossFlat(), path=path)
