"""The GPU suite's markdown: one file of tables, under the heading "Measured on a GPU", ready for BENCHMARKS.md.

`render(info, outcomes)` only reads the parts' saved results: any part may be missing, partial, failed or stopped at
its time limit, and each section says so where it stands instead of failing the whole file."""
from __future__ import annotations
import math

TITLES = {'overhead':"The default profile's cost on a host-bound step, beside Lightning's simple profiler", 'tests':'CUDA tests', 'timing':'Timing accuracy: events, sync and wall against a synchronized truth',
          'prefetch':'CudaPrefetchCallback against the pipeline bound', 'diagnosis':'The diagnosis on a GPU',
          'nvtx':'NVTX ranges from annotate()', 'telemetry':'Telemetry (NVML) and the out-of-memory snapshot'}
NAMED = ('draw','forward','loss','backward','opt_step','zero_grad')
MATERIAL = .05  # a phase counts for the 5% goal when it is at least this share of the step

# ---------------------------------------------------------------- formatting

def nan(x) -> bool: return x is None or (isinstance(x, float) and math.isnan(x))

def ftime(s) -> str:
    "Seconds as µs / ms / s"
    if nan(s): return '—'
    a = abs(s)
    if a < 1e-3: return f"{s*1e6:.1f} µs"
    if a < 1: return f"{s*1e3:.2f} ms"
    return f"{s:.2f} s"

def fpct(x, signed:bool=True, nd:int=1) -> str:
    "A fraction as a percentage"
    if nan(x): return '—'
    return f"{100*x:+.{nd}f}%" if signed else f"{100*x:.{nd}f}%"

def frate(r) -> str: return '—' if nan(r) else f"{r:.1f}/s"
def yes(b) -> str: return '—' if b is None else ('yes' if b else '**no**')

def table(headers:list, rows:list, text=()) -> list:
    "A markdown table: the first column and the columns `text` (indices) left-aligned, the others (figures) right-aligned"
    out = ['| ' + ' | '.join(headers) + ' |', '|' + '|'.join('---' if i == 0 or i in text else '---:' for i in range(len(headers))) + '|']
    return out + ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows]

def status_line(o:dict) -> list:
    "What became of a part that did not finish, with the end of its error"
    st = o.get('status')
    if st == 'ok': return []
    r = o.get('results') or {}
    what = {'failed':'**Failed**', 'timed out':'**Stopped at its time limit**', 'skipped':'**Not run**'}.get(st, f'**{st}**')
    out = [f"{what} after {o.get('seconds', 0):.0f} s (limit {o.get('limit', 0):.0f} s; log: `{o.get('log', '?')}`)."
           + (" What it measured before that is below." if r and st != 'skipped' else '')]
    err = r.get('error') or o.get('reason')
    if err: out += ['', f"Error: `{err}`"]
    tb = r.get('traceback') or '\n'.join((o.get('tail') or [])[-12:])
    if tb and st == 'failed': out += ['', '```', tb.strip()[-1500:], '```']
    return out

# ---------------------------------------------------------------- goals

def timing_goals(r:dict, mode:str='events_cost') -> dict:
    "Worst error of `mode` over the material phases, and worst events overhead, across the workloads"
    worst_err,worst_ovh = (0., None),(None, None)
    for name,w in (r.get('workloads') or {}).items():
        t,e = w.get('truth') or {},(w.get('rel_error') or {}).get(mode)
        if not t or not e: continue
        step = t.get('step')
        for p in (*NAMED, 'step'):
            if nan(t.get(p)) or nan(e.get(p)) or nan(step) or (p != 'step' and t[p] < MATERIAL*step): continue
            if abs(e[p]) >= abs(worst_err[0]): worst_err = (e[p], f"{name} {p}")
        o = ((w.get('overhead') or {}).get('events') or {}).get('median')
        if not nan(o) and (worst_ovh[0] is None or o > worst_ovh[0]): worst_ovh = (o, name)
    return dict(err=worst_err, ovh=worst_ovh)

def goal_rows(outs:dict) -> list:
    rows = overhead_goal_rows((outs.get('overhead') or {}).get('results') or {})
    t = (outs.get('tests') or {}).get('results') or {}
    if t.get('summary'):
        s = t['summary']
        rows.append(["`pytest -m cuda tests/` passes", f"{s['passed']} passed, {s['failed']} failed, {s['errors']} errors, "
                     f"{s['skipped']} skipped", yes(s['failed'] == 0 and s['errors'] == 0 and s['tests'] > 0)])
    nb = (t.get('notebooks') or {}).get('results') or {}
    if nb:
        n_ok = sum(v['outcome'] == 'passed' for v in nb.values())
        rows.append(["notebooks' `#| cuda` cells pass", f"{n_ok} of {len(nb)} notebooks", yes(n_ok == len(nb))])
    tm = (outs.get('timing') or {}).get('results') or {}
    if tm.get('workloads'):
        g = timing_goals(tm)
        e,where = g['err']
        rows.append([f"events: phase times within 5% of the synchronized truth (a phase's time: the longer of its wall and GPU "
                     f"times; phases ≥ {MATERIAL:.0%} of the step)", f"worst {fpct(e)} ({where})" if where else '—',
                     yes(abs(e) <= .05) if where else '—'])
        e2,where2 = timing_goals(tm, 'events')['err']
        if where2: rows.append(["(for the record) events: the GPU spans alone against the truth", f"worst {fpct(e2)} ({where2})", '—'])
        o,where = g['ovh']
        rows.append(["events: profiler overhead under 1% of the step", f"worst {fpct(o)} ({where})" if where else '—',
                     yes(o < .01) if where else '—'])
    pf = (outs.get('prefetch') or {}).get('results') or {}
    for name,reg in (pf.get('regimes') or {}).items():
        v = (reg.get('variants') or {}).get('pinned') or {}
        if 'goals' not in v: continue
        active = v['goals'].get('active', True)
        rows.append([f"prefetch ≥ 0.9 of the pipeline bound, {name} (pinned)", f"{v['R1/B']:.2f} of the bound"
                     + ('' if active else ' (**prefetch inactive**)'), yes(v['goals']['of_bound'] and active)])
        if 'not_slower' in v['goals']:
            rows.append([f"prefetch no more than 2% slower, {name} ({v['bound_by']}-bound)", f"R1/R0 = {v['R1/R0']:.3f}",
                         yes(v['goals']['not_slower'])])
    dg = (outs.get('diagnosis') or {}).get('results') or {}
    right = [(n, r['right']) for n,r in (dg.get('regimes') or {}).items() if r.get('right')]
    if right:
        ok = sum(x['verdict'] and x['knob'] for _,x in right)
        rows.append(["diagnosis: verdict and knob right", f"{ok} of {len(right)} regimes", yes(ok == len(right))])
    for name,sc in (dg.get('scenarios') or {}).items():
        if sc.get('runs'):
            d = sc.get('drift')
            rows.append([f"tune: drift < 5% between first and last baseline window ({name})", fpct(d, signed=False) if d is not None else '—',
                         yes(d < .05) if d is not None else '—'])
            rows.append([f"tune: the same top change twice ({name})", ' / '.join(f"`{x.get('top')}`" for x in sc['runs']), yes(sc.get('same_top'))])
    sr = [sc for sc in (dg.get('scenarios') or {}).values() if sc.get('right')]
    if sr:
        ok = sum(x['right']['verdict'] and x['right']['fix'] for x in sr)
        rows.append(["diagnosis: verdict and fix right", f"{ok} of {len(sr)} scenarios", yes(ok == len(sr))])
    nv = (outs.get('nvtx') or {}).get('results') or {}
    if nv.get('checks'):
        c = nv['checks']
        rows.append(["annotate(): ranges in torch.profiler and NVTX calls", ', '.join(f"{k} {yes(v)}" for k,v in c.items() if v is not None),
                     yes(all(v for v in c.values() if v is not None))])
    te = (outs.get('telemetry') or {}).get('results') or {}
    ph = te.get('phases') or {}
    if ph.get('checks'):
        c = ph['checks']
        rows.append(["telemetry: samples tagged `batch` busier than `draw` (by 30 points), as many samples as asked, energy within 15% of NVML's counter",
                     ', '.join(f"{k} {yes(v)}" for k,v in c.items() if v is not None), yes(all(v for v in c.values() if v is not None))])
    rel = ((te.get('overhead') or {}).get('relative') or {}).get('every 50 ms')
    if rel is not None: rows.append(["telemetry: the sampler (50 ms) costs a host-bound fit under 1% per batch", fpct(rel), yes(rel < .01)])
    sn = te.get('snapshot') or {}
    if sn.get('checks'):
        c = sn['checks']
        rows.append(["memory_snapshot: written on a real OOM, loads, named in the error; nothing without one",
                     ', '.join(f"{k} {yes(v)}" for k,v in c.items()), yes(all(c.values()))])
    return rows

OVERHEAD_GOALS = (('per_batch', "default `learn.profile()`: cost a training batch of a host-bound step"),
                  ('per_fit', "default `learn.profile()`: cost a fit, the report not shown"),
                  ('per_fit_shown', "`learn.profile(plain=True)`: cost a fit, the report shown"),
                  ('first_fit', "the process's first profiled fit: cost beyond a later one"))

def overhead_goal_rows(r:dict) -> list:
    "The goals of the overhead part (issue 32), each with its figure"
    rows = []
    for k,what in OVERHEAD_GOALS:
        g = (r.get('goals') or {}).get(k) or {}
        if g.get('value') is None: continue
        rows.append([f"{what} ≤ {ftime(g['goal'])}", ftime(g['value']), yes(g.get('met'))])
    lt = (r.get('summary') or {}).get('lightning simple')
    if lt: rows.append(["(for comparison) Lightning `profiler='simple'` against Lightning plain, a batch", ftime(lt['per_batch']), '—'])
    return rows

def overhead_section(o:dict) -> list:
    r = o.get('results') or {}
    st = r.get('settings') or {}
    out = [f"`Linear({st.get('width')},{st.get('width')})-ReLU-Linear({st.get('width')},{st.get('n_out')})`, bs {st.get('bs')}, Adam, "
           "batches ready in host memory; every variant in one process, interleaved, fits of "
           f"{st.get('long')} and {st.get('short')} training batches timed from outside (GPU synchronized): per batch from "
           "the two lengths, per fit the rest, each against the baseline of its round (medians)."]
    if r.get('lightning'): out += ['', f"Lightning: {r['lightning']}."]
    s = r.get('summary') or {}
    if s:
        rows = [[f"`{n}`", v['baseline'], ftime(v['base_per_batch']), ('+' if v['per_batch'] >= 0 else '') + ftime(v['per_batch']),
                 fpct(v['share']), ('+' if v['per_fit'] >= 0 else '') + ftime(v['per_fit']), v['rounds']] for n,v in s.items()]
        out += ['', *table(['variant', 'against', 'its step', 'cost a batch', 'share', 'cost a fit', 'rounds'], rows, text=(1,))]
    if r.get('first_fit') is not None:
        out += ['', f"The process's first profiled fit ({st.get('short')} batches) took {ftime(r.get('first_fit_seconds'))}: "
                f"{ftime(r['first_fit'])} more than the default's later fits of that length."]
    if r.get('stopped'): out += ['', f"Stopped early: {r['stopped']}."]
    return out

# ---------------------------------------------------------------- sections

def tests_section(o:dict) -> list:
    r = o.get('results') or {}
    out = []
    if r.get('command'): out.append(f"Command: `python -m {r['command']}` (results read from its {r.get('source', 'output')}).")
    s = r.get('summary')
    if not s: return out
    out += ['', *table(['tests', 'passed', 'failed', 'errors', 'skipped', 'pytest exit'],
                       [[s['tests'], s['passed'], s['failed'], s['errors'], s['skipped'], r.get('rc', '—')]])]
    bad = [c for c in r.get('cases', []) if c['outcome'] != 'passed']
    if bad:
        out += ['', *table(['test', 'outcome', 'message'], text=(1, 2), rows=
                           [[f"`{c['name']}`", c['outcome'], (c['message'] or '').strip().splitlines()[0][:200].replace('|', '\\|')
                             if (c['message'] or '').strip() else ''] for c in bad])]
    ok = [c for c in r.get('cases', []) if c['outcome'] == 'passed']
    if ok: out += ['', "Passed: " + ', '.join(f"`{c['name'].split('::')[-1]}`" for c in ok) + '.']
    if s['tests'] == 0 and r.get('tail'): out += ['', 'No test ran. The end of pytest\'s output:', '', '```', *r['tail'][-15:], '```']
    nb = r.get('notebooks')
    if nb:
        out += ['', "Notebooks with `#| cuda` cells, each run by `nbdev-test --flags cuda` (FASTPROFILE_STRICT=1): " +
                (f"not run ({nb['not_run']})." if nb.get('not_run') else '')]
        if nb.get('results'):
            out += ['', *table(['notebook', 'outcome', 'time', 'message'], text=(1, 3), rows=
                               [[f"`{k}`", v['outcome'], ftime(v.get('seconds')),
                                 ' '.join((v.get('message') or '').split())[-300:].replace('|', '\\|')] for k,v in nb['results'].items()])]
    return out

def _workload_desc(name:str, w:dict) -> str:
    c = w.get('config') or {}
    k = c.get('kind', name)
    if k == 'xresnet18': d = f"fastai `xresnet18`, {c.get('size')} px uint8 images (GPU `IntToFloatTensor` + `Normalize`), bs {c.get('bs')}"
    elif k == 'transformer': d = f"{c.get('layers')} transformer encoder blocks (d {c.get('d')}, {c.get('heads')} heads), seq {c.get('seq')}, bs {c.get('bs')}"
    elif k == 'mlp': d = f"MLP {c.get('n_in')}-{c.get('width')}×{c.get('depth')}-10, bs {c.get('bs')}"
    elif k == 'known-cost': d = ("known GPU cost per phase (`torch.cuda._sleep`): " +
                                 ', '.join(f"{p} {v} ms" for p,v in (c.get('ms') or {}).items()))
    else: d = k
    done,planned = w.get('trials_done', w.get('trials', '?')),w.get('trials', '?')
    return (f"{d}; {w.get('batches', '?')} timed batches per run after {w.get('skip', '?')} of warm-up, {done} trials"
            + (f" (of {planned} planned: stopped)" if done != planned else ''))

def timing_section(o:dict) -> list:
    r = o.get('results') or {}
    out = ["Each workload runs once per mode per trial, interleaved: the synchronized truth (a CUDA event at every phase "
           "boundary and a synchronize after it, so each span holds only that phase's work), no profiler, then fastprofile with "
           "`timing='wall'`, `'sync'` and `'events'`. Per phase: the truth, then each mode's time and its error against the truth "
           "(medians over trials of the per-run means). For events, a phase's time is the longer of its wall time and its GPU span "
           "(the diagnosis reads it so; a phase alone costs the longer of its host work and its GPU work), and its GPU span alone "
           "is shown too. Overhead: the step time (wall clock, GPU "
           "synchronized at both ends, warm-up left out) against the run with no profiler, median over trials; "
           "self-measured: the pair's cost per batch as fastprofile measures it at fit start."]
    if not nan(r.get('mark_cost')):
        out.append(f"The truth's {r.get('syncs_in_step', 11)} marks inside each step (event + synchronize, "
                   f"{ftime(r['mark_cost'])} each on an idle GPU) are taken out of its `other` and step.")
    ws = r.get('workloads') or {}
    summary = []
    for name,w in ws.items():
        if w.get('error') or w.get('skipped'): continue
        steps,ovh = w.get('steps') or {},w.get('overhead') or {}
        d = w.get('drift') or {}
        summary.append([name, ftime(steps.get('none')),
                        *[f"{fpct((ovh.get(m) or {}).get('median'))} ({ftime((ovh.get(m) or {}).get('self_measured'))})" for m in ('wall','sync','events')],
                        ', '.join(d.get('expected', [])) or 'none', ', '.join(d.get('fired', [])) or 'none',
                        yes(sorted(d.get('expected', [])) == sorted(d.get('fired', []))) if d else '—'])
    if summary:
        out += ['', *table(['workload', 'step, no profiler', 'overhead: wall (self-measured)', 'sync', 'events',
                            'drift warning expected on', 'fired on (most trials)', 'as expected'], summary, text=(5, 6))]
    for name,w in ws.items():
        out += ['', f"**{name}**: {_workload_desc(name, w)}."]
        if w.get('error'):
            out += ['', f"Failed: `{w['error']}`"]; continue
        if w.get('skipped'): out += ['', f"Skipped: {w['skipped']}."]; continue
        t,tm,e = w.get('truth') or {},w.get('timed') or {},w.get('rel_error') or {}
        known = w.get('known_ms') or {}
        rows = []
        for p in (*NAMED, 'other', 'step'):
            if nan(t.get(p)) and all(nan((tm.get(m) or {}).get(p)) for m in ('events_cost','events','sync','wall')): continue
            cells = [f"`{p}`" + (f" (known {known[p]:.2f} ms)" if p in known else ''), ftime(t.get(p))]
            for m in ('events_cost','events','sync','wall'):
                cells += [ftime((tm.get(m) or {}).get(p)), fpct((e.get(m) or {}).get(p))]
            share = t.get(p)/t['step'] if not nan(t.get(p)) and t.get('step') else math.nan
            cells.append(fpct(share, signed=False, nd=0))
            rows.append(cells)
        out += ['', *table(['phase', 'truth', 'events', 'error', 'events: GPU span', 'error', 'sync', 'error', 'wall', 'error',
                            'share of step'], rows)]
        notes = (w.get('drift') or {}).get('notes') or []
        if notes: out += ['', "fastprofile's GPU notes (events run): " + ' '.join(f"“{n}”" for n in notes)]
    return out

def prefetch_section(o:dict) -> list:
    r = o.get('results') or {}
    out = ["Stages alone: T_load (the loader on the host), T_copy + T_tfm (host-to-device copy, then `IntToFloatTensor` + "
           "`Normalize` on the GPU), T_main (the fastai loop on batches already on the GPU, real model; T_comp: its GPU time "
           "alone). Bound B = 1 / max(T_load, T_copy + T_tfm, T_main). R0: plain loop; R1: with `CudaPrefetchCallback`; "
           "batches/s after the warm-up, interleaved trials, medians. Goals (pinned): R1 ≥ 0.9 B, and R1 ≥ 0.98 R0 where "
           "load- or compute-bound."]
    rows,settings = [],[]
    for name,reg in (r.get('regimes') or {}).items():
        s = reg.get('settings') or {}
        if s:
            settings.append(f"{name}: bs {s.get('bs')}, {s.get('size')} px ({s.get('batch_mb', 0):.1f} MB a batch), "
                            f"{s.get('workers')} workers × {ftime(s.get('t_load'))} per batch, model " +
                            ('none (pool + linear)' if not s.get('channels') else f"{s.get('depth')} convs of {s.get('channels')}")
                            + (f" + {s['spin_ms']} ms GPU spin in forward and backward" if s.get('spin_ms') else '')
                            + (f"; size calibrated: host step {ftime(s['calibration']['host_step'])}, copy "
                               f"{s['calibration']['copy_bw_gb_s']:.1f} GB/s" if s.get('calibration') else ''))
        if reg.get('error'): rows.append([name, '—', *['—']*9, f"failed: `{reg['error']}`"]); continue
        for key,v in (reg.get('variants') or {}).items():
            if v.get('error'): rows.append([name, key, *['—']*9, f"failed: `{v['error']}`"]); continue
            g = v.get('goals') or {}
            rows.append([name, key, ftime(v.get('T_load')), f"{ftime(v.get('T_copy'))} + {ftime(v.get('T_tfm'))}",
                         f"{ftime(v.get('T_main'))} ({ftime(v.get('T_comp'))})", f"{frate(v.get('B'))} ({v.get('bound_by', '?')})",
                         frate(v.get('R0')), frate(v.get('R1')),
                         '—' if nan(v.get('R1/B')) else f"{v['R1/B']:.2f}", '—' if nan(v.get('R1/R0')) else f"{v['R1/R0']:.3f}",
                         ', '.join(f"{k} {yes(x)}" for k,x in g.items()) or ('—' if v.get('prefetch_active', True) else '**prefetch inactive**'),
                         '' if v.get('bound_by') in (None, s.get('expect')) else f"came out {v['bound_by']}-bound"])
    if rows:
        out += ['', *table(['regime', 'memory', 'T_load', 'T_copy + T_tfm', 'T_main (T_comp)', 'bound B (by)', 'R0', 'R1',
                            'R1/B', 'R1/R0', 'goals', 'note'], rows, text=(1, 10, 11))]
    if settings: out += [''] + [f"- {x}" for x in settings]
    return out

def scenario_rows(r:dict) -> list:
    "The diagnosis part's scenarios as table rows: scenario, verdict, expected, fix, predicted, measured, off by, within 15%"
    rows = []
    sx = lambda x: '—' if nan(x) else f"{x:.2f}x"
    for name,s in (r.get('scenarios') or {}).items():
        exp = s.get('expect')
        e = f"{exp[0]}" + (f", `{exp[1]}`" if exp[1] else '') if exp else '— (for the record)'
        if s.get('skipped') or s.get('error'):
            rows.append([name, f"skipped: {s['skipped']}" if s.get('skipped') else f"failed: `{s['error']}`", e, '', '', '', '', '']); continue
        fix = (s.get('fix') or '').replace('|', '/').replace('\n', ' ')
        fix = fix if len(fix) <= 90 else fix[:87] + '...'
        if 'runs' in s:  # `tune` twice: the top change of each, and the drift between first and last baseline windows
            fix = '; '.join(f"run {i+1}: `{x.get('top')}` (drift {fpct(x.get('drift'))})" for i,x in enumerate(s['runs'])) + \
                  f"; same top: {yes(s.get('same_top'))}"
        if s.get('mfu') is not None: fix = f"MFU {fpct(s['mfu'], signed=False)}; " + fix
        ms = s.get('measured')
        rows.append([name, s.get('verdict') or '—', e, fix, sx(s.get('predicted')),
                     sx(ms) if not nan(ms) else (s.get('measured_skipped') or '—'), fpct(s.get('off_by')), yes(s.get('within'))])
    return rows

def diagnosis_section(o:dict) -> list:
    r = o.get('results') or {}
    rows = scenario_rows(r)
    sc = ['', "Scenarios: profile -> diagnosis -> `check_advice` (its change applied and measured; `learn.prefetch()` measured as "
          "`tune` measures, warmed windows between baselines), `learn.tune()` twice, and fastai's usual JPEG pipeline.", '',
          *table(['scenario', 'verdict', 'expected', 'fix', 'predicted', 'measured', 'off by', 'within 15%'], rows, text=(1, 2, 3))] if rows else []
    out = [*sc[1:], ''] if sc else []
    out += ["Each regime of the prefetch part (pinned, no prefetch) profiled with `timing='events'`: with `breakdown=True` "
           "(the expectation applies), without it, and with `CudaPrefetchCallback` (for the record)."]
    rows = []
    for name,reg in (r.get('regimes') or {}).items():
        exp = reg.get('expect') or ['—', '—']
        if reg.get('error'): rows.append([name, f"{exp[0]}, `{exp[1]}`", f"failed: `{reg['error']}`", '', '', '', '']); continue
        runs = reg.get('runs') or {}
        b = runs.get('breakdown') or {}
        right = reg.get('right') or {}
        cell = lambda x: (x.get('skipped') or (f"failed: `{x['error']}`" if x.get('error') else None)
                          or f"{x.get('verdict', '—')} ({x.get('input_bound', '?')} input-bound)") if x else '—'
        main = f"failed: `{b['error']}`" if b.get('error') else f"{b.get('verdict', '—')}: {(b.get('knob') or '').replace('|', '/')}"
        rows.append([name, f"{exp[0]}, `{exp[1]}`", main,
                     f"{yes(right.get('verdict'))} / {yes(right.get('knob'))}", yes(b.get('gpu_branch')) if b else '—',
                     cell(runs.get('plain') or {}), cell(runs.get('prefetch') or {})])
    if rows: out += ['', *table(['regime', 'expected', 'diagnosis (breakdown): verdict, knob', 'verdict / knob right',
                                 'GPU branch', 'no breakdown', 'with prefetch'], rows, text=(1, 2, 5, 6))]
    return out

def nvtx_section(o:dict) -> list:
    r = o.get('results') or {}
    out = ["One epoch of a small conv net under `torch.profiler` (CPU and CUDA activities) with `learn.annotate(nvtx=True)` "
           "and `learn.profile(timing='events')` together. `torch.profiler` records the `record_function` ranges, not NVTX "
           "(Kineto has no NVTX activity): the NVTX side is counted at the `torch.cuda.nvtx.range_push` calls."]
    rg = r.get('ranges') or {}
    if rg:
        out += ['', *table(['range', 'expected', 'torch.profiler (host)', 'GPU projection', 'NVTX pushes'],
                           [[f"`{k}`", v['expected'], v['torch_profiler'], v['gpu'] if r.get('gpu_activity') else '—', v['nvtx']]
                            for k,v in rg.items()])]
        n = r.get('nvtx') or {}
        out += ['', f"NVTX: {n.get('pushes')} pushes, {n.get('pops')} pops; depths returned: {n.get('depths_seen')} "
                f"(negative when no NVTX tool is attached). fastprofile's GPU columns filled under the profiler: "
                f"{yes(r.get('fastprofile_gpu_columns'))}." + (f" Unexpected ranges: {r['unexpected']}." if r.get('unexpected') else '')]
    return out

def telemetry_section(o:dict) -> list:
    r = o.get('results') or {}
    out = ["`learn.profile(telemetry=True)` on a fit whose draws sleep on the host (the GPU idles) and whose batches spin "
           "the GPU (`torch.cuda._sleep`), each longer than NVML's averaging window, synchronized at each batch's end; a "
           "host-bound tiny MLP with the sampler off and on (interleaved trials); a fit that allocates twice the GPU's "
           "memory at batch 2 with `memory_snapshot=True`."]
    if r.get('nvml'): out += ['', f"NVML: {r['nvml']}."]
    w = r.get('nvml_window') or {}
    if w: out += ['', f"NVML's averaging window: after a {w.get('spin_s', 0):g} s spin ends, utilization reads 0 after "
                  + (f"{w['idle_after']:.2f} s" if w.get('idle_after') is not None else "more than the time watched")
                  + "; the draws and batches below are made at least 1.5 times that long."]
    ph = r.get('phases') or {}
    if ph:
        rows = [[f"`{k}`", fpct((v or 0)/100, signed=False, nd=0), f"{(ph.get('power') or {}).get(k, float('nan')):.0f} W"]
                for k,v in (ph.get('rows') or {}).items()]
        if rows: out += ['', *table(['row', 'GPU utilization', 'power'], rows)]
        cps = ph.get('cost_per_sample')
        out += ['', f"Draws of {ph.get('draw_ms'):.0f} ms, batches of {ph.get('spin_ms'):.0f} ms: {ph.get('samples')} samples in "
                f"{ph.get('span', 0):.1f} s at {ftime(ph.get('every'))} (asked: {ph.get('expected_samples', 0):.0f}), "
                f"{ftime(cps)} per sample on the sampler's thread. Energy: {ph.get('energy') or float('nan'):.1f} J from the power "
                f"samples, {ph.get('energy_counter') or float('nan'):.1f} J on NVML's counter ({fpct(ph.get('energy_rel'))})."]
    ov = r.get('overhead') or {}
    if ov.get('median'):
        out += ['', *table(['sampler', 'seconds per training batch (median)', 'over off'],
                           [[n, ftime(v), fpct((ov.get('relative') or {}).get(n)) if n != 'off' else '—'] for n,v in ov['median'].items()])]
    elif ov.get('skipped'): out += ['', f"Overhead: skipped ({ov['skipped']})."]
    sn = r.get('snapshot') or {}
    if sn:
        out += ['', f"Out of memory: raised {yes(sn.get('raised'))}, snapshot written {yes(sn.get('written'))} "
                f"({sn.get('bytes', 0)/2**20:.1f} MiB, {sn.get('trace_events', 0)} allocator events, loaded in "
                f"{ftime(sn.get('load_seconds'))}), named in the error's note {yes((sn.get('checks') or {}).get('named_in_note'))}, "
                f"profile kept {yes(sn.get('profile_kept'))}; a fit without the error wrote {'a file' if sn.get('written_without_error') else 'nothing'}."]
    return out

SECTIONS = {'overhead':overhead_section, 'tests':tests_section, 'timing':timing_section, 'prefetch':prefetch_section, 'diagnosis':diagnosis_section, 'nvtx':nvtx_section,
            'telemetry':telemetry_section}

# ---------------------------------------------------------------- the file

def header(info:dict) -> str:
    dev = info.get('device', '?')
    extra = ', '.join(x for x in (f"{info['memory_gb']} GB" if info.get('memory_gb') else '',
                                  f"compute capability {info['capability']}" if info.get('capability') else '') if x)
    drv = f" (driver {info['driver']})" if info.get('driver') else ''
    return (f"{dev}{f' ({extra})' if extra else ''}, CUDA {info.get('cuda')}{drv}, torch {info.get('torch')}, fastai {info.get('fastai')}, "
            f"fastprofile {info.get('fastprofile')}, Python {info.get('python')}, {info.get('cpus')} CPUs. Date: {info.get('date')}.")

def render(info:dict, outcomes:dict, command:str='python -m bench gpu', total_s:float|None=None) -> str:
    "The markdown file: header, goals, one section per part, and what became of each part"
    fake = info.get('stand_ins') or any(((o.get('results') or {}).get('stand_ins')) for o in outcomes.values())
    out = ['## Measured on a GPU' + (' — NOT A MEASUREMENT (CPU stand-ins, a test run)' if fake else ''), '']
    if fake: out += ["> **Not a measurement.** `torch.cuda` was replaced by CPU stand-ins (`bench.gpu.fakes`) to test the "
                     "suite itself. Do not copy these figures anywhere.", '']
    out += [header(info), '', f"Command: `{command}`" + (f" ({total_s/60:.1f} min in all)." if total_s is not None else '.'), '']
    rows = []
    try: rows = goal_rows(outcomes)
    except Exception as e: out += [f"(goals table failed: `{type(e).__name__}: {e}`)", '']
    if rows: out += ['### Goals', '', *table(['goal', 'figure', 'met'], rows, text=(1,)), '']
    for name,o in outcomes.items():
        out += [f"### {TITLES.get(name, name)}", '']
        sl = status_line(o)
        if sl: out += [*sl, '']
        try: body = SECTIONS[name](o) if name in SECTIONS else []
        except Exception as e: body = [f"(this section could not be written: `{type(e).__name__}: {e}`)"]
        if body: out += [*body, '']
    out += ['### Parts', '', *table(['part', 'status', 'time', 'limit', 'log'], text=(1, 4), rows=
                                    [[n, o.get('status'), f"{o.get('seconds', 0):.0f} s", f"{o.get('limit', 0):.0f} s", f"`{o.get('log', '')}`"]
                                     for n,o in outcomes.items()]), '']
    return '\n'.join(out)
