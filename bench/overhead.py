"""Per-batch cost of the profiler pair vs no profiler vs the predecessor (fastxtend 0.1.7 `learn.profile(mode='simple')`), and the fixed cost per fit.

Every trial of every variant runs in a fresh process (`bench.worker`), variants interleaved A B C A B C ...;
per-batch time = train-phase time / training batches, in wall and in CPU (process) time. The overhead of a
variant is the median over trial rounds of (variant - no profiler) within the round. The per-fit fixed cost is the wall
time around `learn.fit` over plain fastai's, on a fit of few batches, in a running process and on a process's first fit."""
from __future__ import annotations
import math, statistics, sys, time
from .common import run_worker, fastxtend_dir, PredecessorUnavailable, median, iqr, md_table, fmt

LABELS = {'none': 'no profiler (plain fastai)', 'fastprofile-off': 'fastprofile imported, not profiling',
          'fastprofile': 'fastprofile `learn.profile()` (defaults: CallbackCostsProbe on)',
          'fastprofile-nosampler': 'fastprofile `learn.profile()`, CallbackCostsProbe taken off (bench only)',
          'fastprofile-baseline': 'fastprofile `learn.profile()` from the `--baseline` tree (the code before)', 'fastxtend': "fastxtend 0.1.7 `learn.profile(mode='simple')`"}

WORKLOADS = {
    'mlp': dict(title="(a) worst case: tiny MLP (16-32-1), bs 64, 500 batches, num_workers=0, 1 thread",
                variants=('none','fastprofile-off','fastprofile','fastprofile-nosampler','fastxtend'), trials=5, fits=2, kwargs=dict(n_batches=500, bs=64)),
    'demo': dict(title="(b) demo workload: `fastprofile.demo.make_demo_learner` (1280 + 128 JPEGs decoded with PIL, small CNN), bs 64, CPU, num_workers=0, 1 thread",
                 variants=('none','fastprofile','fastxtend'), trials=3, fits=2, kwargs=dict(n_train=1280, n_valid=128, bs=64)),
}

def collect(workload:str, trials:int|None=None, fits:int|None=None, log=print, baseline=None) -> dict:
    "Run every variant of `workload` `trials` times, interleaved; the workers' results by variant (`baseline`: a folder holding another fastprofile, run as one more variant)"
    w = WORKLOADS[workload]
    trials,fits = trials or w['trials'],fits or w['fits']
    try: fx = fastxtend_dir()
    except PredecessorUnavailable as e:
        log(f"[bench] PREDECESSOR UNAVAILABLE, its rows are left out: {e}")
        fx = None
    variants = [v for v in w['variants'] if v != 'fastxtend' or fx is not None]
    if baseline is not None: variants.insert(variants.index('fastprofile') + 1, 'fastprofile-baseline')
    res = {v: [] for v in variants}
    for t in range(trials):
        for v in variants:
            t0 = time.perf_counter()
            r = run_worker({'kind':'overhead', 'variant':'fastprofile' if v == 'fastprofile-baseline' else v, 'workload':workload, 'fits':fits,
                            'warmup_fits':1, 'workload_kwargs':w['kwargs'], 'paired':True}, predecessor=fx if v == 'fastxtend' else None,
                           fastprofile_from=baseline if v == 'fastprofile-baseline' else None)
            res[v].append(r)
            log(f"[bench] {workload} trial {t+1}/{trials} {v:16s} {1e6*median(r['train_s'])/r['n_train']:8.1f} us/batch wall "
                f"{1e6*median(r['train_cpu_s'])/r['n_train']:8.1f} us/batch cpu  ({time.perf_counter()-t0:.1f} s)")
    return {'workload': workload, 'trials': trials, 'fits': fits, 'results': res}

def summarize(data:dict) -> dict:
    "Medians per variant, and paired per-round overheads over the no-profiler baseline"
    res = data['results']
    per_batch = lambda r,k: [x/r['n_train'] for x in r[k]]
    out = {}
    for v,rs in res.items():
        s = {}
        for k in ('train_s','train_cpu_s'):
            s[k] = median([x for r in rs for x in per_batch(r,k)])
            s[k+'_trial_iqr'] = iqr([median(per_batch(r,k)) for r in rs])
            rounds = [median(per_batch(r,k)) - median(per_batch(b,k)) for r,b in zip(rs, res['none'])]
            s[k+'_overhead'] = median(rounds)
            s[k+'_overhead_rounds'] = rounds
        fixed = lambda r: [f - t - vl for f,t,vl in zip(r['fit_s'], r['train_s'], r['valid_s'])]
        s['fixed_s'] = median([median(fixed(r)) - median(fixed(b)) for r,b in zip(rs, res['none'])])
        so = [x for r in rs for x in r['self_overhead_s']]
        s['self_overhead_s'] = median(so) if so else None
        s['n_train'] = rs[0]['n_train']
        if rs[0].get('off_train_s'):  # fastprofile: profiled - unprofiled fits within each process
            for k in ('train_s','train_cpu_s'):
                d = [median(per_batch(r,k)) - median(per_batch(r,'off_'+k)) for r in rs]
                s[k+'_paired'],s[k+'_paired_iqr'] = median(d),iqr(d)
                # every profiled fit against the unprofiled fit next to it: mean and 2 standard errors
                pairs = [a - b for r in rs for a,b in zip(per_batch(r,k), per_batch(r,'off_'+k))]
                s[k+'_paired_mean'] = sum(pairs)/len(pairs)
                s[k+'_paired_2se'] = 2*statistics.stdev(pairs)/math.sqrt(len(pairs)) if len(pairs) > 1 else math.inf
        out[v] = s
    return out

def tables(data:dict, summary:dict, ref:dict|None=None) -> str:
    "Markdown table and verdicts for one workload (`ref`: the worst-case summary, for the cost of importing fastprofile)"
    w = WORKLOADS[data['workload']]
    base = summary['none']
    fx = summary.get('fastxtend')
    rows = []
    def row(label, oh_w, oh_c, s, ratio_ok=True, iqr_=None):
        # a ratio only where the predecessor's overhead stands clear of the trial-to-trial spread
        fx_clear = fx and fx['train_cpu_s_overhead'] > max(fx['train_cpu_s_trial_iqr'], base['train_cpu_s_trial_iqr'])
        ratio = (oh_c/fx['train_cpu_s_overhead']) if (ratio_ok and fx_clear) else None
        rows.append([label, fmt(1e6*s['train_s'],'.0f') if s else '—', fmt(1e6*s['train_cpu_s'],'.0f') if s else '—',
                     '—' if oh_w is None else f"{1e6*oh_w:+.0f} ({100*oh_w/base['train_s']:+.1f}%)",
                     '—' if oh_c is None else f"{1e6*oh_c:+.0f} ({100*oh_c/base['train_cpu_s']:+.1f}%)",
                     fmt(ratio, '.2f', '×'),
                     fmt(1e6*s['self_overhead_s'] if s and s['self_overhead_s'] is not None else None, '.1f'),
                     '—' if (not s or oh_w is None or label.startswith('↳')) else f"{1e3*s['fixed_s']:+.1f}",
                     iqr_ or (f"{1e6*s['train_s_trial_iqr']:.0f} / {1e6*s['train_cpu_s_trial_iqr']:.0f}" if s else '—')])
    for v,s in summary.items():
        none = v == 'none'
        row(LABELS[v], None if none else s['train_s_overhead'], None if none else s['train_cpu_s_overhead'], s,
            ratio_ok=v not in ('none','fastxtend'))
        if 'train_s_paired' in s:
            sampler = v == 'fastprofile-nosampler'  # its other fits are default-profiled: minus the difference is the CallbackCostsProbe's share
            sign = -1 if sampler else 1
            row("↳ CallbackCostsProbe's share: default-profiled − CallbackCostsProbe-off fits, alternating in the same process" if sampler else
                "↳ the same, pair alone: profiled − unprofiled fits in the same process", sign*s['train_s_paired'], sign*s['train_cpu_s_paired'],
                None, ratio_ok=not sampler,
                iqr_=f"{1e6*s['train_s_paired_iqr']:.0f} / {1e6*s['train_cpu_s_paired_iqr']:.0f}; fit pairs: ±{1e6*s['train_cpu_s_paired_2se']:.0f} (2 SE, CPU)")
    hdr = ['variant', 'µs/batch wall', 'µs/batch CPU', 'overhead µs/batch wall (% of step)', 'overhead µs/batch CPU (% of step)',
           'overhead vs predecessor (CPU; — where within noise)', 'self-measured µs/batch', 'fit time outside the phases over plain fastai\'s, ms', 'spread across trials µs (wall / CPU)']
    lines = [f"### {w['title']}", '',
             f"{data['trials']} trials × {data['fits']} timed fits (+1 warm-up fit) per variant, each trial a fresh process, "
             f"variants interleaved; {summary['none']['n_train']} training batches per fit. Medians. Overhead = median over trial "
             "rounds of (variant − no profiler) in the same round. The fastprofile process also runs as many unprofiled fits, "
             "alternating with the profiled ones (↳ row). CPU = process time (what the profiler adds in work; less "
             "disturbed by other processes than wall time). Fit time outside the phases = wall time around `learn.fit` minus "
             "its train and valid phases (set-up, calibration, closing), over the baseline's, warm-up fit left out; the "
             "per-fit fixed cost is measured on its own in (c).", '',
             md_table(hdr, rows), '']
    fp = summary.get('fastprofile')
    if fp:
        noise = max(base['train_cpu_s_trial_iqr'], fp['train_cpu_s_trial_iqr'])
        oh = fp['train_cpu_s_overhead']
        lines.append(f"- fastprofile: {1e6*oh:+.1f} µs/batch CPU across processes (trial spread ±{1e6*noise:.0f} µs), "
                     f"{1e6*fp['train_cpu_s_paired']:+.1f} µs/batch for the pair alone within a process; it measures itself at "
                     f"{1e6*fp['self_overhead_s']:.1f} µs/batch.")
        ns = summary.get('fastprofile-nosampler')
        if ns:
            sb = [b.get('train', 0) for r in data['results']['fastprofile'] for b in r.get('sampled_batches', [])]
            lines.append(f"- CallbackCostsProbe's share (default profile − the same with the CallbackCostsProbe taken off): "
                         f"{-1e6*ns['train_cpu_s_paired_mean']:+.1f} ± {1e6*ns['train_cpu_s_paired_2se']:.1f} µs/batch (mean of the fit pairs "
                         f"in the same process, 2 SE; median of the processes {-1e6*ns['train_cpu_s_paired']:+.1f}); across processes "
                         f"{1e6*(oh - ns['train_cpu_s_overhead']):+.1f} µs/batch. It sampled {median(sb):.0f} of {summary['none']['n_train']} "
                         "training batches per fit.")
        if data['workload'] == 'mlp' and fx:
            half = fx['train_cpu_s_overhead']/2
            lines.append(f"- Goal (a): at most half the predecessor's overhead ({1e6*fx['train_cpu_s_overhead']:.0f} µs/2 = {1e6*half:.0f} µs/batch, CPU): "
                         f"**{'met' if oh <= half else 'MISSED'}** (fastprofile {1e6*oh:.0f} µs/batch, ratio {oh/fx['train_cpu_s_overhead']:.2f}).")
        if data['workload'] == 'demo':
            step = base['train_cpu_s']
            pm,se = fp['train_cpu_s_paired_mean'],fp['train_cpu_s_paired_2se']
            lines.append(f"- Direct, on this workload: across processes {100*oh/step:+.2f}% of the step (trial spread ±{100*noise/step:.1f}%); "
                         f"pair alone, each profiled fit against the unprofiled fit beside it in the same process: "
                         f"{1e6*pm:+.0f} ± {1e6*se:.0f} µs (2 SE) = {100*pm/step:+.2f}% ± {100*se/step:.2f}%."
                         + (" Not resolved to 1% on this machine: the per-fit noise is larger." if se > 0.005*step else ''))
            est_txt,est = '',None
            if ref and 'fastprofile' in ref:
                a_pair,a_off = ref['fastprofile']['train_cpu_s_paired'],ref.get('fastprofile-off',{}).get('train_cpu_s_overhead', 0.)
                est = max(a_pair, 0.) + max(a_off, 0.)
                est_txt = (f" The profiler's per-batch work does not depend on the model: from (a), pair alone {1e6*a_pair:+.0f} µs + "
                           f"fastprofile's loop change {1e6*a_off:+.0f} µs = {1e6*est:.0f} µs = {100*est/step:.2f}% of this {1e3*step:.1f} ms step.")
            ok = est is not None and est < 0.01*step and pm - se < 0.01*step
            lines.append(f"- Goal (b), under 1% of step time: **{'met' if ok else 'MISSED or not shown'}** "
                         f"(by the estimate from (a); the direct measurement {'does not contradict it' if pm - se < 0.01*step else 'CONTRADICTS it'}).{est_txt} "
                         f"Self-measured: {1e6*fp['self_overhead_s']:.1f} µs = {100*fp['self_overhead_s']/step:.3f}%.")
    if not fx: lines.append("- The predecessor could not be installed: its row and ratios are missing.")
    return '\n'.join(lines) + '\n'

# ---------------------------------------------------------------- per-fit fixed cost

FIXED = dict(title="(c) per-fit fixed cost: wall time around `learn.fit(1)` over plain fastai's",
             kwargs=dict(n_batches=20, bs=64, n_valid_batches=2), trials=5, rounds=15, goal=.030)
FIXED_LABELS = {'fastprofile': "fastprofile `learn.profile(show_report=False)`",
                'fastprofile-report': "fastprofile, report shown (into a non-terminal stream)",
                'fastxtend': "fastxtend 0.1.7 `learn.profile(mode='simple', show_report=False)`",
                'fastxtend-report': "fastxtend 0.1.7, report shown (into a non-terminal stream)"}

def collect_fixed(trials:int|None=None, rounds:int|None=None, log=print) -> dict:
    "Per trial: each variant's first fit in a fresh process (plain fastai's too), and `rounds` rounds of every variant in one process per profiler"
    trials,rounds = trials or FIXED['trials'],rounds or FIXED['rounds']
    try: fx = fastxtend_dir()
    except PredecessorUnavailable as e:
        log(f"[bench] PREDECESSOR UNAVAILABLE, its rows are left out: {e}")
        fx = None
    profs = ['fastprofile'] + (['fastxtend'] if fx else [])
    fresh,same = {v: [] for v in ['none'] + [f'{p}{r}' for p in profs for r in ('', '-report')]},{p: [] for p in profs}
    for t in range(trials):
        t0 = time.perf_counter()
        for v in fresh:
            r = run_worker({'kind':'fixed', 'mode':'fresh', 'variants':[v], 'workload_kwargs':FIXED['kwargs']},
                           predecessor=fx if v.startswith('fastxtend') else None)
            fresh[v].append(r['fits'][0])
        for p in profs:
            r = run_worker({'kind':'fixed', 'mode':'same', 'variants':['none', p, f'{p}-report'], 'rounds':rounds,
                            'workload_kwargs':FIXED['kwargs']}, predecessor=fx if p == 'fastxtend' else None)
            same[p].append(r)
        first = {v: 1e3*(fs[-1]['fit_s'] - fresh['none'][-1]['fit_s']) for v,fs in fresh.items() if v != 'none'}
        log(f"[bench] fixed cost trial {t+1}/{trials}: first fit of a process over plain fastai's, ms: "
            + ', '.join(f"{v} {d:+.1f}" for v,d in first.items()) + f"  ({time.perf_counter()-t0:.1f} s)")
    return {'trials': trials, 'rounds': rounds, 'fresh': fresh, 'same': same, 'n_train': FIXED['kwargs']['n_batches'],
            'n_valid': FIXED['kwargs']['n_valid_batches']}

def summarize_fixed(data:dict) -> dict:
    "Per variant and setting: median of the paired differences over plain fastai (fresh: same trial round; same: same round of one process)"
    out = {}
    def stats(pairs):
        "`pairs`: (fit, plain fit) dicts"
        d = [a['fit_s'] - b['fit_s'] for a,b in pairs]
        dc = [a['fit_cpu_s'] - b['fit_cpu_s'] for a,b in pairs]
        outside = [(a['fit_s'] - a['phases_s']) - (b['fit_s'] - b['phases_s']) for a,b in pairs]
        s = {'delta_s': median(d), 'iqr_s': iqr(d), 'cpu_s': median(dc), 'cpu_iqr_s': iqr(dc), 'outside_s': median(outside),
             'n': len(d), 'arm_s': median([a['arm_s'] for a,_ in pairs])}
        if 'own_cost_s' in pairs[0][0]:
            s['own_cost_s'] = median([a['own_cost_s'] for a,_ in pairs])
            s['beyond_row_s'] = median([a['fit_s'] - a['fit_row_s'] for a,_ in pairs])
        return s
    for v,fs in data['fresh'].items():
        if v != 'none': out[('fresh', v)] = stats(list(zip(fs, data['fresh']['none'])))
    for p,runs in data['same'].items():
        for v in (p, f'{p}-report'):
            pairs = []
            for run in runs:
                by = {}
                for f in run['fits']: by.setdefault(f['round'], {})[f['variant']] = f
                pairs += [(r[v], r['none']) for r in by.values()]
            out[('same', v)] = stats(pairs)
    return out

def tables_fixed(data:dict, summary:dict, per_batch:float|None=None) -> str:
    "Markdown table and verdict for the per-fit fixed cost (`per_batch`: the pair's µs/batch from (a), to say how much of the difference it is)"
    ms = lambda x: '—' if x is None else f"{1e3*x:+.1f}"
    rows = []
    for where,label in (('same', 'same process (after a warm-up fit)'), ('fresh', 'fresh process (its first fit)')):
        for v,name in FIXED_LABELS.items():
            s = summary.get((where, v))
            if s is None: continue
            rows.append([name, label, f"**{ms(s['delta_s'])}**", f"{1e3*s['iqr_s']:.1f}", f"{ms(s['cpu_s'])} ({1e3*s['cpu_iqr_s']:.1f})",
                         ms(s['outside_s']), f"{1e3*s['arm_s']:.2f}", ms(s.get('own_cost_s')), ms(s.get('beyond_row_s')), s['n']])
    hdr = ['variant', 'where', 'fixed cost per fit, ms (wall around `learn.fit` − plain fastai\'s)', 'spread (IQR) ms',
           'same in CPU (process) time, ms (IQR)',
           'of it outside the train/valid phases, ms', '`profile()` call ms (not in the fit)', "profiler's own cost in its report, ms",
           'wall around `learn.fit` − the report\'s fit row, ms', 'pairs']
    n = data['n_train'] + data['n_valid']
    lines = [f"### {FIXED['title']}", '',
             f"Tiny MLP, {data['n_train']} training + {data['n_valid']} validation batches of 64 per fit (so per-batch costs are "
             f"small), 1 thread. Same process: one process per profiler and trial, a warm-up fit of each variant, then "
             f"{data['rounds']} rounds of plain fastai, profiled, profiled with the report shown (order rotated each round), "
             f"× {data['trials']} trials; difference over the plain fit of the same round. Fresh process: the first fit of a new "
             f"process per variant (plain fastai's too), {data['trials']} trials, difference within the trial round; it pays "
             "what is cached per process (the pair's calibration, lazy imports). The report is rendered into a `StringIO` "
             "(`redirect_stdout`), as for a log file. Medians.", '', md_table(hdr, rows), '']
    g = FIXED['goal']
    same,fresh = summary.get(('same','fastprofile')),summary.get(('fresh','fastprofile'))
    if same:
        lines.append(f"- Goal, under {1e3*g:.0f} ms per fit with `show_report=False`: **{'met' if same['delta_s'] < g else 'MISSED'}** "
                     f"in a running process ({1e3*same['delta_s']:+.1f} ms wall, {1e3*same['cpu_s']:+.1f} ms CPU)"
                     + (f"; first fit of a process {1e3*fresh['delta_s']:+.1f} ms wall, {1e3*fresh['cpu_s']:+.1f} ms CPU "
                        f"(**{'under' if fresh['delta_s'] < g else 'OVER'}** the goal)" if fresh else '') + '.')
        if per_batch is not None and per_batch > 0:
            lines.append(f"- Of the difference, about {1e3*per_batch*n:.1f} ms is the pair's per-batch cost ({n} batches × "
                         f"{1e6*per_batch:.0f} µs from (a)); the rest is fixed.")
        lines.append(f"- The report's own-cost note says {1e3*same['own_cost_s']:.1f} ms (median, running process)"
                     + (f", {1e3*fresh['own_cost_s']:.1f} ms on a first fit" if fresh else '')
                     + "; rendering the report comes on top of it (the report-shown rows).")
    sr = summary.get(('same','fastprofile-report'))
    if sr: lines.append(f"- Showing the report: {1e3*(sr['delta_s'] - same['delta_s']):+.1f} ms per fit more than `show_report=False`.")
    fxs = summary.get(('same','fastxtend'))
    if fxs and same: lines.append(f"- Predecessor, running process: {1e3*fxs['delta_s']:+.1f} ms with `show_report=False` "
                                  f"(fastprofile {1e3*same['delta_s']:+.1f} ms).")
    if not fxs: lines.append("- The predecessor could not be installed: its rows are missing.")
    return '\n'.join(lines) + '\n'

def main(trials:int|None=None, log=print, raw:dict|None=None, baseline=None, workloads=None) -> str:
    "Both per-batch overhead workloads and the per-fit fixed cost (`workloads`: some of 'mlp', 'demo', 'fixed'); markdown"
    workloads = list(workloads or [*WORKLOADS, 'fixed'])
    bad = [x for x in workloads if x not in (*WORKLOADS, 'fixed')]
    if bad: raise ValueError(f"unknown workload(s) {bad}: valid values are {', '.join([*WORKLOADS, 'fixed'])}")
    out,ref = ['## Overhead', ''],None
    for wl in [x for x in WORKLOADS if x in workloads]:
        data = collect(wl, trials=trials, log=log, baseline=baseline)
        summary = summarize(data)
        if raw is not None: raw[f'overhead_{wl}'] = data
        out.append(tables(data, summary, ref))
        ref = ref or summary
    if 'fixed' not in workloads: return '\n'.join(out)
    data = collect_fixed(trials=trials, log=log)
    if raw is not None: raw['overhead_fixed'] = data
    pair = ref['fastprofile']['train_cpu_s_paired'] if ref and 'fastprofile' in ref else None
    out.append(tables_fixed(data, summarize_fixed(data), pair))
    return '\n'.join(out)

if __name__ == '__main__': print(main())
