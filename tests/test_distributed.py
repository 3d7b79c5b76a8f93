"Profiling a real 2-process DDP fit on CPU (gloo): gather to rank 0, spread across ranks, straggler, merged trace, ranks that fail or come late"
import json, os, subprocess, sys, time
from pathlib import Path
import pandas as pd, pytest

pytest.importorskip('accelerate', reason="fastai's distrib_ctx needs accelerate (pip install accelerate)")
SCRIPT = Path(__file__).with_name('ddp_script.py')
ROOT = SCRIPT.parent.parent

def launch(out:Path, *args, timeout=150):
    "Run tests/ddp_script.py on 2 CPU ranks with torchrun (free port via --standalone); its rank JSONs and output"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]), OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(SCRIPT), str(out), *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    ranks = [json.loads((out/f'rank{r}.json').read_text()) for r in (0, 1)]
    return ranks,p.stdout

def show(capsys, what, r0, r1):
    "Print the timings of a run: in the captured output (shown with `-rP` or `-s`, and on a failure), so the suite stays quiet"
    print(f"\n[ddp] {what}: rank 0 waited {r0['gather_seconds']:.3f} s in the gather, {r0['tail_seconds']:.3f} s from its "
          f"fit's end to its call's end; rank 1 took {r1['tail_seconds']:.3f} s, {r1['outcome'].splitlines()[-1].strip()}")

@pytest.fixture(scope='module')
def slow_run(tmp_path_factory):
    "Rank 1's items sleep 2 ms (16 ms a batch); rank 1's profiler clock reads 1000 s ahead"
    out = tmp_path_factory.mktemp('ddp')
    ranks,stdout = launch(out, '--slow-rank', '1', '--clock-shift', '1000', '--telemetry')
    return out,ranks,stdout

@pytest.fixture(scope='module')
def prefetch_run(tmp_path_factory):
    "The slow rank, with CudaPrefetchCallback staging batches (on CPU) in a callback; its items 5 ms each: a few ms of rank 0 descheduled (a core kept busy beside the ranks) stays inside the 10% margin of the step"
    out = tmp_path_factory.mktemp('ddp_prefetch')
    ranks,stdout = launch(out, '--slow-rank', '1', '--delay', '.005', '--prefetch', '--epochs', '1')
    return out,ranks,stdout

def test_gathered_on_rank_0(slow_run):
    out,(r0,r1),stdout = slow_run
    assert r0['world'] == 2 and r0['gathered'] and r0['ranks'] == [0, 1] and r0['missing'] == []
    assert not r1['gathered'] and 'Distributed:' not in r1['report']
    assert r0['warnings'] == [] and r1['warnings'] == []
    # the merged record counts both ranks' batches and samples
    assert r0['calls'] == sum(r0['rank_calls']) and min(r0['rank_calls']) > 0
    assert r0['samples'] == sum(r0['rank_samples']) == 2*r0['rank_samples'][0]
    assert 'Distributed:' in r0['report'] and '2 ranks on 1 host' in r0['report'] and 'Missing' not in r0['report']
    # only rank 0 prints and writes; rank 0 wrote one CSV per rank on request
    assert stdout.count('Simple Profiler Results') == 1
    assert sorted(p.name for p in (out/'rank0').glob('*.csv')) == \
        ['simple_profile.csv', 'simple_profile_rank0.csv', 'simple_profile_rank1.csv']
    assert not (out/'rank1').exists()

def test_telemetry_of_each_rank_in_the_spread(slow_run):
    "Each rank samples itself (here its CPU); its telemetry travels with its record to rank 0, whose Distributed section shows the spread"
    _,(r0,r1),_ = slow_run
    assert len(r0['telemetry_samples']) == 2 and all(n and n >= 2 for n in r0['telemetry_samples'])
    rep = r0['report']
    assert 'Telemetry across ranks (min / median / max, highest rank):' in rep and 'CPU in training ' in rep
    assert 'Telemetry:' in rep and r0['warnings'] == [] and r1['warnings'] == []

def test_spread_and_per_rank_csv(slow_run):
    out,_,_ = slow_run
    sp = pd.read_csv(out/'spread.csv', keep_default_na=False).set_index(['Phase','Action','Step'])
    draw = sp.loc[('train','draw','')]
    assert draw['Slowest Rank'] == 1 and draw['Max'] == draw['Rank 1'] and draw['Min'] == draw['Rank 0']
    assert draw['Rank 1'] > draw['Rank 0'] + .010  # 16 ms of sleeping per batch
    rows = {r: pd.read_csv(out/'rank0'/f'simple_profile_rank{r}.csv', keep_default_na=False)
              .set_index(['Phase','Action','Step']).loc[('train','draw',''),'Mean Duration'] for r in (0, 1)}
    assert rows[0] == pytest.approx(draw['Rank 0']) and rows[1] == pytest.approx(draw['Rank 1'])

def test_slow_rank_named_straggler(slow_run):
    _,(r0,_),_ = slow_run
    named = [(s['rank'], s['phase'], s['interval']) for s in r0['stragglers']]
    assert (1, 'train', 'draw') in named and (1, 'valid', 'draw') in named, named
    assert all(r == 1 for r,_,_ in named), named
    train = next(s for s in r0['stragglers'] if s['phase'] == 'train')
    assert train['waits']['0'][0] == 'backward'  # rank 0 waits in the gradient all-reduce
    assert 'Straggler: rank 1 in train draw' in r0['report'] and 'rank 0 waits in backward' in r0['report']

def test_clocks_aligned_in_merged_trace(slow_run):
    out,(r0,_),_ = slow_run
    assert r0['offsets'][0] == 0 and r0['offsets'][1] == pytest.approx(-1000, abs=.005)
    ev = json.loads((out/'trace.json').read_text())['traceEvents']
    assert {e['args']['name'].split(' (')[0] for e in ev if e['name'] == 'process_name'} == {'rank 0', 'rank 1'}
    # the gradient all-reduce ends both ranks' backward together: the same batch's ends line up on rank 0's clock
    ends = {}
    for e in ev:
        if e['name'] == 'backward': ends.setdefault((e['args']['epoch'], e['args']['iter']), {})[e['pid']] = e['ts'] + e['dur']
    gaps = sorted(abs(v[0] - v[1]) for v in ends.values() if len(v) == 2)
    assert len(gaps) >= 10 and gaps[len(gaps)//2] < 5_000, gaps  # µs

def test_straggler_with_prefetch(prefetch_run):
    _,(r0,_),_ = prefetch_run
    named = [(s['rank'], s['phase'], s['interval']) for s in r0['stragglers']]
    # the prefetcher draws the next batch in its after_step (training) and after_loss (validation) callbacks
    assert (1, 'train', 'callbacks at after_step') in named and (1, 'valid', 'callbacks at after_loss') in named, named
    assert all(r == 1 for r,_,_ in named), named
    assert 'CudaPrefetchCallback was active' in r0['report']

def test_rank_that_cannot_send_its_profile_blocks_nobody(tmp_path, capsys):
    "Rank 1 fails to pack its profile: it sends the error instead, so neither rank waits; rank 0 reports without it"
    (r0,r1),_ = launch(tmp_path/'broken', '--break-rank', '1', '--epochs', '1', '--gather-timeout', '20')
    show(capsys, 'rank 1 cannot pack its profile (gather_timeout 20 s)', r0, r1)
    assert r0['gathered'] and r0['ranks'] == [0] and r0['missing'] == [1]
    assert 'Missing: rank 1 (RuntimeError: cannot pack this profile). The tables leave it out.' in r0['report']
    assert '1 of 2 ranks on 1 host' in r0['report']
    assert any("rank 1's profile could not be gathered (RuntimeError: cannot pack this profile)" in w for w in r0['warnings']), r0['warnings']
    assert r0['gather_seconds'] < 20/4  # told, not waited for
    assert r1['warnings'] == [] and not r1['gathered']  # rank 1 warns nothing and stays quiet, as ranks > 0 do

def test_rank_that_fails_and_goes_on_does_not_hold_rank_0(tmp_path, capsys):
    "Rank 1's fit raises at its end; it catches the error and sleeps 8 s. Rank 0 is told at once: it does not wait"
    t0 = time.monotonic()
    (r0,r1),_ = launch(tmp_path/'fails', '--fail-rank', '1', '--then-sleep', '8', '--epochs', '1', '--gather-timeout', '20')
    show(capsys, f'rank 1 fails and sleeps 8 s (gather_timeout 20 s; the run took {time.monotonic() - t0:.1f} s)', r0, r1)
    assert r1['outcome'].startswith('RuntimeError') and 'this rank failed at the end of its fit' in r1['outcome'] and not r1['gathered']
    assert r0['outcome'] == 'ok' and r0['gathered'] and r0['ranks'] == [0] and r0['missing'] == [1]
    assert r0['gather_seconds'] < 20/4 and r0['tail_seconds'] < 20/4, r0  # far from both the timeout and rank 1's 8 s
    assert 'Missing: rank 1 (its training call ended by an exception)' in r0['report']
    assert r1['warnings'] == []

def test_slow_rank_within_timeout_is_gathered(tmp_path, capsys):
    "Rank 1 reaches the end of its call 1.5 s after rank 0: rank 0 waits for it and reports both"
    (r0,r1),_ = launch(tmp_path/'slow', '--late-rank', '1', '--late', '1.5', '--epochs', '1', '--gather-timeout', '20')
    show(capsys, 'rank 1 arrives 1.5 s late (gather_timeout 20 s)', r0, r1)
    assert r0['gathered'] and r0['ranks'] == [0, 1] and r0['missing'] == [] and r0['warnings'] == []
    assert 1.5*.8 <= r0['gather_seconds'] < 20/4, r0['gather_seconds']  # it waited (about) the 1.5 s: rank 1 was gathered late
    assert abs(r0['offsets'][1]) < .005 and r1['warnings'] == []  # one host, one clock: no offset to speak of

def test_rank_later_than_the_timeout_is_named_missing(tmp_path, capsys):
    "Rank 1 arrives 6 s late with gather_timeout=1.5: rank 0 waits 1.5 s and names it; rank 1 then leaves at once"
    (r0,r1),_ = launch(tmp_path/'late', '--late-rank', '1', '--late', '6', '--epochs', '1', '--gather-timeout', '1.5')
    show(capsys, 'rank 1 arrives 6 s late (gather_timeout 1.5 s)', r0, r1)
    assert r0['gathered'] and r0['ranks'] == [0] and r0['missing'] == [1]
    assert 1.5 <= r0['gather_seconds'] < 1.5 + 1, r0['gather_seconds']
    assert 'Missing: rank 1 (no profile within gather_timeout=1.5 s)' in r0['report']
    assert r1['tail_seconds'] < 1.5, r1  # it finds the gather closed: no waiting on its side either
    assert any('after rank 0 had closed the gather' in w for w in r1['warnings']), r1['warnings']
