"""Layer time and Tokens/s (issue 22) on real Learners: the costliest layer of a compute-bound conv net named, its share
checked against `torch.profiler` on the same batches; hooks on the model only for the sampled batches; token-id batches
counted (Tokens/s = Samples/s × seq_len for a language model) and their padding share against a count of the same batches"""
from collections import OrderedDict
import dataclasses, json, math, pickle, time, pytest, torch
from pathlib import Path
from torch import nn
from torch.profiler import profile as torch_profile, ProfilerActivity, record_function
from fastai.basics import *
from fastai.callback.all import *
from fastai.test_utils import synth_learner
from fastai.text.data import LMDataLoader, SortedDL, Pad_Chunk, TensorText
from fastprofile.all import *
from fastprofile.lifecycle.session import Session
from fastprofile.probes.layers import LayersProbe, LayerTimes
from fastprofile.engine.tokens import PAD_EVERY
from fastprofile.engine.tables import fmt_pct
from fastprofile.engine.record import Row

QUIET = dict(show_report=False, logger_callback=None)

@pytest.fixture(autouse=True)
def one_thread():
    "One torch thread: on a busy 2-core machine a parallel op waits for a core, and its time says more of the machine than of the op"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

_MAKE = LayersProbe.make

@pytest.fixture(autouse=True)
def three_samples(monkeypatch):
    "These tests' fits are short (6 training batches): the registry's timer samples 3 in a row after the warm-up; `spread_out` undoes it"
    def make(cls, call): return cls(call.learn, warmup=call.options.warmup, first=3, spacing=1) if call.options.layers else None
    monkeypatch.setattr(LayersProbe, 'make', classmethod(make))

@pytest.fixture
def spread_out(monkeypatch):
    "The registry's timer as the package makes it: `first=6` samples, one every 16 training batches"
    monkeypatch.setattr(LayersProbe, 'make', _MAKE)
BIG = 'body'  # the layer that does nearly all the work in `cnn()`

def cnn():
    "A small conv net whose 7×7 convolution (`body`) does ~98% of the FLOPs"
    return nn.Sequential(OrderedDict(stem=nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()),
        body=nn.Conv2d(8, 64, 7, padding=3, stride=2), act=nn.ReLU(), pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(),
        head=nn.Linear(64, 10)))

def cnn_learner(n_trn=6, n_val=2, bs=16, cbs=(), model=None, size=32):
    "A learner on synthetic 3×`size`×`size` images, `n_trn` training batches, the loader in the main process"
    set_seed(0)
    n = (n_trn + n_val)*bs
    x,y = torch.randn(n, 3, size, size),torch.randint(0, 10, (n,))
    dls = DataLoaders.from_dsets(list(zip(x[:n_trn*bs], y[:n_trn*bs])), list(zip(x[n_trn*bs:], y[n_trn*bs:])), bs=bs,
                                 device='cpu', num_workers=0)
    return Learner(dls, model if model is not None else cnn(), loss_func=nn.CrossEntropyLoss(), cbs=list(cbs))

def fit(learn, n=1, **opts):
    with learn.no_bar(), learn.no_logging(): learn.profile(**QUIET, **opts).fit(n)
    return learn.simple_profile

class Windows(Callback):
    "`record_function` ranges around the model's forward and the backward of every training batch, named by `train_iter`"
    order = -2000  # before the profiler's pair: the range holds the forward, the pair's marks are outside it
    def __init__(self): self.rf = None
    def _open(self, what):
        if self.training: self.rf = record_function(f"win:{what}:{self.train_iter}"); self.rf.__enter__()
    def _close(self):
        if self.rf is not None: self.rf.__exit__(None, None, None); self.rf = None
    def before_batch(self): self._open('forward')
    def after_pred(self): self._close()
    def before_backward(self): self._open('backward')
    def after_backward(self): self._close()

def profiler_share(prof, iters, first_op_shape) -> float:
    "% of the aten ops' self CPU time in the windows of batches `iters` that the convolution with input shape `first_op_shape` takes (forward and backward)"
    evs = prof.events()
    wins = [e for e in evs if e.name.startswith('win:') and int(e.name.split(':')[2]) in iters]
    assert len(wins) == 2*len(iters), [e.name for e in wins]
    inside = lambda e: any(w.time_range.start <= e.time_range.start and e.time_range.end <= w.time_range.end for w in wins)
    ops = [e for e in evs if e.name.startswith('aten::') and inside(e)]
    total = sum(e.self_cpu_time_total for e in ops)
    fwd = sum(e.cpu_time_total for e in ops if e.name == 'aten::conv2d' and e.input_shapes and e.input_shapes[0] == first_op_shape)
    out_shape = [first_op_shape[0], 64, first_op_shape[2]//2, first_op_shape[3]//2]  # the gradient of its output comes first in `convolution_backward`'s inputs
    bwd = sum(e.cpu_time_total for e in ops if e.name == 'aten::convolution_backward' and e.input_shapes and e.input_shapes[0] == out_shape)
    assert fwd > 0 and bwd > 0
    return 100*(fwd + bwd)/total

def test_top_layer_and_share_against_torch_profiler():
    "The 7×7 convolution is named first, by the report's compute fix too; its share of forward+backward is within 10 points of torch.profiler's on the same batches"
    # 64×64 images: the convolution's share near 90%, so the time around the ops (hooks, Python: in our denominator, not in
    # torch.profiler's) and a preemption on a busy machine move the two shares by a few points, not ten
    learn = cnn_learner(cbs=[Windows()], size=64)
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof: res = fit(learn)
    lay = res.facts.layers
    test_eq((lay.batches, lay.samples, lay.iters), (3, 48, [1, 2, 3]))  # the three batches after the warm-up
    top = lay.top(1)[0]
    test_eq((top.name, top.kind), (BIG, 'Conv2d 8→64, 7×7, stride 2'))
    ours,theirs = lay.share(BIG),profiler_share(prof, set(lay.iters), [16, 8, 64, 64])
    print(f"share of `{BIG}`: LayersProbe {ours:.1f}%, torch.profiler {theirs:.1f}%"); print(lay)
    assert abs(ours - theirs) <= 10, (ours, theirs)
    assert ours > 30  # it leads by far: a test that tells layers apart
    d = res.section('Diagnosis')
    test_eq(d.verdict, 'compute')
    assert d.knob.startswith(f"`{BIG}` (Conv2d 8→64, 7×7, stride 2) "), d.knob
    assert 'of forward+backward' in d.knob and 'For the whole model:' in d.knob
    assert any(l.startswith(f"  `{BIG}` (Conv2d 8→64, 7×7, stride 2)") for l in d.details), d.details
    assert d.numbers['layers'][0]['module'] == BIG and len(d.numbers['layers']) <= 10  # its table, costliest first (`Probe.numbers`)
    assert f"`{BIG}` (Conv2d) takes " in d.head and d.head in res.report.plain(width=200), d.lines()  # named in the headline
    row = lay.table().set_index('module').loc[BIG]
    assert row.flops_per_second > 0 and row.calls == 1  # a call per batch
    test_eq(diagnose(learn).knob, d.knob)  # `diagnose(learn)` says the same

class HookSpy(Callback):
    "Per training batch: is the trigger on the model before its forward, are the timing hooks on its layers after it; and in validation"
    order = 1100
    def __init__(self): self.trigger,self.timed,self.valid_timed,self.after = {},{},[],{}
    def before_batch(self):
        if self.training: self.trigger[self.train_iter] = bool(self.model._forward_pre_hooks)
    def after_pred(self):
        if self.training: self.timed[self.train_iter] = bool(self.model.body._forward_hooks)
        else: self.valid_timed.append(bool(self.model.body._forward_hooks or self.model._forward_pre_hooks))
    def after_batch(self):
        if self.training: self.after[self.train_iter] = bool(self.model.body._forward_hooks)

def test_hooks_only_on_sampled_batches():
    "The trigger is on the model up to the last sampled batch, the timing hooks only on the sampled batches; nothing after the call"
    spy = HookSpy()
    learn = cnn_learner(n_trn=5, cbs=[spy])
    fit(learn)
    test_eq(spy.trigger, {0:True, 1:True, 2:True, 3:True, 4:False})
    test_eq(spy.timed, {0:False, 1:True, 2:True, 3:True, 4:False})
    assert all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in learn.model.modules())
    spy2 = HookSpy()
    learn = cnn_learner(n_trn=5, cbs=[spy2])
    fit(learn, layers=False)
    assert not any(spy2.trigger.values()) and not any(spy2.timed.values())
    test_eq(learn.simple_profile.facts.layers, None)

def test_sampling_across_epochs():
    "The first samples run on across training phases until `first` are taken; then one at the start of a training phase once `every` training batches went by"
    spy = HookSpy()
    learn = cnn_learner(n_trn=3, n_val=1, cbs=[spy])
    with learn.no_bar(), learn.no_logging():
        learn.profile(**QUIET)
        timer = next(p for p in Session.of(learn).probes if isinstance(p, LayersProbe))
        timer.every = 6
        learn.fit(6)
    lay = learn.simple_profile.facts.layers
    # epochs of 3 batches: epoch 0 samples its batches 1 and 2, epoch 1 the third of the first three (its batch 1, train_iter 4);
    # then one batch 6 training batches after the start of the last phase with first samples (epoch 3's batch 1), and epoch 5's
    test_eq(lay.iters, [1, 2, 4, 10, 16])
    test_eq(lay.batches, 5)
    test_eq([i for i,on in spy.timed.items() if on], [1, 2, 4, 10, 16])
    assert not any(spy.valid_timed)

def test_first_samples_one_every_16_batches(spread_out):
    """By default: the first training batch past the warm-up, then one every 16 (at most one in 16, after the first), until 6; across epochs
    too. A phase of fewer than 32 batches past the warm-up takes as many, one after the other at its start"""
    tiny = lambda: nn.Sequential(nn.Flatten(), nn.Linear(3*4*4, 10))
    for n_trn,want in ((6, [1]), (17, [1]), (18, [1, 2]), (20, [1, 2]), (32, [1, 2]), (33, [1, 17]), (34, [1, 17, 33]),
                       (120, [1, 17, 33, 49, 65, 81])):
        lay = fit(cnn_learner(n_trn=n_trn, n_val=1, bs=4, size=4, model=tiny())).facts.layers
        test_eq((n_trn, lay.iters), (n_trn, want))
    # two epochs of 20 (short: 19 batches past the warm-up): the warm-up of each is never sampled; the spacing puts 2 samples in the first
    # (its batches 1 and 17) and 1 in the second (its batch 14), each taken at its start (epoch 1's train_iter 20 is its warm-up)
    lay = fit(cnn_learner(n_trn=20, n_val=1, bs=4, size=4, model=tiny()), 2).facts.layers
    test_eq(lay.iters, [1, 2, 21])
    # seven epochs of 6 (5 batches past the warm-up each): the spacing puts the batches 0, 16 and 32 past the warm-ups in epochs 1, 4 and
    # 7 (spaced out: train_iter 1, 20 and 39); each is taken at its epoch's first batch past the warm-up
    lay = fit(cnn_learner(n_trn=6, n_val=1, bs=4, size=4, model=tiny()), 7).facts.layers
    test_eq(lay.iters, [1, 19, 37])

def test_hooks_only_on_the_spread_out_samples(spread_out):
    "Between two of the first samples the trigger stays on the model, the timing hooks come off; after the call, all of them"
    spy = HookSpy()
    learn = cnn_learner(n_trn=40, n_val=1, bs=4, cbs=[spy])
    fit(learn)
    test_eq([i for i,on in spy.timed.items() if on], [1, 17, 33])
    test_eq([i for i,on in spy.trigger.items() if on], list(range(40)))  # 3 more samples wanted: on to the phase's end (the next phase has them)
    assert not any(spy.after.values())  # the timing hooks off by each batch's end, a sampled one's too
    assert all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in learn.model.modules())
    class NoBackward(Callback):
        "Cancels the backward of training batch 1 (the first sample): its forward counts, closed when the next batch starts"
        def before_backward(self):
            if self.training and self.train_iter == 1: raise CancelBackwardException()
    spy = HookSpy()
    lay = fit(cnn_learner(n_trn=40, n_val=1, bs=4, cbs=[spy, NoBackward()])).facts.layers
    test_eq([i for i,on in spy.timed.items() if on], [1, 17, 33])  # batch 2 runs without them
    assert lay.iters == [1, 17, 33] and lay.layers[BIG].backward > 0

class ValidateAt(Callback):
    "A callback that validates inside a training phase (a nested `validate()`), after batch `i`"
    order = 1200
    def __init__(self, i): self.i = i
    def after_batch(self):
        if self.training and self.iter == self.i and self.epoch == 0: self.learn.validate()

def test_nested_validation_not_timed():
    "A `validate()` inside a training phase, after its first sampled batch, runs without hooks; the other samples come in the next training phase"
    spy = HookSpy()
    learn = cnn_learner(n_trn=5, n_val=1, cbs=[spy, ValidateAt(1)])  # fastai ends the training phase after a nested validation
    lay = fit(learn, 2).facts.layers
    test_eq(lay.batches, 3)
    assert spy.valid_timed[0] is False  # the nested validation's batch (fastai then runs the phase's last batches in eval mode)
    assert all(not (m._forward_hooks or m._forward_pre_hooks) for m in learn.model.modules())

def test_same_training_and_learner_after():
    "Training is bit-identical with the timer on, and the model is as before (no hook left), also when a fit raises mid-sample"
    def weights(m): return [p.detach().clone() for p in m.parameters()]
    a = cnn_learner(); fit(a)
    b = cnn_learner()
    with b.no_bar(), b.no_logging(): b.fit(1)
    for p,q in zip(weights(a.model), weights(b.model)): assert torch.equal(p, q)
    class Boom(Callback):
        def before_backward(self):
            if self.training and self.iter == 1: raise RuntimeError('boom')
    c = cnn_learner(cbs=[Boom()])
    with pytest.raises(RuntimeError, match='boom'): fit(c)
    assert all(not (m._forward_hooks or m._forward_pre_hooks) for m in c.model.modules())

class StopAt(nn.Module):
    "Passes its input on; raises `KeyboardInterrupt` in the `n`-th training forward (Ctrl-C inside a sampled batch's forward)"
    def __init__(self, n): super().__init__(); self.n,self.seen = n,0
    def forward(self, x):
        if self.training:
            self.seen += 1
            if self.seen == self.n: raise KeyboardInterrupt
        return x

def test_hooks_off_after_interrupt_mid_sampled_batch():
    "Ctrl-C in the forward of a sampled batch (hooks on, its modules open): every hook comes off, the batches before it count, the next call samples again"
    learn = cnn_learner(model=nn.Sequential(cnn(), StopAt(3)))  # training batch 2: the second sampled one
    with pytest.raises(KeyboardInterrupt): fit(learn)
    assert all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks) for m in learn.model.modules())
    lay = learn.simple_profile.facts.layers
    test_eq((lay.batches, lay.iters), (1, [1]))  # the interrupted batch is dropped
    assert lay.layers['0.body'].calls == 1
    lay = fit(learn).facts.layers
    test_eq((lay.batches, lay.iters), (3, [1, 2, 3]))
    assert all(not (m._forward_hooks or m._forward_pre_hooks) for m in learn.model.modules())

def test_layer_times_folded_when_read():
    "The marks become self times when `layers` is first read, or when the result is pickled (a report not shown reads nothing)"
    lay = fit(cnn_learner()).facts.layers
    test_eq((len(lay._raw), lay.batches, lay.iters), (3, 3, [1, 2, 3]))  # counted, not yet folded
    got = pickle.loads(pickle.dumps(lay))  # folds first: the marks are not pickled
    test_eq(len(lay._raw), 0)
    test_eq(got, lay)
    test_eq(lay.top(1)[0].name, BIG)
    assert '_raw' not in got.__dict__ and lay.layers[BIG].calls == 3
    lay2 = fit(cnn_learner()).facts.layers
    test_eq(lay2.layers.keys(), lay.layers.keys())  # read: folded then
    test_eq(len(lay2._raw), 0)
    learn = cnn_learner(n_trn=10)  # more sampled batches than `_KEEP`: folded at the phase's end, memory stays bounded
    with learn.no_bar(), learn.no_logging():
        learn.profile(**QUIET)
        next(p for p in Session.of(learn).probes if isinstance(p, LayersProbe)).first = 9
        learn.fit(1)
    lay = learn.simple_profile.facts.layers
    test_eq((len(lay._raw), lay.batches, lay.layers[BIG].calls), (0, 9, 9))

def test_models_it_does_not_time():
    "A model with no submodules is its own only layer; the option is checked"
    learn = synth_learner(n_trn=4, n_val=1)
    lay = fit(learn).facts.layers
    test_eq(list(lay.layers), [''])
    assert lay.label(lay.layers['']).startswith('`RegModel` (the model')
    with pytest.raises(TypeError, match='`layers` must be True or False'): learn.profile(**QUIET, layers='yes')

def test_layer_lines_render():
    "The report's lines: the failure when nothing was measured, a share per module"
    test_eq(LayerTimes(failure='not measured: why').lines(), ['Layers: not measured: why.'])

# ---- Tokens/s ----
from helpers.lm import TinyLM, BS, SL, lm_learner  # noqa: E402

def test_tokens_per_second_language_model():
    "Tokens/s beside Samples/s: tokens over time, Samples/s × seq_len for every row; no padding in a LMDataLoader"
    learn = lm_learner()
    res = fit(learn)
    r = res.results.set_index(['Phase','Action','Step'])
    rec = res.record
    for k in [('train','batch',''), ('train','batch','forward'), ('valid','batch',''), ('fit','train',''), ('fit','fit','')]:
        test_close(r.loc[k, 'Tokens/Second'], r.loc[k, 'Samples/Second']*SL, eps=1e-9*r.loc[k, 'Tokens/Second'])
    test_eq(rec.tokens[Row('train','batch')], 5*BS*SL)  # the 5 batches after the warm-up
    test_close(r.loc[('train','batch',''), 'Tokens/Second'], rec.tokens[Row('train','batch')]/r.loc[('train','batch',''), 'Total Time'])
    assert math.isnan(r.loc[('train','batch','other'), 'Tokens/Second'])
    assert 'Tokens/s' in res.report.plain(width=160).splitlines()[1]
    t = res.facts.tokens['train']
    test_eq((t.pad_idx, t.pad_share), (None, 0.))
    line = next(l for l in res.section('Diagnosis').details if l.startswith('Tokens:'))
    assert '12 a sample' in line and 'no padding (LMDataLoader' in line, line
    test_close(res.section('Diagnosis').numbers['tokens_per_second']['train'], r.loc[('train','batch',''), 'Tokens/Second'])
    # The costliest module is the GRU (`rnn`), not the head or the embedding: per token its two matmuls (input and hidden,
    # 3 gates each) are 2·3·16·16 = 1536 multiply-adds against the head's 16·60 = 960 and the embedding's lookup (no matmul),
    # and its recurrence runs the 12 steps of a sequence one after another, small ops each, forward and backward
    # (measured here, one thread: ~5.5 ms against ~0.5 ms for `head` and ~0.3 ms for `emb`)
    top = res.facts.layers.top(1)[0]
    test_eq((top.name, top.kind), ('rnn', 'GRU 16→16'))

def test_padding_share_sorted_dl():
    "A classifier on fastai's `SortedDL` padded by `Pad_Chunk`: the pad tokens of every `PAD_EVERY`-th batch, as a count of the same batches says"
    set_seed(0)
    lens = torch.randint(3, 20, (20*BS,)).tolist()
    items = [(TensorText(torch.randint(2, 60, (n,))), tensor(n % 2)) for n in lens]
    mk = lambda its: SortedDL(its, bs=BS, shuffle=False, before_batch=Pad_Chunk(seq_len=4))
    class Clf(nn.Module):
        def __init__(self): super().__init__(); self.emb,self.head = nn.Embedding(60, 8),nn.Linear(8, 2)
        def forward(self, x): return self.head(self.emb(x).mean(1))
    learn = Learner(DataLoaders(mk(items[:16*BS]), mk(items[16*BS:])), Clf(), loss_func=CrossEntropyLossFlat())
    res = fit(learn)
    t = res.facts.tokens['train']
    got = [x for x,_ in learn.dls.train][::PAD_EVERY]  # the same batches (no shuffling), every `PAD_EVERY`-th
    test_eq((t.pad_idx, t.sampled, t.tokens, t.pads), (1, len(got), sum(x.numel() for x in got), sum(int((x == 1).sum()) for x in got)))
    assert 0 < t.pad_share < 100
    line = next(l for l in res.section('Diagnosis').details if l.startswith('Tokens:'))
    assert f"padding: {fmt_pct(t.pad_share)} of the tokens in {len(got)} sampled batches (token 1, from `Pad_Chunk`" in line, line
    # every batch's tokens counted, padding included: Tokens/s from the numel of each batch
    test_eq(res.record.tokens[Row('fit','train')], sum(x.numel() for x,_ in learn.dls.train))

def test_no_tokens_column_for_other_batches():
    "Batches that are not token ids (floats; two inputs as in a tabular model) give no Tokens/s"
    res = fit(synth_learner(n_trn=3, n_val=1))
    assert 'Tokens/Second' not in res.results and 'Tokens/s' not in res.report.plain()
    test_eq(res.facts.tokens, {})

def test_events_path_with_stand_in_events():
    "The GPU path (a CUDA event per mark, read at the phase's end) on the CPU, with `fastprofile.testing`'s stand-in events on the wall clock"
    from fastprofile.testing import FakeStream, FakeEvent
    fs = FakeStream(time.perf_counter)
    def mark():
        e = FakeEvent(fs); e.record(); return e
    learn = cnn_learner()
    with learn.no_bar(), learn.no_logging():
        learn.profile(**QUIET)
        timer = next(p for p in Session.of(learn).probes if isinstance(p, LayersProbe))
        def before_fit(s, _before_fit=timer.before_fit):
            _before_fit(s); timer._cuda,timer._clock,timer.result.timing = True,mark,'events'
        timer.before_fit = before_fit
        learn.fit(1)
    lay = learn.simple_profile.facts.layers
    test_eq((lay.timing, lay.batches), ('events', 3))
    test_eq(lay.top(1)[0].name, BIG)
    assert lay.forward > 0 and lay.backward > 0 and lay.lines()[0].startswith('Layers (') and 'CUDA events' in lay.lines()[0]

@pytest.mark.cuda
def test_layers_on_gpu():
    "On a GPU the marks are CUDA events: the big convolution still leads, and nothing is left on the model"
    # 224 px: at 32 px an H200 finishes the convolution in microseconds and the GPU spans between the hooks' marks are
    # the host's launch gaps (`head` led, 2026-11-26); here `body` is ~40 GFLOP a batch (not yet re-run on a GPU)
    learn = cnn_learner(bs=64, size=224)
    learn.dls.to('cuda'); learn.model.cuda()
    res = fit(learn)
    lay = res.facts.layers
    test_eq((lay.timing, lay.batches), ('events', 3))  # 6 training batches: the warm-up, then `first=3`
    test_eq(lay.top(1)[0].name, BIG)
    assert 0 < lay.forward and 0 < lay.backward
    assert all(not (m._forward_hooks or m._forward_pre_hooks) for m in learn.model.modules())

# ---- the spread of a share, and which layers lead (issue 39) ----
import fastprofile.probes.layers as layers_mod  # noqa: E402
from fastprofile.probes.layers import LayerTime, _TIMES  # noqa: E402

def per_batch(**times) -> LayerTimes:
    "A `LayerTimes` from each module's self time (s) in each of the same sampled batches, as `_fold` keeps them"
    k = len(next(iter(times.values())))
    return LayerTimes('Net', batches=k, layers={n:LayerTime(n, 'Linear', sum(ts), 0., k, batch_times=list(ts)) for n,ts in times.items()})

NO_LEADER = '  No single layer dominates (the top ones are within their spread, or the sampled batches disagree on the first).'

def test_a_tie_is_reported_as_a_tie():
    "Two layers whose shares differ by less than their spreads: none leads, and the lines say so; one far ahead leads alone"
    tie = per_batch(a=[.30, .26, .33, .27, .29, .31], b=[.28, .31, .26, .30, .27, .29], c=[.1, .12, .1, .11, .1, .1])
    test_eq([l.name for l in tie.top(2)], ['a', 'b'])  # a ranking exists...
    assert tie.share('a') - tie.spread('a') < tie.share('b') + tie.spread('b')  # ...within the spreads
    test_eq(tie.leaders(), [])
    test_eq(tie.lines()[-1], NO_LEADER)
    one = per_batch(a=[.60, .62, .58, .61, .60, .59], b=[.30, .26, .33, .27, .29, .31], c=[.28, .31, .26, .30, .27, .29])
    test_eq([l.name for l in one.leaders()], ['a'])  # `b` and `c` tie: `a` leads alone
    assert NO_LEADER not in one.lines()
    assert f"`a` (Linear) {fmt_pct(one.share('a'))} ±" in one.lines()[1]
    test_eq(one.table().set_index('module').spread['a'], one.spread('a'))
    test_eq(per_batch(a=[.5], b=[.1]).leaders(), [])  # one batch: no spread, no leader
    assert math.isnan(per_batch(a=[.5], b=[.1]).spread('a'))

def test_one_inflated_batch_does_not_rank_a_small_layer_first():
    "A BatchNorm preempted in one of 5 batches (over 3/4 of their sum): the median share keeps it small, the Linear ranks first and leads"
    lay = per_batch(lin=[.30, .31, .29, .30, .30], bn=[.01, .01, .01, 6., .01], relu=[.05, .05, .04, .05, .05])
    by_sum = max(lay.layers.values(), key=lambda l: l.total)
    assert by_sum.name == 'bn' and 100*by_sum.total/lay.total > 75  # the premise: by the sums it would be first
    test_eq(lay.top(1)[0].name, 'lin')
    assert lay.share('bn') < 5 and lay.spread('bn') < 1  # nor does the one batch widen its spread much
    test_eq([l.name for l in lay.leaders(1)], ['lin'])

class Big(nn.Module):
    "A 1024→1024 Linear between two small ones: ~120x the multiply-adds of the rest of the model"
    def __init__(self):
        super().__init__()
        self.small,self.act,self.big,self.head = nn.Linear(8, 1024),nn.ReLU(),nn.Linear(1024, 1024),nn.Linear(1024, 10)
    def forward(self, x): return self.head(self.big(self.act(self.small(x.flatten(1)[:, :8]))))

def test_a_dominant_linear_leads_on_a_real_learner(spread_out):
    "One Linear does ~99% of the multiply-adds: the default sampling (3 spread-out batches of 40) names it as the one leader"
    lay = fit(cnn_learner(n_trn=40, n_val=1, bs=64, size=4, model=Big())).facts.layers
    test_eq((lay.iters, lay.kept), ([1, 17, 33], 3))
    test_eq([l.name for l in lay.leaders()][:1], ['big'])
    assert lay.share('big') > 50 and NO_LEADER not in lay.lines()
    assert all(lay.share('big') - lay.spread('big') > lay.share(n) + lay.spread(n) for n in lay.layers if n != 'big')

class EveryThird(nn.Module):
    "Runs `inner` on every third call only (a branch some batches take)"
    def __init__(self): super().__init__(); self.inner,self.n = nn.ReLU(),0
    def forward(self, x):
        self.n += 1
        return self.inner(x) if self.n % 3 == 0 else x

def test_times_kept_per_batch_stay_bounded(monkeypatch):
    "Every layer keeps one self time per kept sampled batch, aligned (0 where it did not run); past `_TIMES` every other one is dropped and `stride` doubles"
    monkeypatch.setattr(layers_mod, '_TIMES', 4)
    learn = cnn_learner(n_trn=11, model=nn.Sequential(OrderedDict(net=cnn(), branch=EveryThird())))
    with learn.no_bar(), learn.no_logging():
        learn.profile(**QUIET)
        next(p for p in Session.of(learn).probes if isinstance(p, LayersProbe)).first = 10
        learn.fit(1)
    lay = learn.simple_profile.facts.layers
    # batches 0-3 kept, thinned to 0, 2 (stride 2); 4, 6 kept, thinned to 0, 4 (stride 4); 8 kept
    test_eq((lay.batches, lay.stride, lay.kept), (10, 4, 3))
    assert {len(l.batch_times) for l in lay.layers.values()} == {3} and lay.layers['net.body'].calls == 10  # the sums count every batch
    assert all(t > 0 for t in lay.layers['net.body'].batch_times)
    # the branch runs in training batches 2, 5, 8 (calls 3, 6, 9; call 1 is the warm-up's): of the kept 1, 5, 9, only in 5
    test_eq(lay.layers['branch.inner'].calls, 3)
    test_eq([t > 0 for t in lay.layers['branch.inner'].batch_times], [False, True, False])

def test_layer_times_round_trip_and_old_files_load():
    "The per-batch times and `stride` go to JSON and come back, field by field; a file without them (0.2.0 and older) loads, with no spread"
    lay = fit(cnn_learner()).facts.layers
    back = LayersProbe.from_json(json.loads(json.dumps(LayersProbe.to_json(lay), allow_nan=False)))
    for f in dataclasses.fields(LayerTimes): test_eq(getattr(back, f.name), getattr(lay, f.name))
    test_eq(back.layers[BIG].batch_times, lay.layers[BIG].batch_times)
    test_eq(back.lines(), lay.lines())
    old = LayersProbe.to_json(lay)
    del old['stride']
    for v in old['layers'].values(): del v['batch_times']
    old = LayersProbe.from_json(old)
    test_eq((old.kept, old.stride), (0, 1))
    test_close(old.share(BIG), 100*lay.layers[BIG].total/lay.total)  # the share of the sums, as 0.2.0 showed it
    assert math.isnan(old.spread(BIG)) and old.leaders() == [] and ' ±' not in '\n'.join(old.lines())
    v010 = json.loads((Path(__file__).parent/'fixtures'/'v0_1_0'/'profile.json').read_text())['facts']['layers']
    test_eq(LayersProbe.from_json(v010).lines()[1][:30], '  `RegModel` (the model\'s own ')
    l = LayerTime('a', 'Linear', 1.)
    del l.__dict__['batch_times']  # as fastprofile 0.2.0 pickled it
    test_eq(pickle.loads(pickle.dumps(l)).batch_times, [])
