"Loggers read back from real files: wandb offline runs (the `.wandb` log and table files), TensorBoard event files; failing loggers"
import json, os, subprocess, sys, warnings
from pathlib import Path
import numpy as np, pandas as pd
import pytest
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.callback import SimpleProfilerCallback
import fastprofile.wandb as fpw
import fastprofile.tensorboard  # noqa: F401 (adds the tensorboard logger)
from helpers.wandb_reader import WandbRun

wandb = pytest.importorskip('wandb')
from fastai.callback.wandb import WandbCallback

ACTIONS = ('draw','batch','forward','loss','backward','opt_step')
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope='module')
def wandb_dir(tmp_path_factory):
    "wandb offline, every wandb folder in one temporary folder: no network, nothing outside the tests"
    d = tmp_path_factory.mktemp('wandb')
    keys = ('WANDB_DIR','WANDB_CONFIG_DIR','WANDB_CACHE_DIR','WANDB_DATA_DIR','WANDB_MODE','WANDB_SILENT','WANDB_DISABLE_GIT')
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: str(d) for k in keys[:4]}, WANDB_MODE='offline', WANDB_SILENT='true', WANDB_DISABLE_GIT='true')
    yield d  # (wandb reads these once per process, at its first `wandb.init`: so one folder for the module, one run folder per test)
    for k,v in old.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v


@pytest.fixture
def wandb_env(wandb_dir):
    "An offline run's environment; finishes a run a failed test left open"
    yield wandb_dir
    if wandb.run is not None: wandb.finish()


def finish_and_read():
    "Finish the active run and read it back from its own folder"
    run_dir = Path(wandb.run.dir).parent
    wandb.finish()
    return WandbRun(run_dir)


def fastprofile_warnings(ws): return [str(w.message) for w in ws if 'fastprofile' in str(w.message)]


def expected_rates(learn, train_iter, n_iter, log_every, bs):
    "The rolling samples/second at `train_iter` recomputed from the record's recent batches (same epoch, warm-up left out)"
    rec = learn.simple_profile_record
    df = rec.recent()
    e,i = divmod(train_iter-1, n_iter)
    w = df[(df.phase=='train') & (df.epoch==e) & df.iter.between(i-log_every+1, i) & ~df.warmup]
    assert (w.bs == bs).all()
    return {a: len(w)*bs/w[a].sum() for a in ACTIONS}


def check_rates(series_by_action, learn, n_iter, log_every, bs, step_of):
    "Every logged rate equals the one recomputed from the record; steps are `step_of(train_iter)`"
    n_trn = learn.n_epoch*n_iter
    iters = list(range(log_every, n_trn+1, log_every))
    for a in ACTIONS:
        got = series_by_action(a)
        assert [s for s,_ in got] == [step_of(k) for k in iters], a
        for (s,v),k in zip(got, iters):
            assert v > 0
            assert v == pytest.approx(expected_rates(learn, k, n_iter, log_every, bs)[a], rel=1e-6), (a, k)


def results_row(res, phase, action, step=''):
    return res.set_index(['Phase','Action','Step']).loc[(phase, action, step)]


# ---------------------------------------------------------------- wandb

@pytest.mark.parametrize('with_callback', [True, False], ids=['WandbCallback', 'bare-run'])
def test_wandb_offline_run_read_back(wandb_env, with_callback):
    n_iter,log_every,bs = 12,5,16  # synth_learner: batches of 16
    wandb.init(project='fastprofile-test')
    if not with_callback: wandb.log({'user_metric': 1.0}, step=100)  # a run that already has history: steps continue from it
    learn = synth_learner(n_trn=n_iter, n_val=2, cbs=WandbCallback(log_preds=False) if with_callback else None)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.profile(show_report=False, log_every=log_every).fit(2)
    assert fastprofile_warnings(ws) == []
    run = finish_and_read()
    base = 0 if with_callback else 100
    step_of = lambda k: base + k - 1   # WandbCallback logs batch k (1-based) at the run's step at fit start + k - 1
    check_rates(lambda a: run.series(f'samples_per_second/train_{a}'), learn, n_iter, log_every, bs, step_of)
    if with_callback:  # the charts line up with the loss: each samples/second row is a row with the loss
        loss_steps = {s for s,_ in run.series('train_loss')}
        assert {s for s,_ in run.series('samples_per_second/train_batch')} <= loss_steps
        # (WandbCallback.before_fit got through `gather_args` formatting: on fastai 2.8.12 that needs the fastai#4173 fix)
    else: assert run.series('train_loss') == []

    res,rep = learn.simple_profile_results,learn.simple_profile_report
    (step,fit), = run.series('samples_per_second/fit')
    assert fit == pytest.approx(results_row(res, 'fit', 'fit')['Samples/Second'], rel=1e-9)
    assert step > max(s for s,_ in run.series('samples_per_second/train_batch'))
    # both tables, read back from files/media/table
    back = run.table('simple_profile_results')
    assert list(back.columns) == list(res.columns)
    for c in res.columns:
        if pd.api.types.is_numeric_dtype(res[c]): back[c] = pd.to_numeric(back[c]).astype(res[c].dtype)
    pd.testing.assert_frame_equal(back, res, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(run.table('simple_profile_report'), rep.formatted().reset_index(drop=True))
    # summary values per row
    fwd = results_row(res, 'train', 'batch', 'forward')
    assert run.summary['simple_profile/train_batch_forward/calls'] == fwd['Number of Calls'] == 2*(n_iter-1)
    assert run.summary['simple_profile/train_batch_forward/mean_duration_s'] == pytest.approx(fwd['Mean Duration'], rel=1e-9)
    assert run.summary['simple_profile/fit_fit/samples_per_second'] == pytest.approx(fit, rel=1e-9)
    assert 'simple_profile/train_batch_other/samples_per_second' not in run.summary  # no rate for `other`


def test_wandb_logging_keeps_training_results(wandb_env):
    def losses(log):
        set_seed(42, reproducible=True)
        learn = synth_learner(n_trn=10, n_val=2)
        learn.profile(show_report=False, log_every=3, logger_callback='wandb' if log else None).fit(2, 1e-2)
        return [float(v) for v in learn.recorder.losses]
    wandb.init(project='fastprofile-test')
    assert losses(True) == losses(False)


def test_wandb_no_run_quiet_by_default_one_warning_when_asked(wandb_env):
    assert wandb.run is None
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        synth_learner(n_trn=10, n_val=2).profile(show_report=False, log_every=2).fit(1)
    assert fastprofile_warnings(ws) == []
    learn = synth_learner(n_trn=10, n_val=2).profile(show_report=False, log_every=2, logger_callback='wandb')
    assert learn.cbs.filter(lambda c: isinstance(c, SimpleProfilerCallback))[0].logger_explicit
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.fit(1)
    msgs = fastprofile_warnings(ws)
    assert len(msgs) == 1 and 'wandb.init()' in msgs[0] and 'training goes on' in msgs[0]
    assert hasattr(learn, 'simple_profile_results')


WITHOUT_WANDB = """
import sys, warnings
sys.modules['wandb'] = None  # as if wandb were not installed: `import wandb` raises ImportError
from fastai.test_utils import synth_learner
from fastprofile.callback import SimpleProfilerCallback
import fastprofile.wandb as fpw
assert fpw.wandb is None
for explicit in (False, True):
    learn = synth_learner(n_trn=6, n_val=2).profile(show_report=False, log_every=2, **({'logger_callback':'wandb'} if explicit else {}))
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.fit(1)
    print(explicit, [str(w.message) for w in ws if 'fastprofile' in str(w.message)], hasattr(learn, 'simple_profile_results'))
"""

def test_wandb_not_installed():
    r = subprocess.run([sys.executable, '-c', WITHOUT_WANDB], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    quiet,asked = [l for l in r.stdout.splitlines() if l.startswith(('False','True'))]
    assert quiet == 'False [] True'
    assert asked.startswith('True [') and asked.count('not installed') == 1 and asked.endswith('True')


NOT_IMPORTED = """
import sys
from fastai.test_utils import synth_learner
from fastprofile.all import *
learn = synth_learner(n_trn=6, n_val=2).profile(show_report=False)
learn.fit(1)
print('default', 'wandb' in sys.modules, hasattr(learn, 'simple_profile_results'))
learn = synth_learner(n_trn=6, n_val=2).profile(show_report=False, logger_callback='wandb')
learn.fit(1)
print('asked', 'wandb' in sys.modules)
"""

def test_default_logger_does_not_import_wandb():
    "A program that does not use wandb pays no wandb import for the default logger; asked for by name, it is imported"
    r = subprocess.run([sys.executable, '-c', NOT_IMPORTED], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, 'WANDB_MODE': 'disabled'})
    assert r.returncode == 0, r.stderr[-3000:]
    out = [l for l in r.stdout.splitlines() if l.startswith(('default', 'asked'))]
    assert out == ['default False True', 'asked True'], r.stdout[-2000:]


# ---------------------------------------------------------------- fastai issue 4173

BUG_4173 = """
import fastai.callback.wandb as fw
from fastai.test_utils import synth_learner
try: fw._format_config(synth_learner().gather_args()); print('no bug')
except TypeError as e: print('bug:', e)
import fastprofile.wandb as fpw
print('patched', fpw._patched_4173)
fw._format_config(synth_learner().gather_args()); print('fixed')
"""

def test_fastai_4173_fix_applies_only_to_the_bug():
    r = subprocess.run([sys.executable, '-c', BUG_4173], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    if out[0] == 'no bug': assert out[1:] == ['patched False', 'fixed']  # a fixed fastai: nothing patched
    else:
        assert out[0] == 'bug: vars() argument must have __dict__ attribute'
        assert out[1:] == ['patched True', 'fixed']
    # here (already imported): no longer present, and patching again changes nothing
    import fastai.callback.wandb as fw
    assert not fpw.fastai_wandb_4173_present()
    before = fw.init_args
    assert fpw.patch_fastai_wandb_4173() is False and fw.init_args is before
    # the replacement still reads constructor arguments of objects that have them
    assert fw.init_args(WandbCallback(log_preds=False, n_preds=3))['n_preds'] == 3


# ---------------------------------------------------------------- TensorBoard

@pytest.mark.parametrize('log_every', [1, 4])
def test_tensorboard_event_files_read_back(tmp_path, log_every):
    from fastai.callback.tensorboard import TensorBoardCallback
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    n_iter,bs = 9,16
    learn = synth_learner(n_trn=n_iter, n_val=2, cbs=TensorBoardCallback(tmp_path, trace_model=False, log_preds=False))
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.profile(show_report=False, logger_callback='tensorboard', log_every=log_every).fit(2)
    assert fastprofile_warnings(ws) == []
    ea = EventAccumulator(str(tmp_path), size_guidance={'scalars': 0, 'tensors': 0}).Reload()
    # log_every=1: the first batch of each epoch is warm-up only, so it has no rate
    def series(a):
        return [(e.step, e.value) for e in ea.Scalars(f'samples_per_second/train_{a}')]
    if log_every == 1:
        warm = {1, n_iter+1}
        got = {a: series(a) for a in ACTIONS}
        for a in ACTIONS:
            assert [s for s,_ in got[a]] == [k for k in range(1, 2*n_iter+1) if k not in warm]
            for s,v in got[a]:
                assert v == pytest.approx(expected_rates(learn, s, n_iter, 1, bs)[a], rel=1e-5)  # float32 in event files
    else:
        n_trn = 2*n_iter
        for a in ACTIONS:
            got = series(a)
            assert [s for s,_ in got] == list(range(log_every, n_trn+1, log_every))
            for s,v in got: assert v == pytest.approx(expected_rates(learn, s, n_iter, log_every, bs)[a], rel=1e-5)
    loss_steps = {e.step for e in ea.Scalars('train_loss')}
    assert {s for s,_ in series('batch')} <= loss_steps
    fit, = ea.Scalars('samples_per_second/fit')
    assert fit.step == 2*n_iter
    assert fit.value == pytest.approx(results_row(learn.simple_profile_results, 'fit', 'fit')['Samples/Second'], rel=1e-5)
    text = ea.Tensors('simple_profile_report/text_summary')[0].tensor_proto.string_val[0].decode()
    assert text.startswith('**Simple Profiler Results**') and '| forward |' in text and '| train | draw |' in text


# ---------------------------------------------------------------- failing loggers

@pytest.fixture
def boom_logger():
    "A logger `boom` whose per-batch method raises on its second call"
    calls = {'batch': 0, 'fit': 0}
    def after_batch(self):
        calls['batch'] += 1
        if calls['batch'] == 2: raise RuntimeError('disk full')
    def after_fit(self): calls['fit'] += 1
    SimpleProfilerCallback._boom_log_after_batch = after_batch
    SimpleProfilerCallback._boom_log_after_fit = after_fit
    yield calls
    del SimpleProfilerCallback._boom_log_after_batch, SimpleProfilerCallback._boom_log_after_fit


def test_logger_raising_mid_run(boom_logger):
    set_seed(0, reproducible=True)
    learn = synth_learner(n_trn=12, n_val=2)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.profile(show_report=False, logger_callback='boom', log_every=2).fit(2)
    msgs = fastprofile_warnings(ws)
    assert len(msgs) == 1 and 'disk full' in msgs[0] and "'boom'" in msgs[0]
    assert boom_logger == {'batch': 2, 'fit': 0}  # off for the rest of the fit, after-fit included
    assert len(learn.recorder.values) == 2 and results_row(learn.simple_profile_results, 'train', 'batch', 'forward')['Number of Calls'] == 22


def test_wandb_log_raising_mid_run(wandb_env, monkeypatch):
    "wandb itself failing (here: `wandb.log` raising on its 2nd call) costs one warning, not the fit"
    wandb.init(project='fastprofile-test')
    real,n = wandb.log,[0]
    def flaky(*a, **k):
        n[0] += 1
        if n[0] == 2: raise ConnectionError('wandb service went away')
        return real(*a, **k)
    monkeypatch.setattr(fpw.wandb, 'log', flaky)
    learn = synth_learner(n_trn=12, n_val=2)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.profile(show_report=False, log_every=2).fit(1)
    msgs = fastprofile_warnings(ws)
    assert len(msgs) == 1 and 'wandb service went away' in msgs[0]
    assert n[0] == 2 and hasattr(learn, 'simple_profile_results')
