"Chrome traces of real fits (load, nesting, monotone times, every recorded batch), profiler ranges, and headless plots"
import os, json, math
os.environ.setdefault('MPLBACKEND', 'Agg')
import numpy as np, pytest, torch
from PIL import Image
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.learner import *
from fastprofile.engine.record import ProfileRecord
from fastprofile.testing import FakeClock, drive_record
from fastprofile.analysis.trace import trace_events, chrome_trace, save_trace, merge_traces, RecordFunctionCallback, GPU_TID, CPU_TID
from fastprofile.analysis.plots import plot_phase_shares, plot_timeline, plot_profile, save_plots

@pytest.fixture(scope='module')
def learn():
    "A real fit of 3 epochs whose 3*(12+3) batches overflow a 20-batch history"
    learn = synth_learner(n_trn=12, n_val=3)
    learn.profile(show_report=False, logger_callback=None, keep_batches=20).fit(3)
    return learn

def spans(evs): return [e for e in evs if e['ph'] == 'X']

def assert_nested(evs):
    "On each track, every span lies wholly inside the innermost span open at its start"
    tracks = {}
    for e in spans(evs): tracks.setdefault((e['pid'], e['tid']), []).append(e)
    for es in tracks.values():
        stack = []
        for e in es:
            while stack and e['ts'] >= stack[-1]['ts'] + stack[-1]['dur'] - 1e-6: stack.pop()
            if stack: assert e['ts'] + e['dur'] <= stack[-1]['ts'] + stack[-1]['dur'] + 1e-6, (e, stack[-1])
            stack.append(e)

def test_trace_file_loads_nests_and_has_every_batch(learn, tmp_path):
    p = save_trace(learn, tmp_path/'t.json')
    t = json.loads(p.read_text())
    evs = t['traceEvents']
    rec = learn.simple_profile_record
    recent = rec.recent()
    assert len(recent) == 20
    batches = [e for e in evs if e.get('cat') == 'batch']
    got = sorted((e['args']['epoch'], e['name'].split()[0], e['args']['iter']) for e in batches)
    want = sorted(zip(recent.epoch, recent.phase, recent.iter))
    assert got == want
    assert_nested(evs)
    xs = spans(evs)
    assert all(e['dur'] >= 0 for e in xs)
    assert [e['ts'] for e in xs] == sorted(e['ts'] for e in xs)  # monotone
    # inside each batch: draw first, then the steps in loop order, none overlapping
    for b in batches:
        kids = [e for e in xs if e['cat'] in ('draw','step') and b['ts'] <= e['ts'] < b['ts'] + b['dur']]
        names = [e['name'] for e in kids]
        want = ['draw','forward','loss','backward','opt_step','zero_grad'] if b['name'].startswith('train') else ['draw','predict','loss']
        assert names == want, names
        assert all(a['ts'] + a['dur'] <= c['ts'] + 1e-6 for a,c in zip(kids, kids[1:]))
    assert {e['args']['name'] for e in evs if e['name'] == 'thread_name'} == {'CPU (wall clock)'}

def test_trace_of_a_call_with_two_fits_nests_by_stage(tmp_path):
    "`fine_tune` runs two fits whose epochs both start at 0: each stage's phases are their own spans, and nest"
    from fastai.callback.schedule import fine_tune  # noqa: F401 (Learner.fine_tune)
    learn = synth_learner(n_trn=8, n_val=2)
    learn.profile(show_report=False, logger_callback=None).fine_tune(2, freeze_epochs=1)
    evs = json.loads(save_trace(learn, tmp_path/'ft.json').read_text())['traceEvents']
    assert_nested(evs)
    phases = [e for e in spans(evs) if e['cat'] == 'phase']
    assert [e['name'] for e in phases] == [f'{p} (stage {s}, epoch {e})' for s,e in ((0,0),(1,0),(1,1)) for p in ('train','valid')]
    assert all(a['ts'] + a['dur'] <= b['ts'] + 1e-6 for a,b in zip(phases, phases[1:]))  # one after the other
    recent = learn.simple_profile_record.recent()
    batches = [e for e in evs if e.get('cat') == 'batch']
    assert sorted((e['args']['stage'], e['args']['epoch'], e['args']['iter'], e['name'].split()[0]) for e in batches) == \
           sorted(zip(recent.stage, recent.epoch, recent.iter, recent.phase))
    ax = plot_phase_shares(learn).axes[0]
    assert [t.get_text().split()[0] for t in ax.get_xticklabels()] == ['0.0', '1.0', '1.1']

def test_trace_times_match_the_record():
    clock = FakeClock(100.)
    rec = drive_record(ProfileRecord(clock=clock, warmup=0), clock, n_epochs=1, n_train=3, n_valid=1)
    evs = spans(trace_events(rec))
    fwd = [e for e in evs if e['name'] == 'forward']
    assert len(fwd) == 3 and all(math.isclose(e['dur'], 2e4, rel_tol=1e-9) for e in fwd)
    first = min(e['ts'] for e in evs)
    assert math.isclose(first, 1e6*(.025 + .003), rel_tol=1e-9)  # fit start is ts 0

def test_gpu_track_only_with_gpu_columns(learn):
    df = learn.simple_profile_record.recent()
    assert not any(e['tid'] == GPU_TID for e in spans(trace_events(df)))
    df['forward_gpu'] = df['forward']*3
    evs = trace_events(df, rank=2)
    gpu = [e for e in spans(evs) if e['tid'] == GPU_TID]
    assert len(gpu) == (df.phase == 'train').sum() and all(e['pid'] == 2 for e in gpu)
    assert all(b['ts'] >= a['ts'] + a['dur'] - 1e-6 for a,b in zip(gpu, gpu[1:]))
    assert_nested(evs)

def test_merge_ranks(learn, tmp_path):
    paths = [save_trace(learn, tmp_path/f'rank{r}.json', rank=r) for r in range(3)]
    m = merge_traces(paths, tmp_path/'all.json', align='start')
    loaded = json.loads((tmp_path/'all.json').read_text())
    assert loaded == m
    assert sorted({e['pid'] for e in m['traceEvents']}) == [0,1,2]
    names = {e['args']['name'] for e in m['traceEvents'] if e['name'] == 'process_name'}
    assert names == {'rank 0','rank 1','rank 2'}
    n = len(spans(json.loads(paths[0].read_text())['traceEvents']))
    assert len(spans(m['traceEvents'])) == 3*n

def test_record_function_ranges_in_torch_profiler():
    from torch.profiler import profile, ProfilerActivity
    learn = synth_learner(n_trn=5, n_val=2).annotate()
    with profile(activities=[ProfilerActivity.CPU]) as prof: learn.fit(1)
    evs = [e for e in prof.events() if e.name.startswith('fastai.')]
    count = lambda n: sum(e.name == n for e in evs)
    assert count('fastai.batch') == 7 and count('fastai.draw') == 7
    assert count('fastai.forward') == 5 and count('fastai.backward') == 5 and count('fastai.predict') == 2
    # ranges nest: every forward inside a batch, every batch inside its phase
    within = lambda inner, outer: any(o.time_range.start <= i.time_range.start and i.time_range.end <= o.time_range.end
                                      for o in evs if o.name == outer for i in [inner])
    assert all(within(e, 'fastai.batch') for e in evs if e.name in ('fastai.forward','fastai.opt_step'))
    assert all(within(e, 'fastai.train') or within(e, 'fastai.valid') for e in evs if e.name == 'fastai.batch')

def test_nvtx_without_cuda_warns():
    if torch.cuda.is_available(): pytest.skip('CUDA present')
    with pytest.warns(UserWarning, match='NVTX'): cb = RecordFunctionCallback(nvtx=True)
    assert cb.nvtx is False

def _png_ok(path, min_w=600):
    im = Image.open(path)
    assert im.format == 'PNG' and im.width >= min_w
    a = np.asarray(im.convert('L'), dtype=np.float32)
    assert a.std() > 10  # not blank
    return im

def test_plots_render_headless(learn, tmp_path):
    for name,fig in [('shares', plot_phase_shares(learn)), ('timeline', plot_timeline(learn, last=None))]:
        fig.savefig(tmp_path/f'{name}.png')
        _png_ok(tmp_path/f'{name}.png')
    tl = plot_timeline(learn, last=None)
    bars = [p for p in tl.axes[1].patches if p.get_height() > 0 and p.get_facecolor()[3] > 0]
    assert len({round(p.get_x(), 3) for p in bars}) == 20  # one bar per recorded batch
    p = save_plots(learn, tmp_path/'sub'/'profile.png')
    _png_ok(p, 1000)
    assert not [q for q in (tmp_path/'sub').iterdir() if q.name.startswith('.')]  # no temporary file left
    with pytest.raises(ValueError, match=r'must end in \.png'): save_plots(learn, tmp_path/'x.bmp')

def test_readme_image_exists():
    p = Path(__file__).parent.parent/'docs'/'img'/'profile.png'
    _png_ok(p, 1000)

def test_nesting_check_can_fail():
    x = lambda ts, dur: {'ph':'X', 'ts':ts, 'dur':dur, 'pid':0, 'tid':0}
    assert_nested([x(0, 10), x(2, 3), x(6, 4)])
    with pytest.raises(AssertionError): assert_nested([x(0, 10), x(5, 10)])
