"""Part `diagnosis`: the GPU branch of `diagnose` on the prefetch part's three regimes (verdict and knob right?).

Each regime (pinned, no prefetch) is profiled with `timing='events'` and `breakdown=True`: the diagnosis should name
the input pipeline with more `num_workers` (input-bound), the host-to-device copy with `learn.prefetch()` (copy-bound),
and the model's compute with `to_fp16()` (compute-bound). For the record, the same runs without the breakdown (the
copy is then inside `draw`) and with `CudaPrefetchCallback` on are diagnosed too, with no expectation."""
from __future__ import annotations
import time
from .common import Deadline, Results, log, merged, quiet_fit, free

DEFAULTS = dict(select=None, device='cuda', skip=5, batches=40, variants=['breakdown','plain','prefetch'],
                regimes=None)  # None: the prefetch part's regimes (`bench.gpu.prefetch.DEFAULTS`)
EXPECT = {  # regime -> (verdict, a piece of the knob's text)
    'input-bound': ('input', 'num_workers='),  # more workers; with as many workers as CPUs already: cheaper items
    'copy-bound': ('copy', 'learn.prefetch()'),
    'compute-bound': ('compute', 'to_fp16()'),
}

def expected(name:str, s:dict) -> tuple|None:
    "The verdict and a piece of the knob's text expected for regime `name` with settings `s` on this machine"
    import os
    if name not in EXPECT: return None
    verdict,knob = EXPECT[name]
    if name == 'input-bound' and s['workers'] >= (os.cpu_count() or 1): knob = 'cheaper to load'
    return verdict,knob

def diagnosed(dls, s:dict, variant:str, cfg:dict, device, ops=None) -> dict:
    "Profile one fit (`variant`: 'breakdown', 'plain' or 'prefetch' (with the breakdown)) and diagnose it"
    from fastprofile.diagnosis import diagnose
    from fastprofile.prefetch import CudaPrefetchCallback
    from .data import learner
    from .prefetch import make_model
    cbs = [CudaPrefetchCallback(ops=ops)] if variant == 'prefetch' else []
    learn = learner(dls, make_model(s, device), cbs=cbs)
    learn.profile(timing='events', breakdown=variant != 'plain', warmup=cfg['skip'], show_report=False, logger_callback=None)
    quiet_fit(learn)
    rec = learn.simple_profile_record
    d = diagnose(learn.simple_profile)
    out = dict(timing=rec.timing, verdict=d.verdict, knob=d.knob, shares=d.shares, input_bound=d.input_bound,
               predicted_speedup=d.predicted_speedup, speedup_kind=d.speedup_kind, lines=d.lines(),
               gpu_branch=any(p.get('gpu', False) for p in d.numbers['phases'].values()),
               step=d.numbers['step'], prefetch_active=(learn.cuda_prefetch.active if variant == 'prefetch' else None))
    del learn; free(device)
    return out

def run(cfg:dict, res:Results, deadline:Deadline):
    "The `diagnosis` part: each variant (the expectation's first) on each regime, results saved as they come"
    import torch
    from . import prefetch
    from .data import image_pool, image_tfms, pool_dls
    cfg = merged(DEFAULTS, cfg)
    regimes = cfg['regimes'] if cfg['regimes'] is not None else prefetch.DEFAULTS['regimes']
    regimes = {k:merged(prefetch.DEFAULTS['regimes'].get(k, {}), v) for k,v in regimes.items()}
    device = cfg['device']
    pcfg = merged(prefetch.DEFAULTS, dict(skip=cfg['skip'], batches=cfg['batches'], device=device, pins=[torch.device(device).type == 'cuda']))
    ops = None
    if torch.device(device).type != 'cuda':
        from fastprofile.prefetch import LoggingOps
        ops = LoggingOps(copy=True)
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    res['config'] = {k:v for k,v in cfg.items() if k != 'regimes'}
    res['regimes'],dls = {},{}
    names = [n for n in regimes if cfg['select'] is None or n in cfg['select']]
    for name in names:  # each regime's settings and loaders, made once
        reg = res['regimes'][name] = dict(expect=None, runs={})
        try:
            s = reg['settings'] = prefetch.resolve(name, regimes[name], pcfg, device)
            reg['expect'] = expected(name, s)
            pinned = pcfg['pins'][0]
            pool = image_pool(2 if s['workers'] == 0 else 4, s['bs'], s['size'], pin=pinned and s['workers'] == 0)  # see prefetch
            dls[name] = pool_dls(pool, cfg['batches'] + cfg['skip'], s['t_load'], s['workers'], pin=pinned,
                                 after_batch=image_tfms(), device=device)
        except Exception as e:
            import traceback
            reg.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{name}: FAILED {type(e).__name__}: {e}", 'diagnosis')
        res.save()
    per_run = 0.
    for v in cfg['variants']:  # the expectation's variant first, for every regime
        for name in [n for n in names if n in dls]:
            reg = res['regimes'][name]
            if per_run and deadline.left() < per_run + 5:
                reg['runs'][v] = dict(skipped='not enough time left'); continue
            log(f"{name} {v}: start ({deadline.left():.0f} s left)", 'diagnosis')
            t0 = time.perf_counter()
            try: reg['runs'][v] = diagnosed(dls[name], reg['settings'], v, cfg, device, ops)
            except Exception as e:  # the other runs still go ahead
                import traceback
                reg['runs'][v] = dict(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
                log(f"{name} {v}: FAILED {type(e).__name__}: {e}", 'diagnosis')
            per_run = max(per_run, time.perf_counter() - t0)
            main = reg['runs'].get('breakdown', {})
            if reg['expect'] and 'verdict' in main:
                verdict,knob = reg['expect']
                reg['right'] = dict(verdict=main['verdict'] == verdict, knob=knob in main['knob'])
            r = reg['runs'][v]
            log(f"{name} {v}: {r.get('verdict', r.get('error'))}", 'diagnosis')
            res.save()
    del dls; free(device)
