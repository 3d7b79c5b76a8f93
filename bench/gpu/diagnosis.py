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
    'input-bound': ('input', 'num_workers='),
    'copy-bound': ('copy', 'learn.prefetch()'),
    'compute-bound': ('compute', 'to_fp16()'),
}

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
    "The `diagnosis` part: each regime and variant, results saved as they come"
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
    res['regimes'] = {}
    for name,rg in regimes.items():
        if cfg['select'] is not None and name not in cfg['select']: continue
        log(f"{name}: start ({deadline.left():.0f} s left)", 'diagnosis')
        reg = res['regimes'][name] = dict(expect=EXPECT.get(name), runs={})
        try:
            s = reg['settings'] = prefetch.resolve(name, rg, pcfg, device)
            pinned = pcfg['pins'][0]
            pool = image_pool(2 if s['workers'] == 0 else 4, s['bs'], s['size'], pin=pinned)
            dls = pool_dls(pool, cfg['batches'] + cfg['skip'], s['t_load'], s['workers'], pin=pinned,
                           after_batch=image_tfms(), device=device)
            for v in cfg['variants']:
                if reg['runs'] and deadline.left() < 2*reg.get('per_run', 0) + 5:
                    reg['runs'][v] = dict(skipped='not enough time left'); continue
                t0 = time.perf_counter()
                reg['runs'][v] = diagnosed(dls, s, v, cfg, device, ops)
                reg['per_run'] = max(reg.get('per_run', 0), time.perf_counter() - t0)
                res.save()
            main = reg['runs'].get('breakdown', {})
            if EXPECT.get(name) and 'verdict' in main:
                verdict,knob = EXPECT[name]
                reg['right'] = dict(verdict=main['verdict'] == verdict, knob=knob in main['knob'])
            log(f"{name}: " + ', '.join(f"{k}: {r.get('verdict', r.get('skipped'))}" for k,r in reg['runs'].items()), 'diagnosis')
            del dls, pool; free(device)
        except Exception as e:
            import traceback
            reg.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{name}: FAILED {type(e).__name__}: {e}", 'diagnosis')
        res.save()
