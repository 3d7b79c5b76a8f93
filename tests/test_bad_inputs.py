"""Every bad input to a public entry point is refused at the call: a `TypeError`/`ValueError` raised by fastprofile
(not from deep inside pandas, pathlib, matplotlib, numpy or torch) whose message names the parameter; nothing is
trained or written, the learner is unchanged, and a plain `learn.fit` works right after.

One table, one row per bad input. Each row: an id, the call (a function of the `Env` below), the exception type and the
text the message must hold (the parameter's name, and where it reads naturally the value given)."""
import os, sys, subprocess, traceback, warnings
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple
import pytest, torch
from fastai.basics import *
from fastai.test_utils import synth_learner
import fastprofile
from fastprofile.all import *
from fastprofile.learner import NoProfileError
from fastprofile.lifecycle.session import Session
from fastprofile.analysis.distributed import RankProfile, find_stragglers, interval_means, merge_records, merged_trace, rank_csv_path, rank_gather, rank_spread
from fastprofile.analysis.trace import chrome_trace, merge_traces, trace_events

PKG = Path(fastprofile.__file__).parent
FASTPROFILE = Path(sys.executable).parent/'fastprofile'  # the console script `pip install` made
CPU_ONLY = not torch.cuda.is_available()

class Row(NamedTuple):
    id:str; call:object; exc:type; must:tuple

def bad(id, call, exc, *must): return Row(id, call, exc, must)

def cli(*argv):
    "A CLI row: the console script refuses `argv` (exit 2, one line on stderr, nothing on stdout)"
    def f(env):
        r = subprocess.run([str(FASTPROFILE), *[a.format(tmp=env.tmp) for a in argv]], capture_output=True, text=True,
                           timeout=120, cwd=env.tmp)
        assert r.returncode == 2 and r.stdout == '' and 'Traceback' not in r.stderr, (argv, r.returncode, r.stdout, r.stderr)
        raise _CliRefusal(r.stderr.strip().splitlines()[-1])
    return f

class _CliRefusal(ValueError):
    "The CLI's refusal, as an exception, so CLI rows read like the others"

def _under_torchrun(f, world=2):
    "`f()` with torchrun's `WORLD_SIZE` set, as in each process of a 2-process run before `torch.distributed` starts"
    old = os.environ.get('WORLD_SIZE')
    os.environ['WORLD_SIZE'] = str(world)
    try: return f()
    finally:
        if old is None: os.environ.pop('WORLD_SIZE', None)
        else: os.environ['WORLD_SIZE'] = old

def p(env, *parts): return str(Path(env.tmp, *parts))  # a path in the row's scratch folder ('file' is a plain file)

ROWS = [
    # ---- Learner.profile: every option ----
    bad('profile-logger-int', lambda e: e.learn.profile(logger_callback=123), ValueError, '`logger_callback`', '123'),
    bad('profile-logger-name', lambda e: e.learn.profile(logger_callback='mlflow'), ValueError, '`logger_callback`', "'mlflow'"),
    bad('profile-csv-int', lambda e: e.learn.profile(save_csv=True, csv_name=123), TypeError, '`csv_name`', '123'),
    bad('profile-csv-dotdot', lambda e: e.learn.profile(save_csv=True, csv_name='..'), ValueError, '`csv_name`', "'..'"),
    bad('profile-csv-under-file', lambda e: e.learn.profile(save_csv=True, csv_name=p(e, 'file', 'r.csv')), ValueError, '`csv_name`', 'is a file'),
    bad('profile-csv-folder', lambda e: e.learn.profile(save_csv=True, csv_name=e.tmp), ValueError, '`csv_name`', 'a folder'),
    bad('profile-csv-name-too-long', lambda e: e.learn.profile(save_csv=True, csv_name='x'*300 + '.csv'), ValueError, '`csv_name`', 'PC_NAME_MAX', '304 bytes'),
    bad('profile-rank-csv-name-too-long', lambda e: _under_torchrun(lambda: e.learn.profile(rank_csv=True, csv_name='x'*248 + '.csv')),
        ValueError, '`csv_name`', 'PC_NAME_MAX', '_rank1.csv', '258 bytes'),
    bad('profile-csv-folder-name-too-long', lambda e: e.learn.profile(save_csv=True, csv_name=p(e, 'd'*300, 'r.csv')), ValueError, '`csv_name`', 'PC_NAME_MAX'),
    bad('profile-csv-path-too-long', lambda e: e.learn.profile(save_csv=True, csv_name='a/'*2100 + 'r.csv'), ValueError, '`csv_name`', 'PC_PATH_MAX'),
    bad('profile-csv-without-save', lambda e: e.learn.profile(csv_name='r.csv'), ValueError, '`csv_name`', 'save_csv=True'),
    bad('profile-breakdown-str', lambda e: e.learn.profile(breakdown='yes'), TypeError, '`breakdown`', "'yes'"),
    bad('profile-rank-csv-int', lambda e: e.learn.profile(rank_csv=1), TypeError, '`rank_csv`'),
    bad('profile-gather-timeout-0', lambda e: e.learn.profile(gather_timeout=0), ValueError, '`gather_timeout`', '> 0'),
    bad('profile-gather-timeout-str', lambda e: e.learn.profile(gather_timeout='30'), TypeError, '`gather_timeout`', "'30'"),
    bad('profile-gather-timeout-nan', lambda e: e.learn.profile(gather_timeout=float('nan')), ValueError, '`gather_timeout`'),
    bad('profile-show-report-str', lambda e: e.learn.profile(show_report='yes'), TypeError, '`show_report`', "'yes'"),
    bad('profile-plain-none', lambda e: e.learn.profile(plain=None), TypeError, '`plain`', 'None'),
    bad('profile-markdown-int', lambda e: e.learn.profile(markdown=1), TypeError, '`markdown`'),
    bad('profile-save-csv-str', lambda e: e.learn.profile(save_csv='no'), TypeError, '`save_csv`', "'no'"),
    bad('profile-log-every-0', lambda e: e.learn.profile(log_every=0), ValueError, '`log_every`', '>= 1'),
    bad('profile-log-every-float', lambda e: e.learn.profile(log_every=2.5), TypeError, '`log_every`', '2.5'),
    bad('profile-warmup-neg', lambda e: e.learn.profile(warmup=-1), ValueError, '`warmup`', '-1'),
    bad('profile-warmup-huge', lambda e: e.learn.profile(warmup=10**9), ValueError, '`warmup', 'no batch'),
    bad('profile-warmup-bool', lambda e: e.learn.profile(warmup=True), TypeError, '`warmup`', 'bool'),
    bad('profile-keep-0', lambda e: e.learn.profile(keep_batches=0), ValueError, '`keep_batches`'),
    bad('profile-keep-huge', lambda e: e.learn.profile(keep_batches=10**8), ValueError, '`keep_batches`', '1000000'),
    bad('profile-timing-name', lambda e: e.learn.profile(timing='gpu'), ValueError, '`timing`', "'gpu'", "'wall'"),
    bad('profile-events-every-0', lambda e: e.learn.profile(events_every=0), ValueError, '`events_every`', '0'),
    bad('profile-events-every-float', lambda e: e.learn.profile(events_every=2.5), TypeError, '`events_every`', '2.5'),
    *([bad('profile-timing-events-cpu', lambda e: e.learn.profile(timing='events'), ValueError, '`timing', "'events'", 'CUDA'),
       bad('profile-timing-sync-cpu', lambda e: e.learn.profile(timing='sync'), ValueError, '`timing', "'sync'", 'CUDA')] if CPU_ONLY else []),
    bad('profile-telemetry-name', lambda e: e.learn.profile(telemetry='always'), ValueError, '`telemetry`', "'always'", "'auto'"),
    bad('profile-telemetry-every-0', lambda e: e.learn.profile(telemetry=True, telemetry_every=0), ValueError, '`telemetry_every`', '0.005'),
    bad('profile-telemetry-every-str', lambda e: e.learn.profile(telemetry=True, telemetry_every='50ms'), TypeError, '`telemetry_every`', "'50ms'"),
    bad('profile-telemetry-every-off', lambda e: e.learn.profile(telemetry=False, telemetry_every=.01), ValueError, '`telemetry_every=0.01`', 'telemetry=False'),
    bad('profile-memory-snapshot-str', lambda e: e.learn.profile(memory_snapshot='yes'), TypeError, '`memory_snapshot`', "'yes'"),
    *([bad('profile-telemetry-every-cpu', lambda e: e.learn.profile(telemetry_every=.01), ValueError, '`telemetry_every=0.01`', 'telemetry=True'),
       bad('profile-memory-snapshot-cpu', lambda e: e.learn.profile(memory_snapshot=True), ValueError, '`memory_snapshot=True`', 'trains on cpu')]
      if CPU_ONLY else []),
    bad('profile-sps-str', lambda e: e.learn.profile(samples_per_second='y'), TypeError, '`samples_per_second`'),
    bad('profile-unknown-option', lambda e: e.learn.profile(show_reprot=False), TypeError, "'show_reprot'", 'valid options'),
    # ---- ProfileOptions, Profile, ProfileRecord ----
    bad('options-keep-neg', lambda e: ProfileOptions(keep_batches=-1), ValueError, '`keep_batches`'),
    bad('options-timing-none', lambda e: ProfileOptions(timing=None), ValueError, '`timing`', 'None'),
    bad('profile-obj-options-dict', lambda e: Profile(options={'warmup':1}), TypeError, '`options`', 'dict'),
    bad('profile-obj-sinks', lambda e: Profile(sinks=[3]), TypeError, '`sinks`', '3'),
    bad('profile-obj-sinks-str', lambda e: Profile(sinks='wandb'), TypeError, '`sinks`', "'wandb'"),
    bad('profile-obj-clock', lambda e: Profile(clock=3), TypeError, '`clock`', '3'),
    bad('profile-obj-gather', lambda e: Profile(gather='ranks'), TypeError, '`gather`', "'ranks'"),
    bad('profile-obj-csv-path', lambda e: Profile(csv_path=p(e, 'file', 'r.csv')), ValueError, '`csv_path`', 'is a file'),
    bad('result-record-none', lambda e: ProfileResult(None), TypeError, '`record`', 'None'),
    bad('result-facts-dict', lambda e: ProfileResult(e.learn.simple_profile_record, facts={'device':'cpu'}), TypeError, '`facts`', 'dict'),
    bad('result-sections-int', lambda e: ProfileResult(e.learn.simple_profile_record, sections=[1]), TypeError, '`sections`', '1'),
    bad('record-keep-huge', lambda e: ProfileRecord(keep_batches=10**8), ValueError, '`keep_batches`', '100000000'),
    bad('record-warmup-neg', lambda e: ProfileRecord(warmup=-2), ValueError, '`warmup`', '-2'),
    bad('record-fold-0', lambda e: ProfileRecord(fold_every=0), ValueError, '`fold_every`'),
    bad('record-keep-epochs-str', lambda e: ProfileRecord(keep_epochs='x'), TypeError, '`keep_epochs`', "'x'"),
    bad('record-clock', lambda e: ProfileRecord(clock='now'), TypeError, '`clock`', "'now'"),
    # ---- simple_profile_* before any profiled call ----
    bad('results-before-profile', lambda e: e.fresh.simple_profile_results, NoProfileError, 'learn.profile()'),
    bad('report-before-profile', lambda e: e.fresh.simple_profile_report, NoProfileError, 'learn.profile()'),
    bad('breakdown-before-profile', lambda e: e.fresh.simple_profile_breakdown, NoProfileError, 'learn.profile()'),
    # ---- BreakdownProbe ----
    bad('breakdown-callbacks-str', lambda e: BreakdownProbe(callbacks='all'), TypeError, '`callbacks`', "'all'"),
    bad('breakdown-draw-none', lambda e: BreakdownProbe(draw=None), TypeError, '`draw`', 'None'),
    bad('breakdown-add-bad', lambda e: e.learn.add_cb(BreakdownProbe(draw=1)), TypeError, '`draw`'),
    # ---- CudaPrefetchCallback / Learner.prefetch ----
    bad('prefetch-cb-pin-str', lambda e: CudaPrefetchCallback(pin='yes'), TypeError, '`pin`', "'yes'"),
    bad('prefetch-cb-ops-int', lambda e: CudaPrefetchCallback(ops=3), TypeError, '`ops`', '3'),
    bad('prefetch-pin-int', lambda e: e.learn.prefetch(pin=1), TypeError, '`pin`'),
    bad('prefetch-ops-str', lambda e: e.learn.prefetch(ops='logging'), TypeError, '`ops`', "'logging'"),
    bad('prefetch-unknown', lambda e: e.learn.prefetch(pinned=True), TypeError, "'pinned'"),
    # ---- RecordFunctionCallback / Learner.annotate (the learner already has one: a bad call must not remove it) ----
    bad('annotate-cb-nvtx-str', lambda e: RecordFunctionCallback(nvtx='yes'), TypeError, '`nvtx`', "'yes'"),
    bad('annotate-cb-prefix-empty', lambda e: RecordFunctionCallback(prefix=''), ValueError, '`prefix`', "''"),
    bad('annotate-cb-prefix-int', lambda e: RecordFunctionCallback(prefix=3), TypeError, '`prefix`', '3'),
    bad('annotate-nvtx-int', lambda e: e.learn.annotate(nvtx=1), TypeError, '`nvtx`'),
    bad('annotate-prefix-none', lambda e: e.learn.annotate(prefix=None), TypeError, '`prefix`', 'None'),
    bad('annotate-unknown', lambda e: e.learn.annotate(nvtx_ranges=True), TypeError, "'nvtx_ranges'"),
    # ---- diagnose ----
    bad('diagnose-workers-neg', lambda e: diagnose(e.learn, num_workers=-3), ValueError, '`num_workers`', '-3'),
    bad('diagnose-workers-str', lambda e: diagnose(e.learn, num_workers='x'), TypeError, '`num_workers`', "'x'"),
    bad('diagnose-workers-float', lambda e: diagnose(e.learn, num_workers=2.), TypeError, '`num_workers`', '2.0'),
    bad('diagnose-src-int', lambda e: diagnose(123), TypeError, '`src`', 'int'),
    bad('diagnose-src-none', lambda e: diagnose(None), TypeError, '`src`', 'NoneType'),
    bad('diagnose-facts-str', lambda e: diagnose(e.learn, facts='cpu'), TypeError, '`facts`', "'cpu'"),
    bad('diagnose-unprofiled', lambda e: diagnose(e.fresh), NoProfileError, 'learn.profile()'),
    # ---- check_advice (lr=None is valid: it means learn.lr) ----
    bad('advice-lr-str', lambda e: check_advice(e.learn, lr='fast'), TypeError, '`lr`', "'fast'"),
    bad('advice-lr-0', lambda e: check_advice(e.learn, lr=0), ValueError, '`lr`', '> 0'),
    bad('advice-lr-neg', lambda e: check_advice(e.learn, lr=-1e-3), ValueError, '`lr`', '-0.001'),
    bad('advice-lr-inf', lambda e: check_advice(e.learn, lr=float('inf')), ValueError, '`lr`', 'inf'),
    bad('advice-n-batches-1', lambda e: check_advice(e.learn, n_batches=1), ValueError, '`n_batches`', '>= 2'),
    bad('advice-n-batches-str', lambda e: check_advice(e.learn, n_batches='30'), TypeError, '`n_batches`', "'30'"),
    bad('advice-n-valid-0', lambda e: check_advice(e.learn, n_valid=0), ValueError, '`n_valid`'),
    bad('advice-resource', lambda e: check_advice(e.learn, resource='gpu'), ValueError, '`resource`', "'gpu'", "'input'"),
    bad('advice-learn-str', lambda e: check_advice('learn'), TypeError, '`learn`', "'learn'"),
    # ---- preserved ----
    bad('preserved-int', lambda e: preserved(3).__enter__(), TypeError, '`learn`', '3'),
    bad('preserved-none', lambda e: preserved(None).__enter__(), TypeError, '`learn`', 'None'),
    # ---- save_plots / plot_profile / plot_timeline / plot_phase_shares ----
    bad('plots-path-int', lambda e: save_plots(e.learn, 123), TypeError, '`path`', '123'),
    bad('plots-path-none', lambda e: save_plots(e.learn, None), TypeError, '`path`', 'None'),
    bad('plots-path-gif', lambda e: save_plots(e.learn, p(e, 'p.gif')), ValueError, '`path`', '.png'),
    bad('plots-path-under-file', lambda e: save_plots(e.learn, p(e, 'file', 'p.png')), ValueError, '`path`', 'is a file'),
    bad('plots-path-folder', lambda e: save_plots(e.learn, e.tmp), ValueError, '`path`', 'a folder'),
    bad('plots-path-name-too-long', lambda e: save_plots(e.learn, p(e, 'p'*300 + '.png')), ValueError, '`path`', 'PC_NAME_MAX'),
    bad('plots-last-0', lambda e: save_plots(e.learn, p(e, 'p.png'), last=0), ValueError, '`last`', '0'),
    bad('plots-last-neg', lambda e: save_plots(e.learn, p(e, 'p.png'), last=-5), ValueError, '`last`', '-5'),
    bad('plots-last-str', lambda e: save_plots(e.learn, p(e, 'p.png'), last='all'), TypeError, '`last`', "'all'"),
    bad('plots-dpi-0', lambda e: save_plots(e.learn, p(e, 'p.png'), dpi=0), ValueError, '`dpi`', '0'),
    bad('plots-dpi-str', lambda e: save_plots(e.learn, p(e, 'p.png'), dpi='high'), TypeError, '`dpi`', "'high'"),
    bad('plots-src-int', lambda e: save_plots(123, p(e, 'p.png')), TypeError, '`src`', 'int'),
    bad('plot-profile-last-0', lambda e: plot_profile(e.learn, last=0), ValueError, '`last`'),
    bad('plot-timeline-last-neg', lambda e: plot_timeline(e.learn, last=-1), ValueError, '`last`', '-1'),
    bad('plot-timeline-axs-int', lambda e: plot_timeline(e.learn, axs=3), TypeError, '`axs`', '3'),
    bad('plot-shares-axs-str', lambda e: plot_phase_shares(e.learn, axs='ab'), TypeError, '`axs`', "'ab'"),
    bad('plot-shares-src-str', lambda e: plot_phase_shares('learn'), TypeError, '`src`', 'str'),
    # ---- save_trace / chrome_trace / trace_events / merge_traces ----
    bad('trace-rank-str', lambda e: save_trace(e.learn, p(e, 't.json'), rank='a'), TypeError, '`rank`', "'a'"),
    bad('trace-rank-neg', lambda e: save_trace(e.learn, p(e, 't.json'), rank=-1), ValueError, '`rank`', '-1'),
    bad('trace-path-int', lambda e: save_trace(e.learn, 123), TypeError, '`path`', '123'),
    bad('trace-path-none', lambda e: save_trace(e.learn, None), TypeError, '`path`', 'None'),
    bad('trace-path-under-file', lambda e: save_trace(e.learn, p(e, 'file', 't.json')), ValueError, '`path`', 'is a file'),
    bad('trace-path-folder', lambda e: save_trace(e.learn, e.tmp), ValueError, '`path`', 'a folder'),
    bad('trace-path-name-too-long', lambda e: save_trace(e.learn, p(e, 't'*300 + '.json')), ValueError, '`path`', 'PC_NAME_MAX'),
    bad('trace-src-int', lambda e: save_trace(3, p(e, 't.json')), TypeError, '`src`', 'int'),
    bad('trace-src-unprofiled', lambda e: save_trace(e.fresh, p(e, 't.json')), NoProfileError, 'learn.profile()'),
    bad('chrome-trace-rank-float', lambda e: chrome_trace(e.learn, rank=1.5), TypeError, '`rank`', '1.5'),
    bad('trace-events-rank-none', lambda e: trace_events(e.learn, rank=None), TypeError, '`rank`', 'None'),
    bad('trace-events-t0-str', lambda e: trace_events(e.learn, t0='start'), TypeError, '`t0`', "'start'"),
    bad('merge-traces-int', lambda e: merge_traces(123), TypeError, '`traces`', '123'),
    bad('merge-traces-empty', lambda e: merge_traces([]), ValueError, '`traces`', '[]'),
    bad('merge-traces-item-int', lambda e: merge_traces([3]), TypeError, '`traces`', '3'),
    bad('merge-traces-missing-file', lambda e: merge_traces([p(e, 'missing.json')]), ValueError, '`traces`', 'missing.json'),
    bad('merge-traces-align', lambda e: merge_traces([e.trace], align='left'), ValueError, '`align`', "'left'"),
    bad('merge-traces-path-int', lambda e: merge_traces([e.trace], path=123), TypeError, '`path`', '123'),
    bad('merge-traces-path-under-file', lambda e: merge_traces([e.trace], path=p(e, 'file', 'm.json')), ValueError, '`path`', 'is a file'),
    # ---- distributed: save_merged_trace, rank_gather, find_stragglers, merge_records ----
    bad('merged-trace-path-int', lambda e: save_merged_trace(e.learn.simple_profile_record, 123), TypeError, '`path`', '123'),
    bad('merged-trace-path-under-file', lambda e: save_merged_trace(e.learn.simple_profile_record, p(e, 'file', 'm.json')), ValueError, '`path`'),
    bad('merged-trace-record-str', lambda e: save_merged_trace('rec', p(e, 'm.json')), TypeError, '`record`', "'rec'"),
    bad('rank-gather-timeout-0', lambda e: rank_gather(timeout=0), ValueError, '`timeout`'),
    bad('rank-gather-timeout-str', lambda e: rank_gather(timeout='30'), TypeError, '`timeout`', "'30'"),
    bad('rank-gather-csv-int', lambda e: rank_gather(rank_csv=123), TypeError, '`rank_csv`', '123'),
    bad('rank-gather-csv-under-file', lambda e: rank_gather(rank_csv=p(e, 'file', 'r.csv')), ValueError, '`rank_csv`', 'is a file'),
    bad('stragglers-margin-0', lambda e: find_stragglers(e.ranks, margin=0), ValueError, '`margin`', '0'),
    bad('stragglers-margin-str', lambda e: find_stragglers(e.ranks, margin='x'), TypeError, '`margin`', "'x'"),
    bad('stragglers-profiles-int', lambda e: find_stragglers(3), TypeError, '`profiles`', '3'),
    bad('stragglers-profiles-records', lambda e: find_stragglers([e.learn.simple_profile_record]*2), TypeError, '`profiles`', 'RankProfile'),
    bad('merge-records-empty', lambda e: merge_records([]), ValueError, '`profiles`'),
    bad('merge-records-records', lambda e: merge_records([e.learn.simple_profile_record]), TypeError, '`profiles`', 'RankProfile'),
    bad('rank-spread-int', lambda e: rank_spread(3), TypeError, '`profiles`', '3'),
    bad('interval-means-phase', lambda e: interval_means(e.learn.simple_profile_record, 'test'), ValueError, '`phase`', "'test'", "'train'"),
    bad('interval-means-rec', lambda e: interval_means(e.learn, 'train'), TypeError, '`rec`', 'Learner'),
    bad('rank-gather-timeout-neg', lambda e: rank_gather(timeout=-5), ValueError, '`timeout`', '-5'),
    bad('rank-csv-path-rank-str', lambda e: rank_csv_path('r.csv', 'one'), TypeError, '`rank`', "'one'"),
    bad('merged-trace-record-learner', lambda e: merged_trace(e.learn), TypeError, '`record`', 'Learner'),
    # ---- make_demo_learner ----
    bad('demo-n-train-0', lambda e: make_demo_learner(n_train=0), ValueError, '`n_train`', '0'),
    bad('demo-n-valid-neg', lambda e: make_demo_learner(n_valid=-1), ValueError, '`n_valid`', '-1'),
    bad('demo-bs-str', lambda e: make_demo_learner(bs='64'), TypeError, '`bs`', "'64'"),
    bad('demo-size-4', lambda e: make_demo_learner(size=4), ValueError, '`size`', '4'),
    bad('demo-workers-neg', lambda e: make_demo_learner(workers=-1), ValueError, '`workers`', '-1'),
    bad('demo-seed-str', lambda e: make_demo_learner(seed='x'), TypeError, '`seed`', "'x'"),
    bad('demo-device-name', lambda e: make_demo_learner(device='gpu'), ValueError, '`device`', "'gpu'"),
    bad('demo-device-int', lambda e: make_demo_learner(device=0), TypeError, '`device`', '0'),
    *([bad('demo-device-cuda-cpu', lambda e: make_demo_learner(device='cuda'), ValueError, '`device', "'cuda'", '0 CUDA device')] if CPU_ONLY else []),
    bad('demo-path-file', lambda e: make_demo_learner(path=p(e, 'file')), ValueError, '`path`', 'file'),
    bad('demo-path-name-too-long', lambda e: make_demo_learner(path=p(e, 'd'*300)), ValueError, '`path`', 'PC_NAME_MAX'),
    bad('demo-path-int', lambda e: make_demo_learner(path=3), TypeError, '`path`', '3'),
    # ---- the CLI (`fastprofile demo ...`, the console script) ----
    bad('cli-epochs-0', cli('demo', '--epochs', '0'), _CliRefusal, '--epochs', '0'),
    bad('cli-bs-str', cli('demo', '--bs', 'x'), _CliRefusal, '--bs', "'x'"),
    bad('cli-workers-neg', cli('demo', '--workers', '-1'), _CliRefusal, '--workers', '-1'),
    bad('cli-size-4', cli('demo', '--size', '4'), _CliRefusal, '--size', '4'),
    bad('cli-n-train-0', cli('demo', '--n-train', '0'), _CliRefusal, '--n-train', '0'),
    bad('cli-device-name', cli('demo', '--device', 'gpu'), _CliRefusal, '--device', "'gpu'"),
    *([bad('cli-device-cuda-cpu', cli('demo', '--device', 'cuda'), _CliRefusal, '--device', 'cuda')] if CPU_ONLY else []),
    bad('cli-csv-under-file', cli('demo', '--csv', '{tmp}/file/r.csv'), _CliRefusal, '--csv', 'is a file'),
    bad('cli-csv-missing-folder', cli('demo', '--csv', '{tmp}/missing/r.csv'), _CliRefusal, '--csv', 'does not exist'),
    bad('cli-csv-name-too-long', cli('demo', '--csv', '{tmp}/' + 'c'*300 + '.csv'), _CliRefusal, '--csv', 'PC_NAME_MAX'),
    bad('cli-plot-gif', cli('demo', '--plot', '{tmp}/p.gif'), _CliRefusal, '--plot', '.png'),
    bad('cli-trace-txt', cli('demo', '--trace', '{tmp}/t.txt'), _CliRefusal, '--trace', '.json'),
    bad('cli-trace-folder', cli('demo', '--trace', '{tmp}'), _CliRefusal, '--trace', 'a folder'),
    bad('cli-unknown-option', cli('demo', '--bogus', '2'), _CliRefusal, '--bogus'),
    bad('cli-no-command', cli(), _CliRefusal, 'command'),
]

def test_the_table_has_at_least_90_rows_with_unique_ids():
    assert len(ROWS) >= 90, len(ROWS)
    assert len({r.id for r in ROWS}) == len(ROWS)

@pytest.fixture(scope='module')
def env(tmp_path_factory):
    "One tiny profiled learner (which also has a `RecordFunctionCallback`), one never profiled, a record's trace, two ranks"
    set_seed(0)
    learn = synth_learner(n_trn=4, n_val=1)
    learn.profile(show_report=False, logger_callback=None).fit(1)
    learn.annotate()
    fresh = synth_learner(n_trn=4, n_val=1)
    rec = learn.simple_profile_record
    return SimpleNamespace(learn=learn, fresh=fresh, trace=chrome_trace(rec), ranks=[RankProfile(0, rec), RankProfile(1, rec)],
                           root=tmp_path_factory.mktemp('bad'))

def _params(learn): return torch.cat([p.detach().flatten().clone() for p in learn.model.parameters()])

def _state(learn):
    "What a refused call must leave as it was: callbacks (the objects, in order), attributes, weights, the last profile"
    return (list(learn.cbs), set(learn.__dict__), learn.__dict__.get('simple_profile'), _params(learn))

def _same(a, b):
    assert a[0] == b[0], ("callbacks changed", a[0], b[0])
    assert a[1] == b[1], ("attributes changed", a[1] ^ b[1])
    assert a[2] is b[2], "the last profile changed"
    assert torch.equal(a[3], b[3]), "the weights changed (something trained)"

def _plain_fit_works(learn):
    "A plain `fit` runs (every batch, unprofiled) and leaves the last profile alone"
    last = learn.__dict__.get('simple_profile')
    assert Session.of(learn) is None, "the learner is still armed for profiling"
    learn.fit(1)
    assert learn.train_iter == len(learn.dls.train)
    assert learn.__dict__.get('simple_profile') is last, "the plain fit was profiled"

@pytest.mark.parametrize('row', ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_refused_at_the_call(env, row, tmp_path):
    (tmp_path/'file').write_text('not a folder')
    e = SimpleNamespace(**vars(env), tmp=str(tmp_path))
    before_files = sorted(os.listdir(tmp_path))
    learners = (env.learn, env.fresh)
    before = [_state(l) for l in learners]
    with pytest.raises(row.exc) as info: row.call(e)
    err = info.value
    assert isinstance(err, (TypeError, ValueError))
    msg = str(err)
    for m in row.must: assert m in msg, f"{m!r} not in the message: {msg}"
    if row.exc is not _CliRefusal:  # raised by fastprofile itself, not from deep inside a library it calls
        where = traceback.extract_tb(err.__traceback__)[-1].filename
        assert Path(where).resolve().is_relative_to(PKG.resolve()), f"raised from {where}: {type(err).__name__}: {msg}"
    assert sorted(os.listdir(tmp_path)) == before_files, "a refused call wrote a file"
    for l,b in zip(learners, before): _same(b, _state(l))
    _plain_fit_works(env.learn)
    if 'fresh' in row.call.__code__.co_names: _plain_fit_works(env.fresh)

def test_a_name_at_the_file_systems_limit_is_written(tmp_path):
    "The length check is exact: a CSV name of PC_NAME_MAX bytes is taken and saved (its temporary file's name stays shorter)"
    n = os.pathconf(tmp_path, 'PC_NAME_MAX')
    learn = synth_learner(n_trn=4, n_val=1, path=tmp_path)
    name = 'x'*(n - 4) + '.csv'
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # a failed save only warns: make it fail the test
        learn.profile(save_csv=True, csv_name=name, show_report=False, logger_callback=None).fit(1)
    assert [f.name for f in tmp_path.iterdir()] == [name]

def test_rank_files_name_checked_only_when_written(tmp_path, monkeypatch):
    "A CSV name that fits, with `rank_csv=True` outside DDP (no rank files) or `WORLD_SIZE=1`: taken; under 2 processes the rank file's name is too long"
    learn = synth_learner(n_trn=2, n_val=1, path=tmp_path)
    name = 'x'*248 + '.csv'  # 252 bytes: fits; its rank file `_rank1.csv` (258) would not
    learn.profile(rank_csv=True, csv_name=name, show_report=False, logger_callback=None)  # no error: one process
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(ValueError, match='_rank1.csv'): learn.profile(rank_csv=True, csv_name=name)
    monkeypatch.setenv('WORLD_SIZE', 'many')  # not a number: one process
    learn.profile(rank_csv=True, csv_name=name, show_report=False, logger_callback=None)
