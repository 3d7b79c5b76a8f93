"""The profiler's cost per fit as a user sees it: a process's first profiled fit, later fits with `show_report=False`, later
fits with the report shown (in a terminal, into a pipe), and the parts of showing it (results, notes, sections, rendering).

Workload: the bench's tiny MLP (`bench.common.mlp_learner`), 20 training + 2 validation batches of 64, one thread: a short
fit, so that fixed costs show; its report has the demo's table (22 rows under the fit, train and valid headings).

- (a) first fit of a process: each variant's first `learn.fit(1)` in a fresh process (plain fastai's too), variants
  interleaved per trial; the difference over the plain first fit of the same trial round. Once-per-process costs are
  timed where they run (the pair's calibration `callback._calibrate`, the loader's transfer probe `loads._transfer_probe`).
- (b), (c) later fits: one process per trial, a warm-up fit of each variant, then rounds of plain, `show_report=False`,
  report shown in a terminal (rich, colour, `COLUMNS=120`) and into a pipe (no terminal: rich's default 80 columns), order
  rotated each round; each fit's difference over the plain fit of the same round.
- (d) the parts of showing, on fresh copies of the last fit's `ProfileResult` (nothing cached): `results`, the notes,
  each report section (the diagnosis...), the report assembled, and rendering it (`show()` into a terminal and a pipe,
  `plain()`, `markdown()`, the Jupyter HTML), interleaved repetitions.
- (e), with `--calibration N`: the pair's calibration (`callback._calibrate`) at each setting of `CALIBRATIONS`, once, cold,
  in N fresh processes each: what it reads and what it costs a first fit.

Wall time (`perf_counter`) unless said; medians and minima over all pairs or repetitions. `--baseline DIR` runs a second
copy of fastprofile (a folder holding a `fastprofile` package: `git archive <commit> fastprofile | tar -x -C DIR`) in the
same run, its processes interleaved with this tree's, for before/after figures from one machine state.

    python -m bench fitcost [--trials 5] [--baseline DIR] [--calibration N]      # or: python -m bench.fitcost [...]"""
from __future__ import annotations
import argparse, contextlib, functools, io, math, os, sys, time
from pathlib import Path
from .common import ROOT, run_worker, median, iqr, md_table, machine_info, machine_md

WORKLOAD = dict(n_batches=20, bs=64, n_valid_batches=2)
VARIANTS = {  # name -> `learn.profile` options (None: plain fastai), where the report goes
    'none': None, 'quiet': dict(show_report=False), 'rich': dict(show_report=True), 'pipe': dict(show_report=True)}
LABELS = {'quiet': '`learn.profile(show_report=False)`', 'rich': 'report shown in a terminal (rich, colour, 120 columns)',
          'pipe': 'report shown into a pipe (no terminal, 80 columns)'}
ONCE = (('fastprofile.lifecycle.callback', '_calibrate'), ('fastprofile.probes.loading', '_transfer_probe'))  # once-per-process costs, timed where they run
OLD_PATHS = {'fastprofile.lifecycle.callback': 'fastprofile.callback', 'fastprofile.probes.loading': 'fastprofile.loads'}  # a --baseline from before the subpackages (0.1.0's flat modules)

def _module(name):
    import importlib
    try: return importlib.import_module(name)
    except ModuleNotFoundError: return importlib.import_module(OLD_PATHS[name])
ONCE_LABELS = {'_calibrate': "the pair's calibration", '_transfer_probe': "the loader's transfer probe"}
TRIALS,ROUNDS,REPEATS = 5,15,15
_CONSOLE_ENV = ('FORCE_COLOR','NO_COLOR','COLUMNS','LINES','TTY_COMPATIBLE','TTY_INTERACTIVE','COLORTERM','TERM','JUPYTER_COLUMNS')

# ---------------------------------------------------------------- in the worker process

@contextlib.contextmanager
def console(kind:str):
    "Where `show()` prints for `kind`: a colour terminal 120 columns wide ('rich'), or a pipe; what it printed in `out[0]`"
    saved = {k: os.environ.get(k) for k in _CONSOLE_ENV}
    for k in _CONSOLE_ENV: os.environ.pop(k, None)
    if kind == 'rich': os.environ.update(FORCE_COLOR='1', COLUMNS='120', COLORTERM='truecolor', TERM='xterm-256color')
    buf,out = io.StringIO(),[]
    try:
        with contextlib.redirect_stdout(buf): yield out
    finally:
        out.append(buf.getvalue())
        for k,v in saved.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v

def check_shown(variant:str, text:str):
    "Fail unless the report was shown as `variant` asks: colour in the terminal, none in the pipe, nothing without"
    if (variant in ('rich','pipe')) != bool(text): raise RuntimeError(f"{variant}: the report was {'not ' if text == '' else ''}shown")
    if variant == 'rich' and '\x1b[' not in text: raise RuntimeError("rich: the report has no colour: not a terminal")
    if variant == 'pipe' and '\x1b[' in text: raise RuntimeError("pipe: the report has escape codes")

def time_once(times:dict):
    "Wrap the once-per-process functions of `ONCE` that this fastprofile has, adding their wall time to `times[name]`"
    for mod,name in ONCE:
        m = _module(mod)
        f = getattr(m, name, None)
        if f is None: continue
        times[name] = 0.
        def timed(*a, _f=f, _n=name, **k):
            t = time.perf_counter()
            try: return _f(*a, **k)
            finally: times[_n] += time.perf_counter() - t
        setattr(m, name, timed)

def timed_fit(learn, variant:str) -> dict:
    "One `learn.fit(1)` with `variant`'s profiler armed, the report going where `variant` says: wall and CPU time around it"
    opts = VARIANTS[variant]
    arm = time.perf_counter()
    if opts is not None: learn.profile(logger_callback=None, **opts)
    arm = time.perf_counter() - arm  # the `learn.profile()` call itself: the user pays it too, before the fit
    with console(variant) as out:
        t,c = time.perf_counter(),time.process_time()
        learn.fit(1, lr=1e-3)
        wall,cpu = time.perf_counter() - t,time.process_time() - c
    check_shown(variant, out[0])
    r = {'variant': variant, 'wall': wall, 'cpu': cpu, 'arm': arm}
    if opts is not None: r['own_cost'] = learn.simple_profile.own_cost
    if any('Profiler' in type(cb).__name__ for cb in learn.cbs): raise RuntimeError("a profiler callback stayed on the learner")
    return r

def _setup(variant:str, expect:str):
    "One thread; fastprofile imported (from `expect`) unless plain fastai is timed; the learner"
    import torch
    torch.set_num_threads(1)
    if variant != 'none':
        import fastprofile, fastprofile.learner  # noqa: F401
        if not Path(fastprofile.__file__).resolve().is_relative_to(Path(expect).resolve()):
            raise RuntimeError(f"fastprofile came from {fastprofile.__file__}, not from {expect}")
    from .common import mlp_learner
    return mlp_learner(**WORKLOAD)

def fresh_copy(res):
    "A copy of `ProfileResult` `res` with nothing built: its cached properties (results, report...) dropped"
    r = object.__new__(type(res))  # not `copy.copy`: pickling support leaves the sections out
    r.__dict__.update(res.__dict__)
    for k in list(r.__dict__):
        if isinstance(getattr(type(r), k, None), functools.cached_property): del r.__dict__[k]
    return r

def _timed(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t

def parts(res, repeats:int) -> dict:
    "Seconds of each part of showing the report of `res`, `repeats` interleaved repetitions on fresh copies"
    try: from fastprofile.engine.notes import report_notes
    except ModuleNotFoundError: from fastprofile.core import report_notes  # a --baseline from before `engine/notes` (0.1.0's path, or `fastprofile.moved`'s)
    out = {}
    add = lambda k, s: out.setdefault(k, []).append(s)
    def shown(kind, f):
        with console(kind) as o: s = _timed(f)
        check_shown(kind, o[0])
        return s
    if not res.sections: raise RuntimeError("the result has no report sections: the diagnosis would not be timed")
    for _ in range(repeats):
        r = fresh_copy(res); add('results', _timed(lambda: r.results))
        add('notes', _timed(lambda: report_notes(r)))
        for f in r.sections:
            r = fresh_copy(res); r.results
            add(f"section {getattr(f, '__name__', f)}", _timed(lambda: f(r)))
        r = fresh_copy(res); r.results
        add('report (notes + sections)', _timed(lambda: r.report))
        add('show() in a terminal', shown('rich', r.report.show))
        r = fresh_copy(res); r.report
        add('show() into a pipe', shown('pipe', r.report.show))
        r = fresh_copy(res); r.report
        add('plain()', _timed(r.report.plain))
        r = fresh_copy(res); r.report
        add('markdown()', _timed(r.report.markdown))
        r = fresh_copy(res); r.report
        add('HTML (Jupyter)', _timed(r.report._repr_html_))
        r = fresh_copy(res)
        add('all: results, report, show() in a terminal', shown('rich', lambda: r.report.show()))
    return out

def work(task:dict) -> dict:
    "A trial in this process: `fresh` (the first fit of one variant), `same` (rounds of every variant, then the parts) or `calibrate`"
    once = {}
    if task['mode'] == 'calibrate':  # the pair's calibration as a first fit runs it: once, cold, in a fresh process
        _setup('quiet', task['expect'])
        _calibrate = _module('fastprofile.lifecycle.callback')._calibrate
        t = time.perf_counter(); v = _calibrate('wall', 'cpu', task['n'], task['k'])
        return {'mode': 'calibrate', 'n': task['n'], 'k': task['k'], 'value': v, 'seconds': time.perf_counter() - t}
    if task['mode'] == 'fresh':
        v = task['variant']
        learn = _setup(v, task['expect'])
        if v != 'none': time_once(once)
        return {'mode': 'fresh', 'fit': timed_fit(learn, v), 'once': once}
    variants = task['variants']
    learn = _setup('quiet', task['expect'])
    time_once(once)
    for v in variants: timed_fit(learn, v)  # warm-up: each variant's first fit (once-per-process costs) left out
    warm = dict(once)
    fits = []
    for r in range(task['rounds']):  # rotate the order each round, so that no variant always follows the same one
        for v in variants[r % len(variants):] + variants[:r % len(variants)]: fits.append(dict(timed_fit(learn, v), round=r))
    timed_fit(learn, 'quiet')
    res = learn.simple_profile
    return {'mode': 'same', 'fits': fits, 'once_warmup': warm, 'rows': len(res.results),
            'parts': parts(res, task['repeats'])}

# ---------------------------------------------------------------- in the bench process

def collect(trials:int=TRIALS, rounds:int=ROUNDS, repeats:int=REPEATS, baseline:Path|None=None, log=print) -> dict:
    "Per trial and code version: every variant's first fit in a fresh process, then one process of rounds and parts"
    codes = {'this tree': None} | ({'baseline': Path(baseline).resolve()} if baseline else {})
    fresh = {c: {v: [] for v in ('none','quiet','rich')} for c in codes}
    same = {c: [] for c in codes}
    for t in range(trials):
        t0 = time.perf_counter()
        for c,d in codes.items():  # plain fastai's first fit is timed beside each code version's
            for v in fresh[c]:
                fresh[c][v].append(run_worker({'kind':'fitcost', 'mode':'fresh', 'variant':v, 'expect':str(d or ROOT)}, fastprofile_from=d))
        for c,d in codes.items():
            same[c].append(run_worker({'kind':'fitcost', 'mode':'same', 'variants':['none','quiet','rich','pipe'], 'rounds':rounds,
                                       'repeats':repeats, 'expect':str(d or ROOT)}, fastprofile_from=d, timeout=600))
        msg = []
        for c in codes:
            f = fresh[c]
            first = 1e3*(f['quiet'][-1]['fit']['wall'] - f['none'][-1]['fit']['wall'])
            by = _rounds(same[c][-1]['fits'])
            later = 1e3*median([r['quiet']['wall'] - r['none']['wall'] for r in by])
            shown = 1e3*median([r['rich']['wall'] - r['none']['wall'] for r in by])
            msg.append(f"{c}: first fit {first:+.1f}, later {later:+.1f}, report shown {shown:+.1f}")
        log(f"[bench] fitcost trial {t+1}/{trials} (ms over plain fastai): " + '; '.join(msg) + f"  ({time.perf_counter()-t0:.0f} s)")
    return {'trials': trials, 'rounds': rounds, 'repeats': repeats, 'workload': WORKLOAD,
            'codes': {c: str(d) if d else str(ROOT) for c,d in codes.items()}, 'fresh': fresh, 'same': same}

CALIBRATIONS = ((64, 4), (16, 4), (8, 4))  # (batches per run, runs each way): 64 x 4 before 2026-11-25, 16 x 4 since

def collect_calibration(procs:int, log=print) -> dict:
    "`procs` fresh processes per calibration setting (`CALIBRATIONS`), interleaved: each one's first, cold calibration"
    out = {f"{n}x{k}": [] for n,k in CALIBRATIONS}
    for i in range(procs):
        for n,k in CALIBRATIONS: out[f"{n}x{k}"].append(run_worker({'kind':'fitcost', 'mode':'calibrate', 'n':n, 'k':k, 'expect':str(ROOT)}))
        log(f"[bench] calibration round {i+1}/{procs}: " + ', '.join(f"{c} {1e6*r[-1]['value']:.1f} us in {1e3*r[-1]['seconds']:.1f} ms" for c,r in out.items()))
    return out

def table_calibration(data:dict) -> str:
    "Markdown: what each calibration setting reads and costs on a process's first fit"
    rows = []
    for c,rs in data.items():
        v,t = [1e6*r['value'] for r in rs],[1e3*r['seconds'] for r in rs]
        n,k = rs[0]['n'],rs[0]['k']
        rows.append([f"{n} × {k}", 2*n*k, f"{median(t):.1f}", f"{median(v):.1f}", f"{min(v):.1f} – {max(v):.1f}", f"{iqr(v):.1f}", len(rs)])
    return '\n'.join([f"### (e) the pair's calibration (`callback._calibrate`), once in each of {len(rs)} fresh processes per setting, interleaved", '',
                      "What `pair_overhead` reports as the pair's cost per training batch (the report's cost note), measured as on a first fit: "
                      "`k` alternating runs of `n` batches with and without the pair, the fastest of each.", '',
                      md_table(['batches per run × runs each way', 'batches dispatched', 'took, median ms', 'reads, median µs/batch',
                                'min – max µs', 'IQR µs', 'processes'], rows), ''])

def _rounds(fits:list) -> list:
    "`fits` grouped by round: one dict variant -> fit per round"
    by = {}
    for f in fits: by.setdefault(f['round'], {})[f['variant']] = f
    return list(by.values())

def _ms(xs:list, sign:str='+') -> tuple:
    "Median, minimum and IQR of seconds `xs`, as millisecond texts"
    return f"{1e3*median(xs):{sign}.1f}", f"{1e3*min(xs):{sign}.1f}", f"{1e3*iqr(xs):.1f}"

def summarize(data:dict) -> dict:
    "Per code version: the paired differences (seconds) behind every row of the tables"
    out = {}
    for c in data['codes']:
        f,s = data['fresh'][c],{}
        for v in ('quiet','rich'):
            s[('first', v, 'wall')] = [a['fit']['wall'] - b['fit']['wall'] for a,b in zip(f[v], f['none'])]
            s[('first', v, 'cpu')] = [a['fit']['cpu'] - b['fit']['cpu'] for a,b in zip(f[v], f['none'])]
            s[('first', v, 'min')] = min(a['fit']['wall'] for a in f[v]) - min(b['fit']['wall'] for b in f['none'])
            s[('first', v, 'own')] = [a['fit']['own_cost'] for a in f[v]]
            for _,name in ONCE:
                got = [a['once'][name] for a in f[v] if name in a['once']]
                if got: s[('first', v, name)] = got
        rounds = [r for run in data['same'][c] for r in _rounds(run['fits'])]
        for v in ('quiet','rich','pipe'):
            s[('later', v, 'wall')] = [r[v]['wall'] - r['none']['wall'] for r in rounds]
            s[('later', v, 'cpu')] = [r[v]['cpu'] - r['none']['cpu'] for r in rounds]
            s[('later', v, 'min')] = min(r[v]['wall'] for r in rounds) - min(r['none']['wall'] for r in rounds)
        s[('armed', 'quiet', 'wall')] = [r['quiet']['arm'] for r in rounds if 'arm' in r['quiet']]
        s[('armed', 'quiet', 'min')] = min(s[('armed', 'quiet', 'wall')], default=math.nan)
        for v in ('rich','pipe'):
            s[('shown', v, 'wall')] = [r[v]['wall'] - r['quiet']['wall'] for r in rounds]
            s[('shown', v, 'min')] = min(r[v]['wall'] for r in rounds) - min(r['quiet']['wall'] for r in rounds)
        parts = {}
        for run in data['same'][c]:
            for k,xs in run['parts'].items(): parts.setdefault(k, []).extend(xs)
        s['parts'] = parts
        s['rows'] = data['same'][c][0]['rows']
        out[c] = s
    return out

def tables(data:dict, summary:dict) -> str:
    "Markdown: (a) first fit, (b)/(c) later fits, (d) the parts of showing"
    codes = list(data['codes'])
    n_first = data['trials']
    lines = ['## Per-fit cost', '',
             f"Tiny MLP (`bench.common.mlp_learner`), {WORKLOAD['n_batches']} training + {WORKLOAD['n_valid_batches']} validation "
             f"batches of {WORKLOAD['bs']}, one thread; its report has the demo's table ({summary[codes[0]]['rows']} result rows). "
             "Milliseconds of wall time over plain fastai's fit of the same trial round (a) or process round (b, c): median and "
             "IQR over all pairs; beside them the fastest fit less the fastest plain fit (for the ↳ rows: the fastest "
             "`show_report=False` fit), which leaves out fits another process slowed. (d): median and minimum of each part." + (f" Code versions, their processes interleaved: "
             + '; '.join(f"{c}: `{d}`" for c,d in data['codes'].items()) + '.' if len(codes) > 1 else ''), '']
    # (a)
    rows = []
    for v in ('quiet','rich'):
        for c in codes:
            s = summary[c]
            med,_,iq = _ms(s[('first', v, 'wall')])
            mn = f"{1e3*s[('first', v, 'min')]:+.1f}"
            once = '; '.join(f"{ONCE_LABELS[n]} {1e3*median(s[('first', v, n)]):.1f}" for _,n in ONCE if ('first', v, n) in s) or '—'
            rows.append([LABELS[v], c, f"**{med}**", mn, iq, _ms(s[('first', v, 'cpu')])[0], once, f"{1e3*median(s[('first', v, 'own')]):.1f}"])
    lines += [f"### (a) a process's first fit, over plain fastai's first fit ({n_first} fresh processes per variant and code version)", '',
              md_table(['variant', 'code', 'median ms', 'fastest − fastest plain, ms', 'IQR ms', 'CPU median ms', 'of it, once per process (median ms)',
                        "profiler's own cost in its report, ms"], rows), '']
    # (b), (c)
    rows = []
    for key,v,label in [('later','quiet',LABELS['quiet']), ('later','rich',LABELS['rich']), ('later','pipe',LABELS['pipe']),
                        ('shown','rich','↳ showing it in a terminal: report − `show_report=False`'),
                        ('shown','pipe','↳ showing it into a pipe: report − `show_report=False`'),
                        ('armed','quiet','↳ the `learn.profile(show_report=False)` call before the fit (not in the rows above; the fastest call)')]:
        for c in codes:
            s = summary[c]
            if not s.get((key, v, 'wall')): continue
            med,_,iq = _ms(s[(key, v, 'wall')])
            mn = f"{1e3*s[(key, v, 'min')]:+.1f}"
            cpu = _ms(s[('later', v, 'cpu')])[0] if key == 'later' else '—'
            rows.append([label, c, f"**{med}**", mn, iq, cpu, len(s[(key, v, 'wall')])])
    lines += [f"### (b), (c) later fits in a running process ({data['trials']} processes × {data['rounds']} rounds per code version)", '',
              md_table(['variant', 'code', 'median ms', 'fastest − fastest plain fit, ms', 'IQR ms', 'CPU median ms', 'pairs'], rows), '']
    # (d)
    names = list(summary[codes[0]]['parts'])
    hdr = ['part'] + [f"{c}: median ms" for c in codes] + [f"{c}: min ms" for c in codes]
    rows = [[k] + [_ms(summary[c]['parts'][k], '')[0] if k in summary[c]['parts'] else '—' for c in codes]
                + [_ms(summary[c]['parts'][k], '')[1] if k in summary[c]['parts'] else '—' for c in codes] for k in names]
    lines += [f"### (d) the parts of showing the report ({data['trials']} processes × {data['repeats']} repetitions, fresh `ProfileResult` copies)", '',
              "`show()` is timed with the report already assembled; the last row is all of it from a fresh result, as at the end of a fit.", '',
              md_table(hdr, rows), '']
    return '\n'.join(lines)

def main(trials:int|None=None, log=print, raw:dict|None=None, baseline:Path|None=None, rounds:int|None=None, repeats:int|None=None,
         calibration:int=0) -> str:
    "The per-fit cost tables (markdown); with `calibration`, that many fresh processes per calibration setting too"
    data = collect(trials or TRIALS, rounds or ROUNDS, repeats or REPEATS, baseline, log)
    if raw is not None: raw['fitcost'] = data
    out = tables(data, summarize(data))
    if calibration:
        cal = collect_calibration(calibration, log)
        if raw is not None: raw['fitcost_calibration'] = cal
        out += '\n' + table_calibration(cal)
    return out

if __name__ == '__main__':
    ap = argparse.ArgumentParser(prog='python -m bench.fitcost', description=__doc__.splitlines()[0])
    ap.add_argument('--trials', type=int, default=TRIALS); ap.add_argument('--rounds', type=int, default=ROUNDS)
    ap.add_argument('--repeats', type=int, default=REPEATS)
    ap.add_argument('--baseline', type=Path, default=None, help="a folder holding another fastprofile package, timed beside this tree's")
    ap.add_argument('--calibration', type=int, default=0, help="also time the pair's calibration settings in this many fresh processes each")
    a = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)
    print(machine_md(machine_info()) + '\n')
    print(main(a.trials, log, None, a.baseline, a.rounds, a.repeats, a.calibration))
