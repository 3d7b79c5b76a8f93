"A probe of your own, exactly as the guide writes it (nbs/guide_probe.ipynb, its `@register` cell): one file and its `@register` line; `learn.profile(probes=[...])` brings it into a call"
import importlib.util, json, re, sys, warnings
from pathlib import Path
import pytest
import torch
from fastai.basics import *
from fastai.test_utils import synth_learner, synth_dbunch
from fastai.callback.tensorboard import TensorBoardCallback
from fastprofile.all import *
from fastprofile.engine.core import PROBES
from fastprofile.engine.rules import RULES

GUIDE = Path(__file__).parent.parent/'nbs'/'guide_probe.ipynb'

@pytest.fixture(scope='module')
def example(tmp_path_factory):
    "The guide's example probe, written to a file of its own and imported: `BatchBytes`"
    cells = [''.join(c['source']) for c in json.loads(GUIDE.read_text(encoding='utf-8'))['cells'] if c['cell_type'] == 'code']
    code = next(c for c in cells if '@register' in c)
    probe = code[code.index('@register'):]
    assert 10 <= len(probe.strip().splitlines()) <= 22  # the guide promises a probe in about 20 lines, its rule before it
    path = tmp_path_factory.mktemp('probe')/'batch_bytes.py'
    path.write_text(code)
    spec = importlib.util.spec_from_file_location('batch_bytes', path)
    mod = importlib.util.module_from_spec(spec); sys.modules['batch_bytes'] = mod  # as `import batch_bytes` would
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop('batch_bytes', None); PROBES.pop('phase_bytes', None); RULES.pop('batch_bytes', None)

def _learner(**kw):
    return synth_learner(data=synth_dbunch(bs=4, n_train=5, n_valid=3), **kw)  # 5 x 4 training items of (1 float x, 1 float y); 3 x 4 valid

def test_the_example_is_registered_and_counts_each_phase(example):
    assert PROBES['phase_bytes'] is example.BatchBytes
    learn = _learner()
    learn.profile(probes=[example.BatchBytes()], show_report=False, logger_callback=None).fit(2)
    got = learn.simple_profile.facts.extra['phase_bytes']
    # synth_learner: x and y are float32 tensors of shape (bs,) -> 2 * 4 * 4 bytes per batch
    train_batches, valid_batches = 2*5, 2*3
    assert got == {'train': train_batches*2*4*4, 'valid': valid_batches*2*4*4}
    sec = learn.simple_profile.report.section('Batch bytes')
    assert sec is not None and sec.lines == ['train: 0.00 MB', 'valid: 0.00 MB'] and sec.data == got
    assert 'Batch bytes' in learn.simple_profile_report.plain()
    learn.profile(show_report=False, logger_callback=None).fit(1)  # not passed: its `make` puts it in every profiled call
    assert learn.simple_profile.facts.extra['phase_bytes'] == {'train': 5*2*4*4, 'valid': 3*2*4*4}
    assert not [cb for cb in learn.cbs if isinstance(cb, example.BatchBytes)]  # it joined learn.cbs for the call only

def test_its_rule_comes_with_it(example, tmp_path):
    "Its rule is registered with the probe (`rules`, by `@register`) and read by every diagnosis, of a saved profile too"
    assert RULES['batch_bytes'] is example.BatchBytes.rules[0]
    learn = _learner()
    learn.profile(probes=[example.BatchBytes()], show_report=False, logger_callback=None).fit(1)
    f = next(f for f in diagnose(learn).findings if f.rule == 'batch_bytes')
    assert f.kind == 'bound' and f.label == 'bytes per batch' and f.speedup > 1 and 'MB a batch' in f.cause
    learn.simple_profile.save(tmp_path/'p.json')
    assert any(f.rule == 'batch_bytes' for f in diagnose(load_profile(tmp_path/'p.json')).findings)

README = Path(__file__).parent.parent/'README.md'

def test_the_readme_shows_the_guide_s_probe():
    "The README's probe is the guide's, character for character: the one this file runs"
    import re
    got = re.search(r'<!-- probe-example -->\n```python\n(.*?)```\n<!-- /probe-example -->', README.read_text(), re.S)
    cells = [''.join(c['source']) for c in json.loads(GUIDE.read_text(encoding='utf-8'))['cells'] if c['cell_type'] == 'code']
    assert got is not None and got.group(1).strip() == next(c for c in cells if '@register' in c).strip()

def test_saved_and_loaded_it_keeps_its_facts_and_section(example, tmp_path):
    learn = _learner()
    learn.profile(probes=[example.BatchBytes()], show_report=False, logger_callback=None).fit(1)
    learn.simple_profile.save(tmp_path/'p.json')
    back = load_profile(tmp_path/'p.json')
    assert back.facts.extra['phase_bytes'] == learn.simple_profile.facts.extra['phase_bytes']
    assert 'Batch bytes' in back.report.plain()

def test_its_scalars_reach_tensorboard(example, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    learn = _learner(cbs=TensorBoardCallback(tmp_path, trace_model=False, log_preds=False))
    learn.profile(probes=[example.BatchBytes()], show_report=False, logger_callback='tensorboard').fit(1)
    ea = EventAccumulator(str(tmp_path), size_guidance={'scalars': 0}).Reload()
    assert [e.value for e in ea.Scalars('phase_bytes/train')] == [5*2*4*4]
    assert [e.value for e in ea.Scalars('phase_bytes/valid')] == [3*2*4*4]

def test_bad_probes_are_refused_at_the_call(example):
    learn = _learner()
    class NoKey(Probe): pass
    class Clash(Probe): key = 'device'  # a field of `Facts`
    class Taken(Probe): key = 'loading'  # fastprofile's loader probe's
    class Copy(Probe): key = 'batch_bytes'  # what the learner's facts keep for the copy model (on a GPU)
    class BadOption(Probe): key,options = 'bad_option',('not_an_option',)
    with pytest.raises(TypeError, match='Probe objects'): learn.profile(probes=[object()])
    with pytest.raises(ValueError, match='has no `key`'): learn.profile(probes=[NoKey()])
    with pytest.raises(ValueError, match='share a key'): learn.profile(probes=[example.BatchBytes(), example.BatchBytes()])
    with pytest.raises(ValueError, match='field of `Facts`'): learn.profile(probes=[Clash()])
    with pytest.raises(ValueError, match="taken by fastprofile.probes.loading.LoadingProbe"): learn.profile(probes=[Taken()])
    with pytest.raises(ValueError, match="kept in `facts.extra` by fastprofile itself"): learn.profile(probes=[Copy()])
    with pytest.raises(ValueError, match="not `ProfileOptions` fields: valid are show_report"): learn.profile(probes=[BadOption()])
    class Other(Probe): key = 'phase_bytes'
    with pytest.raises(ValueError, match='taken by'): learn.profile(probes=[Other()])
    assert not [cb for cb in learn.cbs if type(cb).__module__.startswith(('fastprofile', 'batch_bytes'))]
    learn.fit(1)  # nothing was armed
    assert 'simple_profile' not in learn.__dict__

def test_its_section_shows_where_it_did_before_efficiency_and_telemetry(example, tmp_path):
    "Every probe's section comes through `Probe.section`, ordered by `section_order`: yours, then efficiency, telemetry; read back the same"
    learn = _learner()
    learn.profile(probes=[example.BatchBytes()], efficiency=True, telemetry=True, show_report=False, logger_callback=None).fit(1)
    shown = lambda r: [(s.title, s.lines) for s in r.report.sections]
    assert [t for t,_ in shown(learn.simple_profile)] == ['Diagnosis', 'Batch bytes', 'Efficiency', 'Telemetry']
    back = load_profile(learn.simple_profile.save(tmp_path/'p.json'))
    assert shown(back) == shown(learn.simple_profile)

class LiveReads(Probe):
    "A probe with live numbers: the logger's rolling training batch rate, and how many rates this logger has read (its own state)"
    key = 'live_reads'
    def live_scalars(self, rates, state):
        if 'batch' not in rates: return {}  # a window of warm-up batches only: no rate
        state['reads'] = state.get('reads', 0) + 1
        return {'batch_rate': rates['batch'], 'reads': state['reads']}

def test_its_live_scalars_reach_tensorboard_per_logged_batch(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    learn = _learner(cbs=TensorBoardCallback(tmp_path, trace_model=False, log_preds=False))
    try:
        learn.profile(probes=[LiveReads()], show_report=False, logger_callback='tensorboard', log_every=2).fit(2)
    finally: PROBES.pop('live_reads', None)
    ea = EventAccumulator(str(tmp_path), size_guidance={'scalars': 0}).Reload()
    rate = [(e.step, e.value) for e in ea.Scalars('samples_per_second/train_batch')]
    assert len(rate) >= 3 and [(e.step, e.value) for e in ea.Scalars('live_reads/batch_rate')] == rate  # at each logged batch
    assert [(e.step, e.value) for e in ea.Scalars('live_reads/reads')] == [(s, i+1) for i,(s,_) in enumerate(rate)]

class Thermometer(Probe):
    "A probe that reads the room's temperature (made up): what it says before the verdict, in its evidence and *Rests on*, its number"
    key = 'room'
    def measured(self): return {'celsius': 41.}
    @classmethod
    def preface(cls, t, full=False):
        return None if t['celsius'] < 35 else f"Hot room: {t['celsius']:.0f} °C" + (", read once by a thermometer." if full else '.')
    @classmethod
    def evidence(cls, t, ev): return [f"The room was {t['celsius']:.0f} °C; the fit took {ev.fit:.3f} s."]
    @classmethod
    def rests_on(cls, t, ev): return "The room's temperature, read once."
    @classmethod
    def numbers(cls, t, ev): return {'celsius': t['celsius']}

def test_its_words_reach_the_diagnosis(tmp_path):
    "What a probe of yours says through `Probe.preface`, `evidence`, `rests_on` and `numbers` is in every diagnosis, of a saved profile too"
    learn = _learner()
    try:
        learn.profile(probes=[Thermometer()], show_report=False, logger_callback=None).fit(1)
        for r in (learn.simple_profile, load_profile(learn.simple_profile.save(tmp_path/'p.json'))):
            d = diagnose(r)
            # after the machine's, if it was busy (fastprofile's probes first, in `probe_order`)
            assert d.preface.endswith('Hot room: 41 °C.') and d.lines()[0] == d.preface and d.lines()[1].startswith('Bound by')
            ev = d.evidence()
            assert ev[1] == d.preface_full and d.preface_full.endswith('Hot room: 41 °C, read once by a thermometer.'), ev
            said = f"The room was 41 °C; the fit took {d.numbers['fit']:.3f} s."
            assert said in ev and ev.index(said) > next(i for i,l in enumerate(ev) if l.startswith('Main-process time')), ev
            assert d.basis.endswith(" The room's temperature, read once.") and d.numbers['celsius'] == 41.
            sec = r.report.section('Diagnosis')
            assert sec.preface == 1 and sec.lines[0] == d.preface and said in sec.more
    finally: PROBES.pop('room', None)

def test_a_hook_that_fails_leaves_the_diagnosis_standing(tmp_path, monkeypatch):
    "A probe whose `Probe.evidence` raises: the diagnosis warns, says the rest (its preface too), and gives the verdict; in strict mode it raises"
    class Broken(Thermometer):
        key = 'broken_room'
        @classmethod
        def evidence(cls, t, ev): raise RuntimeError('no thermometer')
    learn = _learner()
    try:
        learn.profile(probes=[Broken()], show_report=False, logger_callback=None).fit(1)
        with pytest.raises(RuntimeError, match='no thermometer'): diagnose(learn)  # the tests' strict mode
        monkeypatch.setenv('FASTPROFILE_STRICT', '0')
        with pytest.warns(UserWarning, match=r"the diagnosis' `evidence` of the probe 'broken_room' failed and was skipped \(RuntimeError: no thermometer\)"):
            d = diagnose(learn)
        assert d.preface.endswith('Hot room: 41 °C.') and d.numbers['celsius'] == 41. and d.head.startswith('Bound by')
        assert not any('The room was' in l for l in d.evidence())
    finally: PROBES.pop('broken_room', None)
