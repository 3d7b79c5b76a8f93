"torch.compile accounting on real Learners (CPU inductor): compile time apart from the steady state, recompiles counted with their reason, a verdict that names compilation, and torch left as it was"
import subprocess, sys, textwrap
import pytest, torch
from torch import nn
from fastai.basics import *
from fastai.data.core import TfmdDL
from fastai.callback.progress import ProgressCallback
from fastprofile.learner import *
from fastprofile.analysis.diagnosis import diagnose
from fastprofile.engine.evidence import CATEGORIES
from fastprofile.engine.record import Row

BS = 8

class Pairs(torch.utils.data.Dataset):
    "x -> sum(x): 16 features"
    def __init__(self, n): self.x = torch.randn(n, 16); self.y = self.x.sum(1, keepdim=True)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return self.x[i], self.y[i]

def mlp(): return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

def make_learner(model, n_train=20*BS + 4, n_valid=5*BS, drop_last=False, cbs=None):
    "A learner whose training loader ends with a partial batch of 4 (unless `drop_last`)"
    dls = DataLoaders(TfmdDL(Pairs(n_train), bs=BS, shuffle=True, drop_last=drop_last, num_workers=0),
                      TfmdDL(Pairs(n_valid), bs=BS, num_workers=0))
    learn = Learner(dls, model, loss_func=MSELossFlat(), lr=1e-3, cbs=cbs)
    learn.remove_cb(ProgressCallback)
    return learn

def handlers():
    h = torch._dynamo.callback_handler
    return list(h.start_callbacks), list(h.end_callbacks)

def profile(learn, n=1, **kwargs):
    learn.profile(logger_callback=None, show_report=False).fit(n, **kwargs)
    return learn.simple_profile

@pytest.fixture(scope='module')
def compiled():
    "The same MLP profiled uncompiled (one epoch), then compiled (two): the learner, both results, torch's callbacks before"
    torch._dynamo.reset()  # graphs of `nn.Sequential.forward` compiled earlier in this process would be reused
    set_seed(0)
    learn = make_learner(mlp())
    plain = profile(learn)
    before = handlers()
    learn.model = torch.compile(learn.model)
    return learn, plain, profile(learn, 2), before

def test_compiles_counted_with_their_reason(compiled):
    learn,plain,res,_ = compiled
    c = res.facts.compile
    assert plain.facts.compile is None  # nothing compiled in the uncompiled call
    dyn = [(x.phase, x.epoch, x.batch, x.last, x.kind) for x in c.compiles if x.trigger == 'DYNAMO']
    assert dyn == [('train', 0, 0, False, 'first'), ('train', 0, 20, True, 'shape'), ('valid', 0, 0, False, 'eval')], dyn
    assert 'size mismatch' in c.compiles[[x.batch for x in c.compiles].index(20)].reason
    assert c.recompiles_by_kind() == {('train','shape'): 1, ('valid','eval'): 1}
    assert c.seconds == pytest.approx(sum(x.seconds for x in c.compiles)) and c.seconds > 0
    assert not c.graph_breaks

def test_compile_time_kept_out_of_the_steady_state(compiled):
    learn,_,res,_ = compiled
    rec,c = res.record,res.facts.compile
    # the partial batch that recompiled (epoch 0, batch 20) went to `warmup` with each phase's first batch
    assert rec.n_apart == {'train': 1}
    assert rec.stats[Row('train','batch')].n == 2*21 - 2 - 1 and rec.stats[Row('train','warmup')].n == 3
    assert rec.stats[Row('valid','batch')].n == 2*5 - 2
    recompile = next(x for x in c.compiles if x.kind == 'shape')
    # no compile in the per-batch rows: no steady batch's forward took as long as the recompile (their sum may, on a busy
    # machine: 39 forwards)
    assert recompile.set_apart and rec.stats[Row('train','batch','forward')].max < recompile.seconds
    assert rec.stats[Row('train','warmup')].total + rec.stats[Row('valid','warmup')].total >= c.seconds
    note = ' '.join(res.report.notes)
    assert '1 later batch that compiled (torch.compile)' in note, note

def test_verdict_names_compilation(compiled):
    learn,plain,res,_ = compiled
    d = diagnose(learn)
    assert d.verdict == 'compile' and d.statement.startswith(f"Bound by: {CATEGORIES['compile']}"), d.lines()
    assert d.shares['compile'] > 50  # out of `warmup`, where the compiles ran
    warm = sum(res.record.stats[Row(p,'warmup')].total for p in ('train','valid'))
    assert d.shares['warmup'] == pytest.approx(100*(warm - res.facts.compile.seconds)/res.record.fit_total)
    assert '`drop_last=True`' in d.knob and 'dynamic=True' in d.knob  # the partial batch's recompile
    assert 'Validation recompiled for eval mode and no_grad' in d.knob and 'expected, once per run' in d.knob
    # the earlier, uncompiled profile of the same learner is the baseline: when compiling pays back
    b = res.facts.compile.baseline
    st = plain.record.stats
    assert b is not None and b.seconds == pytest.approx(st[Row('train','draw')].mean + st[Row('train','batch')].mean)
    assert 'pays back after about' in d.knob or 'never pays back' in d.knob, d.knob
    sec = res.report.sections
    comp = next(s for s in sec if s.title == 'Compilation')
    assert 'recompiled for a new input shape' in '\n'.join(comp.lines) and comp.data is res.facts.compile

def test_torch_callbacks_left_as_they_were(compiled):
    learn,_,_,before = compiled
    assert handlers() == before

def test_callbacks_taken_off_when_the_fit_raises(compiled):
    learn,_,_,before = compiled
    class Boom(Callback):
        def after_batch(self):
            if self.iter == 2: raise RuntimeError('boom')
    with pytest.raises(RuntimeError, match='boom'):
        learn.profile(logger_callback=None, show_report=False).fit(1, cbs=Boom())
    assert handlers() == before

class Branchy(Module):
    "An MLP with a data-dependent branch (a graph break) and a float attribute the forward reads (a guard)"
    def __init__(self): self.l1,self.l2,self.scale = nn.Linear(16, 32),nn.Linear(32, 1),1.
    def forward(self, x):
        h = self.l1(x).relu()
        if h.sum() > 0: h = h*self.scale
        return self.l2(h)

class Rescale(Callback):
    "Changes the model's `scale` at each epoch: dynamo recompiles"
    def before_epoch(self): self.learn.model._orig_mod.scale = 1. + self.epoch

def test_changed_attribute_and_graph_breaks():
    torch._dynamo.reset()
    set_seed(0)
    learn = make_learner(torch.compile(Branchy()), drop_last=True, cbs=Rescale())
    res = profile(learn, 2)
    c = res.facts.compile
    kinds = {(x.phase, x.kind) for x in c.compiles}
    assert ('train','attribute') in kinds and ('valid','attribute') in kinds, kinds
    assert 'self.scale == 1.0' in next(x.reason for x in c.compiles if x.kind == 'attribute')
    assert not any(x.kind == 'shape' for x in c.compiles)  # `drop_last=True`: no partial batch to recompile for
    assert c.n_graph_breaks >= 1 and any('Data-dependent' in r for r in c.graph_breaks), c.graph_breaks
    d = diagnose(res)
    assert d.verdict == 'compile'
    assert 'keep what it checks constant' in d.knob and 'fullgraph=True' in d.knob and 'drop_last' not in d.knob

def test_uncompiled_profile_loads_no_dynamo():
    "Without torch.compile the probe registers nothing: torch._dynamo is never imported"
    code = textwrap.dedent("""
        import sys
        from fastai.test_utils import synth_learner
        from fastprofile.all import *
        learn = synth_learner()
        learn.profile(logger_callback=None, show_report=False).fit(1)
        assert learn.simple_profile.facts.compile is None
        assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'
        print('ok')
    """)
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith('ok'), r.stderr[-2000:]
