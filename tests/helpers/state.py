"""What a profiled call may leave behind: nothing. `learner_state` pictures a fastai `Learner` (and the fastai functions
and classes it runs) so that two pictures compare; `twin_diff` compares a profiled run against the same run without
the profiler (its unprofiled twin); `outcome` and `outcome_diff` compare what the training computed, bit for bit."""
from __future__ import annotations
import math, random
from dataclasses import dataclass
from pathlib import Path
import numpy as np, torch
from torch import nn
import fastai.callback.core, fastai.data.core, fastai.data.load, fastai.learner, fastai.optimizer, fastai.torch_core
from fastai.basics import *

__all__ = ['Token', 'learner_state', 'state_diff', 'twin_diff', 'rng_states', 'outcome', 'outcome_diff']

# Modules and classes whose functions fastai's training loop runs: none may be replaced after a profiled call
FASTAI_MODULES = (fastai.data.load, fastai.torch_core, fastai.learner, fastai.callback.core, fastai.data.core, fastai.optimizer)
FASTAI_CLASSES = (Learner, Callback, DataLoader, TfmdDL, DataLoaders, Datasets, TfmdLists, Pipeline, Transform, Recorder,
                  TrainEvalCallback, Optimizer, OptimWrapper, Metric, AvgMetric, AvgLoss, AvgSmoothLoss, nn.Module)
_GLOBAL_HOOKS = [k for k in vars(torch.nn.modules.module) if k.startswith('_global') and k.endswith('hooks')]

@dataclass(eq=False)
class Token:
    "One attribute's value as a picture holds it: a plain value (`val`), or the object itself (`obj`) and its length if it has one"
    kind:str # 'val': None, bool, int, float, str, bytes, Path (compared by value); 'obj': anything else (compared by identity)
    value:object # The value or the object (kept alive, so an identity is never reused)
    size:int|None=None # `len(value)` for a container (a hook dict, a list of callbacks); None otherwise

    def same(self, o:Token, ids:bool=True) -> bool:
        "Same value; for objects the same object (`ids`) or, across twins, the same type and length"
        if self.kind != o.kind or self.size != o.size: return False
        if self.kind == 'obj': return self.value is o.value if ids else type(self.value) is type(o.value)
        a,b = self.value,o.value
        if isinstance(a, float) and isinstance(b, float):
            if not ids: return True  # a float can be a clock reading (Recorder.start_epoch): across twins, the type only
            return a == b or (math.isnan(a) and math.isnan(b))
        return type(a) is type(b) and a == b

    def __repr__(self):
        if self.kind == 'val': return repr(self.value)
        return f"<{type(self.value).__name__} at {id(self.value):#x}{'' if self.size is None else f', len {self.size}'}>"

def _token(v) -> Token:
    if v is None or isinstance(v, (bool, int, float, str, bytes, Path)): return Token('val', v)
    size = None
    if isinstance(v, (dict, list, tuple, set, frozenset, L)):
        try: size = len(v)
        except Exception: pass
    return Token('obj', v, size)

def _attrs(o) -> dict:
    "An object's instance attributes (`__dict__`; those in `__slots__` too)"
    d = dict(getattr(o, '__dict__', {}))
    for k in getattr(type(o), '__slots__', ()):
        if k not in d and hasattr(o, k): d[k] = getattr(o, k)
    return {k:_token(v) for k,v in d.items()}

def _objects(learn) -> dict:
    "Every object of the learner a profiler could touch, by a name that is the same in its twin"
    objs = {'learn':learn}
    for i,cb in enumerate(learn.cbs):
        objs[f'cbs[{i}]:{type(cb).__name__}'] = cb
        for k,v in list(vars(cb).items()):  # metrics a callback holds (Recorder's loss and smooth loss)
            if isinstance(v, Metric): objs[f'cbs[{i}]:{type(cb).__name__}.{k}'] = v
    for i,m in enumerate(L(getattr(learn, 'metrics', None))): objs[f'metrics[{i}]:{type(m).__name__}'] = m
    dls = getattr(learn, 'dls', None)
    if dls is not None:
        objs['dls'] = dls
        for name in ('train', 'valid'):
            try: dl = getattr(dls, name)
            except Exception: continue
            objs[f'dls.{name}'] = dl
            for k in ('fake_l', 'dataset', 'after_item', 'before_batch', 'after_batch'):
                v = dl.__dict__.get(k, None)
                if v is not None: objs[f'dls.{name}.{k}'] = v
    for name,m in learn.model.named_modules(): objs[f'model.{name}' if name else 'model'] = m
    for k in ('opt', 'loss_func'):
        v = learn.__dict__.get(k)
        if v is not None: objs[k] = v
    return objs

def learner_state(learn) -> dict:
    "A picture of `learn`: section name -> {attribute: `Token`}, for `state_diff` and `twin_diff`"
    # Sections: the learner, each callback (by position and type, so `learn.cbs` is compared too), each metric, the
    # DataLoaders, the train and valid loaders, their `_FakeLoader`, dataset and pipelines, the model's modules (hook dicts
    # by length), the optimizer and loss; the classes of all these; fastai's module functions; torch's global module hooks
    objs,state = _objects(learn),{}
    for name,o in objs.items(): state[name] = _attrs(o)
    state['learn.cbs'] = {i:_token(cb) for i,cb in enumerate(learn.cbs)} | {'list':_token(learn.cbs)}
    classes = {type(o) for o in objs.values()} | set(FASTAI_CLASSES)
    for cls in sorted(classes, key=lambda c: f'{c.__module__}.{c.__qualname__}'):
        state[f'class {cls.__module__}.{cls.__qualname__}'] = {k:_token(v) for k,v in vars(cls).items() if k != '__dict__'}
    for mod in FASTAI_MODULES:
        state[f'module {mod.__name__}'] = {k:_token(v) for k,v in vars(mod).items() if callable(v)}
    state['torch global hooks'] = {k:_token(getattr(torch.nn.modules.module, k)) for k in _GLOBAL_HOOKS}
    return state

def state_diff(a:dict, b:dict, ids:bool=True) -> list:
    "What differs between pictures `a` and `b` (of one learner with `ids`; of twins without: types and lengths only)"
    out = []
    for s in sorted(set(a) | set(b), key=str):
        if s not in a or s not in b: out.append(f"{s}: {'only in the first' if s in a else 'only in the second'}"); continue
        x,y = a[s],b[s]
        for k in sorted(set(x) | set(y), key=str):
            if k not in x or k not in y: out.append(f"{s}.{k}: {'only in the first' if k in x else 'only in the second'}")
            elif not x[k].same(y[k], ids): out.append(f"{s}.{k}: {x[k]!r} then {y[k]!r}")
    return out

def twin_diff(p0:dict, p1:dict, t0:dict, t1:dict, allow=('simple_profile',)) -> list:
    "What a profiled run left behind that its unprofiled twin did not (`p0`/`p1`: before `profile()` and after; `t0`/`t1`: the twin's)"
    # The same sections and attribute names as the twin's (the learner may keep `allow`, where the result lives). An
    # attribute the twin's training left as it was must be the very same object (or value) as before `profile()`; one that
    # the twin's training set (fastai's `epoch`, `loss`, `pred`, the Recorder's lists) must match the twin's in type and
    # length, and in value for ints, strings and flags.
    out = []
    for s in sorted(set(p1) | set(t1), key=str):
        if s not in p1: out.append(f"{s}: gone (the twin has it)"); continue
        if s not in t1: out.append(f"{s}: left behind (the twin has none)"); continue
        a,b = p1[s],t1[s]
        for k in sorted(set(a) | set(b), key=str):
            if k not in b:
                if not (s == 'learn' and k in allow): out.append(f"{s}.{k}: left behind ({a[k]!r}; the twin has none)")
                continue
            if k not in a: out.append(f"{s}.{k}: gone (the twin has {b[k]!r})"); continue
            fit_set = s not in t0 or k not in t0[s] or not t0[s][k].same(b[k])
            if fit_set:
                if not a[k].same(b[k], ids=False): out.append(f"{s}.{k}: {a[k]!r}, the twin {b[k]!r}")
            else:
                was = p0.get(s, {}).get(k)
                if was is None: out.append(f"{s}.{k}: added ({a[k]!r}); the twin had it before its training")
                elif not was.same(a[k]): out.append(f"{s}.{k}: was {was!r} before profile(), now {a[k]!r}")
    return out

def rng_states() -> tuple:
    "The states of torch's, numpy's and Python's random number generators"
    return torch.get_rng_state().clone(), np.random.get_state(), random.getstate()

def _num(v) -> str:
    "A number as a string that compares bit for bit (NaN equal to NaN)"
    try: return float(v).hex()
    except Exception: return repr(v)

def outcome(learn) -> dict:
    "What the training computed: losses, recorder values, final weights, and the random number generators' states after it"
    rec = getattr(learn, 'recorder', None)
    return dict(losses=[_num(v) for v in L(getattr(rec, 'losses', []))],
                values=[[_num(x) for x in v] for v in getattr(rec, 'values', [])],
                weights={k:v.detach().clone() for k,v in learn.model.state_dict().items()}, rng=rng_states())

def outcome_diff(a:dict, b:dict) -> list:
    "What differs between two `outcome`s"
    out = [k for k in ('losses', 'values') if a[k] != b[k]]
    if a['weights'].keys() != b['weights'].keys() or not all(torch.equal(v, b['weights'][k]) for k,v in a['weights'].items()):
        out.append('weights')
    (ta,na,ra),(tb,nb,rb) = a['rng'],b['rng']
    if not torch.equal(ta, tb): out.append('torch rng')
    if not (na[0] == nb[0] and np.array_equal(na[1], nb[1]) and tuple(na[2:]) == tuple(nb[2:])): out.append('numpy rng')
    if ra != rb: out.append('random rng')
    return out
