"""Profiles as files and side by side: saved, loaded in a fresh process and compared there as here; the comparison
as a person sees it in JupyterLab (Chromium, light and dark); `fastprofile compare` as a CI gate and its exit codes"""
import contextlib, io, json, subprocess, sys, time
from pathlib import Path
import pytest
from fastai.basics import *
from fastai.callback.all import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.cli import main
from fastprofile.engine.record import Row
from test_report import needs_chromium, measure

QUIET = dict(show_report=False, logger_callback=None)
FASTPROFILE = Path(sys.executable).parent/'fastprofile'  # the console script `pip install` made

class SlowModel(Module):
    "A linear model whose forward sleeps `delay` seconds: a run that is slower than another for sure"
    def __init__(self, delay): self.lin,self.delay = nn.Linear(1, 1),delay
    def forward(self, x):
        if self.delay: time.sleep(self.delay)
        return self.lin(x)

def slow_metric(inp, targ): time.sleep(.005); return (inp - targ).abs().mean()

def profiled(delay=0., metrics=None, n_trn=8, **kw):
    "The profile of one epoch of a small learner"
    learn = synth_learner(n_trn=n_trn, n_val=4, model=SlowModel(delay), metrics=metrics)
    learn.remove_cb(ProgressCallback); learn.logger = noop
    learn.profile(**QUIET, **kw).fit(1)
    return learn.simple_profile

@pytest.fixture(scope='module')
def pair():
    "A run with a slow metric, then the same without it and with a breakdown (its facts saved too)"
    return profiled(metrics=slow_metric),profiled(breakdown=True)

FRESH = """
import json, sys
from fastprofile.sinks.saving import load_profile
from fastprofile.fixes.compare import compare
a,b = load_profile(sys.argv[1]),load_profile(sys.argv[2])
c = compare(a, b)
print(json.dumps(dict(table=c.table.to_json(), verdict=c.report.section('Verdict').lines, results=a.results.to_json(),
                      bd=b.facts.breakdown.callback_costs().to_json(), diagnosis=a.section('Diagnosis').lines(),
                      about=a.about, learners='fastai.learner' in sys.modules and 0)))
"""

def test_save_load_compare_round_trips_in_a_fresh_process(pair, tmp_path):
    "A process that never saw a learner reads both files and compares them: every number and line as in the process that saved them"
    a,b = pair
    a.save(tmp_path/'a.json'); b.save(tmp_path/'b.json')
    d = json.loads((tmp_path/'a.json').read_text())
    assert d['format'] == 'fastprofile.profile' and d['schema'] == 1 and d['versions']['fastprofile']
    assert d['diagnosis']['verdict'] == a.section('Diagnosis').verdict and d['machine']['cpus'] and d['device']['type'] == 'cpu'
    r = subprocess.run([sys.executable, '-c', FRESH, str(tmp_path/'a.json'), str(tmp_path/'b.json')], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got,here = json.loads(r.stdout),compare(a, b)
    assert got['table'] == here.table.to_json() and got['results'] == a.results.to_json()   # bit for bit
    assert got['diagnosis'] == a.section('Diagnosis').lines() and got['verdict'] == here.report.section('Verdict').lines
    assert got['bd'] == b.facts.breakdown.callback_costs().to_json()
    assert got['about']['source'].endswith("a.json'") and got['about']['created'] == d['created']

def test_a_saved_file_is_plain_json(pair, tmp_path):
    "No NaN or Infinity tokens (which plain JSON has not): a strict reader parses it"
    pair[0].save(tmp_path/'a.json')
    def strict(c): raise ValueError(f"not plain JSON: {c}")
    d = json.loads((tmp_path/'a.json').read_text(), parse_constant=strict)
    assert d['record']['overhead_per_batch'] in ('NaN',) or isinstance(d['record']['overhead_per_batch'], float)

@needs_chromium
@pytest.mark.parametrize('theme', ['light', 'dark'])
def test_the_comparison_html_does_not_wrap(pair, theme, tmp_path):
    "In a 960 px JupyterLab page no cell of the comparison takes two lines, every row is one line high, and its text is readable"
    c = compare(*pair)
    m = measure(c._repr_html_(), theme, 960, tmp_path)
    assert m['cells'] >= 7*len(c.table), m['cells']
    assert m['wrapped'] == [], m['wrapped']
    assert max(m['rowHeights']) < 1.3*min(m['rowHeights']), m['rowHeights']
    assert m['visible'] == ['', 'Mean\xa0before', 'Mean\xa0after', 'Δ', 'Δ%', 'Samples/s\xa0before', 'Samples/s\xa0after'], m['visible']
    long = measure(compare(*pair, names=('with the slow metric', 'without it'))._repr_html_(), theme, 700, tmp_path)
    assert long['wrapped'] == [] and long['scrollWidth'] > long['clientWidth'], long  # long names: it scrolls, never wraps
    assert m['low'] == [], m['low']

def test_check_advice_and_its_comparison(tmp_path):
    "`check_advice` shows its two windows side by side"
    learn = synth_learner(n_trn=10, n_val=10, metrics=slow_metric)
    learn.remove_cb(ProgressCallback); learn.logger = noop
    chk = check_advice(learn, n_batches=6, resource='callbacks')
    c = chk.comparison
    assert isinstance(c, Comparison) and set(c.table.Step) == {''}
    assert 'Profile comparison: before -> after' in repr(chk) and '<table' in chk._repr_html_()

def _main(*argv):
    out,err = io.StringIO(),io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = main(list(map(str, argv)))
        except SystemExit as e: rc = e.code  # argparse refusing an argument
    return rc,out.getvalue(),err.getvalue()

def test_the_cli_gate_exit_codes(tmp_path):
    "0 within the limit, 1 slower by more than it, 2 on bad input (one line on stderr, no traceback)"
    fast,slow = tmp_path/'fast.json',tmp_path/'slow.json'
    profiled(0.).save(fast); profiled(.01).save(slow)   # a forward of 10 ms more per batch
    rc,out,err = _main('compare', fast, slow, '--fail-if-slower', '5%')
    assert rc == 1 and 'slower' in err and 'limit 5%' in err, (rc, err)
    assert 'Profile comparison' in out
    assert _main('compare', slow, fast, '--fail-if-slower', '5%')[0] == 0
    rc,out,_ = _main('compare', fast, fast, '--fail-if-slower', '0')
    assert rc == 0 and 'within the limit' in out
    assert _main('compare', fast, slow)[0] == 0                      # no gate: a comparison only
    assert '| Phase | Action | Step |' in _main('compare', fast, slow, '--markdown')[1]
    (tmp_path/'bad.json').write_text('{"format": "fastprofile.profile", "schema": 99}')
    (tmp_path/'notjson.json').write_text('[1,')
    profiled(n_trn=1).save(tmp_path/'empty.json')                   # one training batch: all warm-up, no steady state
    for argv,msg in (((fast, tmp_path/'missing.json'), 'no such file'), ((fast, tmp_path/'notjson.json'), 'not JSON'),
                     ((tmp_path/'bad.json', fast), 'newer fastprofile'), ((fast, tmp_path/'empty.json', '--fail-if-slower', '5%'), 'no steady-state'),
                     ((fast, slow, '--fail-if-slower', 'fast'), 'must be a percentage')):
        rc,out,err = _main('compare', *argv)
        assert rc == 2 and msg in err and 'Traceback' not in err, (argv, rc, err)
    r = subprocess.run([str(FASTPROFILE), 'compare', str(fast), str(slow), '--fail-if-slower', '5%', '--plain'],
                       capture_output=True, text=True, timeout=300)        # the console script, as CI runs it
    assert r.returncode == 1 and 'slower' in r.stderr, r.stderr

def test_demo_tune_runs_the_loop_end_to_end(tmp_path):
    "`fastprofile demo --tune --save`: profiled, tuned, trained again and compared; both profiles saved"
    rc,out,err = _main('demo', '--epochs', '1', '--n-train', '128', '--size', '16', '--bs', '32', '--plain', '--tune', '--budget', '10',
                       '--save', tmp_path/'demo.json')
    assert rc == 0, err
    assert 'Tune: changes measured' in out and 'Profile comparison: before -> tuned' in out
    for f in ('demo.json', 'demo.tuned.json'): assert load_profile(tmp_path/f).record.stats[Row('train','batch')].n > 0

class PerBatchModel(Module):
    "A forward that sleeps 4 ms whatever the batch size: per-batch work (a launch-bound GPU model)"
    def __init__(self): self.lin = nn.Linear(1, 1)
    def forward(self, x): time.sleep(.004); return self.lin(x)

def test_different_batch_sizes_are_compared_per_sample():
    "bs 32 against bs 64 on per-batch work: the fit takes about as long with twice the samples; the table and the verdict say faster, per sample, as samples/s does"
    from fastai.test_utils import synth_dbunch
    def at(bs):
        learn = synth_learner(data=synth_dbunch(n_train=8, n_valid=2, bs=bs), model=PerBatchModel())
        learn.remove_cb(ProgressCallback); learn.logger = noop
        learn.profile(**QUIET).fit(1)
        return learn.simple_profile
    c = compare(at(32), at(64), rows='main')
    assert c.speedup > 1.3, c.plain()
    rows = c.table.set_index(['Phase', 'Action'])
    for row in (('fit', 'fit'), ('train', 'batch')):  # each a time per sample: shorter, as the rates are higher
        r = rows.loc[row]
        assert r['Δ%'] < 0 and r['Samples/s after'] > r['Samples/s before'], (row, c.plain())
    text = c.plain(120)
    assert 'Per sample before' in text and 'per sample (batch size 32 -> 64)' in text and 'slower' not in text, text
    assert 'the batch sizes differ: 32 -> 64' in text
    same = compare(at(32), at(32), rows='main')
    assert 'Mean before' in same.plain(120) and 'per batch' in same.plain(120)  # the same batch size: per call, as before
