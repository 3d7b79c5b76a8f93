"The verdict as a person reads it: printed into a real pipe at 100 columns, short, the fix first; a rule of your own in it"
import re
import pytest
from fastai.basics import *
from fastai.callback.progress import ProgressCallback
from fastai.test_utils import synth_learner
from fastprofile.learner import *
from fastprofile.engine.rules import RULES, Finding, Rule, rule
from bench.verdict import measure, met, GOALS, SCENARIOS

@pytest.fixture(scope='module')
def printed():
    "Each scenario fitted in one child process whose stdout is a pipe, `COLUMNS=100`, its report shown (the default)"
    return {r['name']: r for r in measure(SCENARIOS, timeout=900)}

@pytest.mark.parametrize('name', SCENARIOS)
def test_the_verdict_reads_at_a_glance(printed, name):
    r = printed[name]
    show = '\n'.join(r['printed'])
    assert r['lines'] <= GOALS['lines'], show  # the section, as wrapped at 100 columns, with its title and the evidence hint
    assert r['share'] and r['headline'] <= GOALS['headline'], show
    assert r['busy'] <= GOALS['busy'], show
    if r['kind'] == 'model': assert r['code_line'] is not None and r['code_line'] <= 2, show  # the fix's code: line 2 or 3
    assert r['speedup_shown'], show  # on the Fix line or the next
    assert r['longest'] <= GOALS['sentence'] and r['repeated'] == 0, show
    assert r['html'] <= GOALS['html'], r
    assert met(r)
    assert r['printed'][-1].strip() == "Evidence: `diagnose(learn)` prints what this rests on.", show

def test_goals_fail_a_long_verdict():
    "The checks catch what they guard: a verdict of the old length (the fix in full on its line) fails them"
    r = dict(lines=23, headline=282, share=True, busy=4, code_line=5, speedup_shown=True, longest=650, repeated=1, html=2500, knob='x',
             kind='model')
    assert not met(r)
    for k,v in dict(lines=12, headline=96, busy=2, code_line=1, longest=150, repeated=0, html=800).items():
        assert not met(r); r[k] = v
    assert met(r)

def _learner():
    learn = synth_learner(n_trn=8)
    learn.remove_cb(ProgressCallback) if any(isinstance(c, ProgressCallback) for c in learn.cbs) else None
    return learn

def test_a_rule_of_your_own_appears_in_the_report():
    "A rule registered in a few lines: its finding is priced with the pipeline model, ranked with the others and said in the verdict"
    @rule('loss', label='the loss function', name='test_slow_loss', reads=('phases',))
    def slow_loss(ev):
        return [ev.finding('loss', "the loss takes most of the step: a cheaper one (made up, for the test).", lambda ph: ph.step/5,
                           say='`loss_func=MSELossFlat()`', cause='the loss takes 80% of the step', share=80.)]
    try:
        learn = _learner()
        learn.profile(show_report=False, logger_callback=None, batch_sizes=False).fit(1)
        d = learn.simple_profile.section('Diagnosis')
        assert d.verdict == 'loss' and d.first.rule == 'test_slow_loss' and d.predicted_speedup == pytest.approx(5)
        txt = learn.simple_profile.report.plain(100)
        assert 'Bound by the loss function: 80% of the fit; the loss takes 80% of the step.' in txt, txt
        assert 'Fix: `loss_func=MSELossFlat()`: 5.00x predicted.' in txt, txt
        assert 'the loss takes most of the step' in '\n'.join(d.evidence())  # the fix in full, one step away
    finally: RULES.pop('test_slow_loss', None)
    learn = _learner()
    learn.profile(show_report=False, logger_callback=None, batch_sizes=False).fit(1)
    assert learn.simple_profile.section('Diagnosis').verdict != 'loss'  # unregistered: gone

def test_a_rule_declares_what_it_covers():
    "Suppression is declared on the rule: a finding whose resource another rule's finding covers is left out, once, in `diagnose`"
    @rule('host', name='test_covers', covers=('compute',))
    def covering(ev): return [ev.finding('host', 'made up', lambda ph: ph.step/1.2, say='`x`')]
    try:
        learn = _learner()
        learn.profile(show_report=False, logger_callback=None, batch_sizes=False).fit(1)
        d = learn.simple_profile.section('Diagnosis')
        assert not any(f.resource == 'compute' for f in d.findings) and any(f.rule == 'test_covers' for f in d.findings)
    finally: RULES.pop('test_covers', None)
    learn = _learner()
    learn.profile(show_report=False, logger_callback=None, batch_sizes=False).fit(1)
    assert any(f.resource == 'compute' for f in learn.simple_profile.section('Diagnosis').findings)

def test_a_costly_rule_runs_only_where_it_could_be_said():
    "The batch sizes are measured only where their largest possible speedup, weighed as a new batch size, could rank among the fixes said"
    from fastprofile.analysis.diagnosis import _worth_measuring, SHOWN
    heavy = [Finding('input', 50., 50., 'x', 10., 'model') for _ in range(SHOWN)]  # four fixes that save 90% of the fit each
    costly = lambda most: [Rule('sizes', lambda ev: [], 'per_batch', costly=True, most=lambda ev: most)]
    assert not _worth_measuring(None, heavy, costly(2.))                # at most 2x per sample: it cannot rank among them
    assert _worth_measuring(None, heavy, costly(float('inf')))          # not known: measure
    assert _worth_measuring(None, heavy[:2], costly(2.))                # room among the fixes said: measure
    assert _worth_measuring(None, [Finding('input', 5., 5., 'x', 1.1, 'model')]*SHOWN, costly(2.))  # it could lead them

def test_a_probes_rules_come_in_through_register():
    "A measurement's rules are its probe's (`Probe.rules`): `learn.profile(probes=[...])` registers the class, and with it its rules; its finding is in the diagnosis"
    from fastprofile.engine.core import Probe, PROBES
    from fastprofile.analysis.diagnosis import diagnose
    def slow_loss(ev):
        n = ev.facts.test_loss_probe  # what the probe measured, read as `facts.<key>`
        return [ev.finding('loss', f"the loss ran {n} times: a cheaper one (made up, for the test).", lambda ph: ph.step/4,
                           say='`loss_func=L1LossFlat()`', cause='the loss takes 75% of the step', share=75.)]
    class LossProbe(Probe):
        "Measures nothing but its key; its rule reads it"
        key,rules = 'test_loss_probe',(Rule('test_probe_rule', slow_loss, 'loss', ('facts.test_loss_probe',)),)
        def measured(self): return 3
    assert 'test_probe_rule' not in RULES
    try:
        learn = _learner()
        learn.profile(probes=[LossProbe()], show_report=False, logger_callback=None, batch_sizes=False).fit(1)
        assert RULES['test_probe_rule'] is LossProbe.rules[0] and list(RULES)[-1] == 'test_probe_rule'  # after fastprofile's
        d = diagnose(learn)
        assert d.first.rule == 'test_probe_rule' and d.predicted_speedup == pytest.approx(4), d
        assert d.knob.startswith('the loss ran 3 times') and 'Fix: `loss_func=L1LossFlat()`: 4.00x predicted.' in d.lines()
        assert learn.simple_profile.section('Diagnosis').first.rule == 'test_probe_rule'  # the report's diagnosis too
    finally: RULES.pop('test_probe_rule', None); PROBES.pop('test_loss_probe', None)

def test_the_diagnosis_and_the_engine_import_no_measurement():
    "The diagnosis names no probe (each measurement's rules plug in through `Probe.rules`); the engine imports neither probes, analysis, lifecycle nor fastai"
    import ast
    from pathlib import Path
    root = Path(__file__).parent.parent/'fastprofile'
    def imported(p):
        out = []
        for n in ast.walk(ast.parse(p.read_text(encoding='utf-8'))):
            if isinstance(n, ast.ImportFrom): out.append('.'*n.level + (n.module or ''))
            elif isinstance(n, ast.Import): out += [a.name for a in n.names]
        return out
    bad = [m for m in imported(root/'analysis'/'diagnosis.py') if m.startswith(('..probes', 'fastprofile.probes'))]
    assert not bad, f"fastprofile/analysis/diagnosis.py imports {bad}"
    for p in sorted((root/'engine').glob('*.py')):
        bad = [m for m in imported(p) if m.startswith(('..probes', '..analysis', '..lifecycle', 'fastprofile.probes',
                                                         'fastprofile.analysis', 'fastprofile.lifecycle', 'fastai'))]
        assert not bad, f"{p.relative_to(root.parent)} imports {bad}"

# the probes' facts the diagnosis' pipeline model is built from, read by name in diagnosis.py: each phase's loader timing
# (`loading`), the callbacks' and transforms' costs (`breakdown`, else `callback_costs`), the compile time set apart from the
# warm-up (`compile`); every other measurement speaks through its probe
CORE_READS = {'loading', 'breakdown', 'callback_costs', 'compile'}

def keys_named(path, keys) -> dict:
    """key -> how many times `path`'s code names it: an attribute `.key`, a string 'key', or 'facts.key' in a string
    (0.2.0's names in `MOVED_OUT`, each kept where it moved, aside)"""
    import ast
    from collections import Counter
    tree,got = ast.parse(path.read_text(encoding='utf-8')),Counter()
    moved = {id(x) for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(getattr(t, 'id', None) == 'MOVED_OUT' for t in n.targets)
             for x in ast.walk(n)}
    for n in ast.walk(tree):
        if id(n) in moved: continue
        if isinstance(n, ast.Attribute) and n.attr in keys: got[n.attr] += 1
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            got.update(k for k in [n.value, *re.findall(r'facts\.(\w+)', n.value)] if k in keys)
    return dict(got)

def test_the_diagnosis_reads_no_measurement_by_name():
    """What a measurement adds to the diagnosis comes through its probe (`Probe.preface`, `evidence`, `rests_on`, `numbers`,
    `rules`): diagnosis.py names no probe's key but the pipeline model's inputs (`CORE_READS`)"""
    from pathlib import Path
    import fastprofile.all
    from fastprofile.engine.core import PROBES
    keys = {k for k,c in PROBES.items() if c.__module__.startswith('fastprofile.')}
    assert {'machine', 'layers', 'batch_sizes', 'telemetry', 'efficiency', 'loading'} <= keys, keys  # fastprofile's probes
    named = keys_named(Path(__file__).parent.parent/'fastprofile'/'analysis'/'diagnosis.py', keys)
    assert {k:n for k,n in named.items() if k not in CORE_READS} == {}, named

def test_the_rules_apply_in_their_order():
    "The core's rules and each measurement's (registered with its probe, imported first) apply in one declared order (`Rule.order`), a rule of yours after them"
    builtin = ['host', 'batch_size', 'input', 'copy', 'batch_tfms', 'compute', 'efficiency', 'layers', 'throttling', 'optimizer',
               'callbacks', 'outside', 'compile']
    assert [n for n in RULES if n in builtin] == builtin
    @rule('loss', name='test_last')
    def last(ev): return []
    try: assert list(RULES)[-1] == 'test_last' and RULES['test_last'].order > max(RULES[n].order for n in builtin)
    finally: RULES.pop('test_last', None)
