"""The GPU suite's `overhead` part (issue 32's table): its arithmetic on recorded times, and the part end to end on CPU
stand-ins (`bench.gpu.fakes`: never a measurement)."""
import json, math
import pytest
from test_bench_gpu import FAKES, INFO, TINY

def test_per_batch_and_per_fit_from_two_fit_lengths():
    "t(n) = a + b·n: b from the long and the short fit, a the rest; each variant against its own baseline in the same round, medians"
    from bench.gpu.overhead import summarize, goals
    c = dict(long=400, short=20)
    t = lambda a, b: dict(long=a + 400*b, short=a + 20*b)
    times = {'plain': [t(.05, 3e-3), t(.06, 3.2e-3), t(.05, 3e-3)],            # the machine drifts in round 2: pairs take it out
             'default': [t(.053, 3.02e-3), t(.063, 3.22e-3), t(.053, 3.02e-3)],
             'lightning plain': [t(.5, 4e-3)]*3, 'lightning simple': [t(.5, 4e-3)]*3}
    s = summarize(times, c)
    assert math.isclose(s['default']['per_batch'], 20e-6, rel_tol=1e-6) and math.isclose(s['default']['per_fit'], 3e-3, rel_tol=1e-6)
    assert math.isclose(s['default']['share'], 20e-6/3e-3, rel_tol=1e-6) and s['default']['rounds'] == 3
    assert s['lightning simple']['baseline'] == 'lightning plain' and abs(s['lightning simple']['per_batch']) < 1e-12
    g = goals(s, first_fit=.04)
    assert g['per_batch']['met'] and g['per_fit']['met'] and g['first_fit']['met'] is False and g['per_fit_shown']['met'] is None

@pytest.mark.slow
def test_overhead_part_on_stand_ins(tmp_path):
    "The part end to end with `torch.cuda` stood in: every variant timed at both lengths each round, the markdown's section and goal rows"
    from bench.gpu import suite
    out = tmp_path/'out'
    rc = suite.run_suite(out, parts=('overhead',), python=FAKES, configs=dict(overhead=dict(TINY['overhead'], rounds=2)), info=dict(INFO),
                         limits=dict(overhead=200), total=250)
    raw = json.loads((out/suite.JSON).read_text())['parts']['overhead']
    assert rc == 0 and raw['status'] == 'ok', raw.get('tail')
    r = raw['results']
    assert r['stand_ins'] and all(len(v) == 2 and set(v[0]) == {'long','short'} for v in r['times'].values())
    assert r['summary']['default']['rounds'] == 2 and r['first_fit_seconds'] > 0
    md = (out/suite.MD).read_text()
    assert "### The default profile's cost on a host-bound step" in md and '| `events off (wall)` | plain |' in md
    assert 'the report shown ≤ 15.00 ms' in md and "first profiled fit: cost beyond a later one ≤ 30.00 ms" in md
