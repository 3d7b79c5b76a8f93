"The loader's transfer probe: deferred in the main process until the diagnosis reads it, cached per kind of batch, pickled as numbers; workers still probe; shared buffers reused only where no worker wrote"
import math, pickle, time
from types import SimpleNamespace
import pytest, torch
from fastai.basics import *
from fastai.data.core import TfmdDL
from fastai.test_utils import synth_learner
from fastprofile.learner import *
from fastprofile.engine.core import Facts, LoadTime
from fastprofile.engine.patches import Patches
from fastprofile.sinks.saving import load_profile
import fastprofile.probes.loading as loads

@pytest.fixture
def probes(monkeypatch):
    "A fresh per-process cache, and the batches `_transfer_probe` ran on"
    monkeypatch.setattr(loads, '_PROBES', {})
    ran,probe = [],loads._transfer_probe
    def spy(b, *args, **kwargs): ran.append(loads._signature(b)); return probe(b, *args, **kwargs)
    monkeypatch.setattr(loads, '_transfer_probe', spy)
    return ran

def fit(learn):
    learn.profile(show_report=False, logger_callback=None).fit(1)
    return learn.simple_profile

def test_main_process_probes_when_read(probes):
    "With no workers nothing is probed while training; the diagnosis's first read probes once, and a second call takes the cache"
    learn = synth_learner(n_trn=6, n_val=2)
    r = fit(learn)
    assert probes == [] and set(r.facts.loading) == {'train','valid'}
    d = r.section('Diagnosis')
    assert d is not None and len(probes) == 1  # train and valid batches are of one kind: one probe
    lt = r.facts.loading['train']
    assert lt.workers == 0 and 0 < lt.send < 1 and 0 < lt.receive < 1, lt
    assert (r.facts.loading['valid'].send, r.facts.loading['valid'].receive) == (lt.send, lt.receive) and len(probes) == 1
    lt2 = fit(learn).facts.loading['train']
    assert (lt2.send, lt2.receive) == loads._PROBES[probes[0]] and len(probes) == 1  # a known kind of batch: from the cache when read

def test_result_pickles_and_saves_numbers(probes, tmp_path):
    "A pickled or saved result carries the probe's numbers, never the kept batch"
    learn = synth_learner(n_trn=6, n_val=2)
    r = fit(learn)
    assert probes == [] and r.facts.loading['train']._probe is not None
    data = pickle.dumps(r)
    assert len(probes) == 1 and b'_transfer_cost' not in data and b'functools' not in data
    back = pickle.loads(data).facts.loading['train']
    assert back._probe is None and back == r.facts.loading['train'] and math.isfinite(back.send) and math.isfinite(back.receive)
    r2 = fit(learn)
    r2.save(tmp_path/'p.json')
    assert load_profile(tmp_path/'p.json').facts.loading == r2.facts.loading and len(probes) == 1

def test_unread_result_probes_nothing(probes):
    "Nobody reads the diagnosis: the probe never runs; the kept batch goes with the result"
    learn = synth_learner(n_trn=6, n_val=2)
    fit(learn); fit(learn)
    assert probes == []

class Items(torch.utils.data.Dataset):
    def __len__(self): return 32
    def __getitem__(self, i): return torch.randn(1),torch.randn(1)

def test_workers_probe_while_loading(probes):
    "A worker pays the transfer for every batch: it probes in its own process, and the result holds numbers at once"
    learn = synth_learner(data=DataLoaders(TfmdDL(Items(), bs=4, num_workers=1), TfmdDL(Items(), bs=4, num_workers=0), device='cpu'))
    lt = fit(learn).facts.loading['train']
    assert lt.workers == 1 and lt._probe is None and lt.send > 0 and lt.receive > 0, lt
    assert probes == []  # not in this process: the worker's

def test_buffers_reused_only_without_workers(monkeypatch):
    "A loader's shared buffer goes back for reuse after its call only if no worker could write it; a reused one starts at zero"
    monkeypatch.setattr(loads, '_FREE', [])
    learn = synth_learner(data=DataLoaders(TfmdDL(Items(), bs=4, num_workers=0), TfmdDL(Items(), bs=4, num_workers=1), device='cpu'))
    s = SimpleNamespace(patches=Patches())
    t = loads.LoadingProbe(learn); t.before_call(s)
    for dl in learn.dls[:2]:
        for b in dl: pass
    train,valid = t.timed['train'][1].buf,t.timed['valid'][1].buf
    t.contribute(Facts()); s.patches.restore()
    assert loads._FREE == [train] and t.timed == {}  # the worker's loader keeps its own
    t = loads.LoadingProbe(learn); t.before_call(s)
    assert t.timed['train'][1].buf is train and loads._FREE == [] and not any(train)
    s.patches.restore()
