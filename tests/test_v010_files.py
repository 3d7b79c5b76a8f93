"Files written by fastprofile 0.1.0 (`tests/fixtures/v0_1_0/`, made by its `make.py` at the 0.1.0 code, before the subpackages) keep working: a saved profile loads and compares, exported learners load and train"
import json, re, shutil, warnings, zipfile
from pathlib import Path
import pytest
from fastai.basics import load_learner
from fastprofile.all import *
from helpers.v010 import learner

V010 = Path(__file__).parent/'fixtures'/'v0_1_0'

def _modules(name) -> set:
    "The fastprofile modules a pickle written by `learn.export` names"
    z = zipfile.ZipFile(V010/name)
    return {m.decode() for m in re.findall(rb'fastprofile(?:\.[a-z_]+)+', z.read(next(n for n in z.namelist() if n.endswith('data.pkl'))))}

def _calls(df): return df.set_index(['Phase','Action','Step'])

def _load(name, tmp_path):
    shutil.copy(V010/name, tmp_path/name)  # a copy: fitting writes nothing next to the fixture
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)  # fastai's warning about pickles
        learn = load_learner(tmp_path/name)
    learn.dls = learner(tmp_path).dls  # `export` keeps empty loaders
    return learn

def test_the_fixtures_name_the_old_module_paths():
    "The pickles and the JSON were written before the move: they name `fastprofile.callback`, `fastprofile.core`, ... (else this file tests nothing)"
    assert {'fastprofile.core', 'fastprofile.record', 'fastprofile.costs', 'fastprofile.diagnosis'} <= _modules('after.pkl')
    assert {'fastprofile.callback', 'fastprofile.core', 'fastprofile.costs', 'fastprofile.compiles'} <= _modules('armed.pkl')
    assert json.loads((V010/'profile.json').read_text())['versions']['fastprofile'] == '0.1.0'

def test_a_saved_profile_loads_and_compares(tmp_path):
    p = load_profile(V010/'profile.json')
    r = _calls(p.results)
    assert r.loc[('train','batch','forward'),'Number of Calls'] == 2*(6 - 1)  # 2 epochs of 6 batches, the first of each the warm-up
    assert 'Diagnosis' in p.report.plain()
    learn = learner(tmp_path)
    learn.profile(show_report=False, logger_callback=None).fit(2)
    c = compare(V010/'profile.json', learn, names=('0.1.0', 'now'))
    assert '0.1.0' in c.plain() and 'forward' in c.plain()
    # each side's numbers are its own profile's: train/batch/forward's mean before is the old file's, after this fit's
    row,now = _calls(c.table).loc[('train','batch','forward')],_calls(learn.simple_profile_results).loc[('train','batch','forward')]
    assert row['Mean 0.1.0'] == r.loc[('train','batch','forward'),'Mean Duration'] and row['Mean now'] == now['Mean Duration'], row
    assert row['Mean 0.1.0'] != row['Mean now']  # two different runs (the same batch size: the means per call are compared)

def test_a_learner_exported_after_a_profiled_fit_loads_and_trains(tmp_path):
    learn = _load('after.pkl', tmp_path)
    assert _calls(learn.simple_profile_results).loc[('train','batch','forward'),'Number of Calls'] == 2*(6 - 1)
    f = learn.simple_profile.facts  # 0.1.0 kept a `Facts` field per probe: they unpickle under the probes' keys
    assert {'loading', 'layers', 'callback_costs'} <= set(f.extra) and not {'loading', 'layers'} & set(f.__dict__)
    assert f.loading['train'].workers == 2 and f.layers.batches and f.breakdown is None
    assert 'Diagnosis' in learn.simple_profile.report.plain()
    learn.fit(1)
    assert not [cb for cb in learn.cbs if type(cb).__module__.startswith('fastprofile')]
    learn.profile(show_report=False, logger_callback=None).fit(1)
    assert _calls(learn.simple_profile_results).loc[('train','batch','forward'),'Number of Calls'] == 6 - 1

def test_a_learner_exported_while_armed_loads_and_its_next_fit_works(tmp_path):
    "0.1.0 crashed here in the cost sampler (`'NoneType' object has no attribute 'set'`): the sampler travels in the pickle, its session did not"
    learn = _load('armed.pkl', tmp_path)
    pair = [type(cb).__name__ for cb in learn.cbs if type(cb).__module__.startswith('fastprofile')]
    assert pair == ['SimpleProfilerCallback', 'SimpleProfilerPostCallback']
    learn.fit(2)  # the pair profiles each fit, as a pair added by hand does
    r = _calls(learn.simple_profile_results)
    assert r.loc[('train','batch','forward'),'Number of Calls'] == 2*(6 - 1)
    assert len(learn.recorder.values) == 2
