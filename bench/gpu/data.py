"Loaders and models for the GPU parts: fastai `DataLoader`s that hand out a fixed pool of host batches at a set pace"
from __future__ import annotations
import time
import torch
from torch import nn

class PoolBatch:
    "A `create_batch` that takes `t_load` seconds and returns the next batch of a fixed pool of host batches (copied in a worker)"
    def __init__(self,
        pool:list, # Host batches (tuples of tensors), pinned or not
        t_load:float=0., # Seconds each batch takes to "load" (in the loader's worker, or the main process with no workers)
    ): self.pool,self.t_load,self.i = pool,t_load,0
    def __call__(self, items):
        t0 = time.perf_counter()
        b = self.pool[self.i % len(self.pool)]; self.i += 1
        # in a worker, a fresh copy, as a real collate makes: the pinned variants with workers aborted their workers on an
        # H200 when the pool's own tensors (made before the fork) went back through the queue (not yet re-run on a GPU)
        if torch.utils.data.get_worker_info() is not None: b = tuple(t.clone() for t in b)
        left = self.t_load - (time.perf_counter() - t0)
        if left > 0: time.sleep(left)
        return b

def image_pool(n:int, bs:int, size:int, pin:bool=False, n_out:int=10, seed:int=0) -> list:
    "`n` batches of `bs` uint8 RGB images of side `size` with class labels, as fastai's `TensorImage`/`TensorCategory`"
    from fastai.torch_core import TensorImage, TensorCategory
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, 256, (bs, 3, size, size), dtype=torch.uint8, generator=g)
        y = torch.randint(0, n_out, (bs,), generator=g)
        if pin: x,y = x.pin_memory(),y.pin_memory()
        out.append((TensorImage(x), TensorCategory(y)))
    return out

def tensor_pool(n:int, shape:tuple, pin:bool=False, n_out:int=10, seed:int=0) -> list:
    "`n` batches of float inputs of `shape` (batch first) with class labels"
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x,y = torch.randn(*shape, generator=g),torch.randint(0, n_out, (shape[0],), generator=g)
        if pin: x,y = x.pin_memory(),y.pin_memory()
        out.append((x, y))
    return out

def image_tfms():
    "The usual fastai GPU batch transforms of images: `IntToFloatTensor` and `Normalize` (moved to the device by the loader)"
    from fastai.data.transforms import IntToFloatTensor, Normalize
    return [IntToFloatTensor(), Normalize.from_stats([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], cuda=False)]

def pool_dls(pool:list, n_batches:int, t_load:float=0., workers:int=0, pin:bool=False, after_batch=None,
             device='cuda', n_valid:int=1):
    "fastai `DataLoaders`: `n_batches` training batches from `pool` at `t_load` seconds each, `n_valid` validation batches"
    from fastai.data.core import TfmdDL, DataLoaders
    bs = len(pool[0][0])
    def mk(n, w, t):
        return TfmdDL(list(range(n*bs)), bs=bs, num_workers=w, pin_memory=pin, after_batch=after_batch,
                      create_batch=PoolBatch(pool, t), persistent_workers=False)
    return DataLoaders(mk(n_batches, workers, t_load), mk(n_valid, 0, 0.), device=device)

class MeanPool(nn.Module):
    "Mean over the sequence dimension (1)"
    def forward(self, x): return x.mean(1)

def conv_net(channels:int, depth:int, spin:int=0, n_out:int=10) -> nn.Module:
    "A plain conv net: a stride-4 stem, `depth` 3x3 convs of `channels`, then `spin` GPU cycles in forward and backward"
    from bench.gpu_timing import SpinLayer
    if channels == 0:  # no compute: what fastai's loop costs around a model that does nothing
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, n_out))
    layers = [nn.Conv2d(3, channels, 4, stride=4), nn.ReLU()]
    for _ in range(depth): layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
    if spin: layers.append(SpinLayer(spin, spin))  # after a layer with parameters: its backward runs
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, n_out))

def transformer(d:int, heads:int, layers:int, n_out:int=10) -> nn.Module:
    "`layers` standard transformer encoder blocks of width `d`, mean-pooled, then a linear head"
    block = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4*d, dropout=0., batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(block, layers, enable_nested_tensor=False), MeanPool(), nn.Linear(d, n_out))

def mlp(n_in:int, width:int, depth:int, n_out:int=10) -> nn.Module:
    "`depth` hidden layers of `width` with ReLU"
    layers,n = [],n_in
    for _ in range(depth): layers += [nn.Linear(n, width), nn.ReLU()]; n = width
    return nn.Sequential(*layers, nn.Linear(n, n_out))

def learner(dls, model, cbs=None, lr:float=1e-3):
    "A fastai `Learner` with cross-entropy and SGD with momentum"
    from functools import partial
    from fastai.learner import Learner
    from fastai.losses import CrossEntropyLossFlat
    from fastai.optimizer import SGD
    return Learner(dls, model, loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=lr, cbs=cbs)
