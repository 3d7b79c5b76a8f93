"""Part `diagnosis`: the diagnosis, its fix and `tune` on the workloads fastai users run, then on the prefetch part's regimes.

Scenarios first (`SCENARIOS`, each profile -> diagnosis -> `check_advice`, recording the verdict, the fix, predicted
and measured speedups): a launch-bound ResNet-18, copy-bound pageable and pinned ready batches, an input-bound loader,
a slow plain `after_batch` function, `learn.tune()` twice on the launch-bound ResNet-18 (top change of each, the drift
between its first and last baseline windows), fastai's usual JPEG pipeline (`DataBlock`, `Resize`, `aug_transforms`,
`vision_learner`), and a GPU-bound MLP in fp16 (verdict compute, with MFU). What needs torchvision imports it in the
scenario and is skipped, with the reason recorded, where it does not import; what does not fit the part's time is skipped
and said. Changes `check_advice` does not make itself (`learn.prefetch()`) are measured as `tune` measures them: warmed
windows, a baseline before and after.

Then the regimes: the GPU branch of `diagnose` on the prefetch part's three regimes (verdict and knob right?).

Each regime (pinned, no prefetch) is profiled with `timing='events'` and `breakdown=True`: the diagnosis should name
the input pipeline with more `num_workers` (input-bound), the host-to-device copy with `learn.prefetch()` (copy-bound),
and the model's compute with `to_fp16()` (compute-bound). For the record, the same runs without the breakdown (the
copy is then inside `draw`) and with `CudaPrefetchCallback` on are diagnosed too, with no expectation."""
from __future__ import annotations
import math, time
from .common import Deadline, Results, log, merged, quiet_fit, free

SCENARIO_DEFAULTS = {  # sizes for about 90 s on an H100, the regimes after them included
    'launch-bound resnet18': dict(bs=64, size=128, batches=15, fp16=True),
    'copy-bound pageable': dict(mb=150, size=224, channels=8, batches=8, pin=False),
    'copy-bound pinned': dict(mb=150, size=224, channels=8, batches=8, pin=True),
    'input-bound': dict(bs=32, size=64, item_ms=2., channels=16, batches=10),
    'slow after_batch': dict(bs=32, size=64, tfm_ms=10., channels=16, batches=10),
    'tune twice resnet18': dict(bs=64, size=128, budget=20., batches=10, fp16=True),
    'fastai jpegs': dict(n=256, side=160, resize=128, bs=32, batches=6, workers=None),
    'gpu-bound mlp': dict(bs=8192, n_in=1024, width=4096, depth=4, batches=15, fp16=True),
}
DEFAULTS = dict(select=None, device='cuda', skip=5, batches=40, variants=['breakdown','plain','prefetch'],
                regimes=None,  # None: the prefetch part's regimes (`bench.gpu.prefetch.DEFAULTS`)
                scenarios=SCENARIO_DEFAULTS, select_scenarios=None)  # None: every scenario
WITHIN = .15  # a prediction within 15% of its measurement
EXPECT_SCENARIO = {  # scenario -> (verdict, a piece of the fix's text); None: for the record
    'launch-bound resnet18': ('host', ''), 'copy-bound pageable': ('copy', 'prefetch'), 'copy-bound pinned': ('copy', 'prefetch'),
    'input-bound': ('input', 'num_workers'), 'slow after_batch': ('batch_tfms', ''), 'tune twice resnet18': None,
    'fastai jpegs': None, 'gpu-bound mlp': ('compute', ''),
}
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
    from fastprofile.analysis.diagnosis import diagnose
    from fastprofile.data.prefetch import CudaPrefetchCallback
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
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    res['config'] = {k:v for k,v in cfg.items() if k not in ('regimes', 'scenarios')}
    run_scenarios(cfg, res, deadline)
    regimes = cfg['regimes'] if cfg['regimes'] is not None else prefetch.DEFAULTS['regimes']
    regimes = {k:merged(prefetch.DEFAULTS['regimes'].get(k, {}), v) for k,v in regimes.items()}
    device = cfg['device']
    pcfg = merged(prefetch.DEFAULTS, dict(skip=cfg['skip'], batches=cfg['batches'], device=device, pins=[torch.device(device).type == 'cuda']))
    ops = None
    if torch.device(device).type != 'cuda':
        from fastprofile.data.prefetch import LoggingOps
        ops = LoggingOps(copy=True)
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


# ---------------------------------------------------------------- scenarios

class Skip(Exception):
    "A scenario that cannot run here (its reason recorded, not a failure)"

def slow_after_batch(x):
    "A plain `after_batch` function that takes `SLOW_TFM_S` seconds per call (module level: the loader's workers can pickle it)"
    time.sleep(SLOW_TFM_S)
    return x
SLOW_TFM_S = .01

def _torchvision_resnet18():
    "torchvision's `resnet18`, imported here only; `Skip` where torchvision does not import"
    try: from torchvision.models import resnet18
    except Exception as e: raise Skip(f"torchvision does not import here ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
    return resnet18

def _on_cuda(device) -> bool:
    import torch
    return torch.device(device).type == 'cuda'

def _off_by(predicted, measured) -> float:
    return measured/predicted - 1 if predicted and predicted > 0 and measured and measured > 0 else math.nan

def _record(a) -> dict:
    "What `check_advice`'s `AdviceCheck` `a` says: verdict, fix, change, predicted, measured, off by"
    d = a.diagnosis
    return dict(verdict=d.verdict, fix=d.knob, change=a.change, predicted=a.predicted,
                measured=a.measured, lines=d.lines())

def _tune_measured(learn, kind, n, n_valid=2) -> float:
    "The speedup of `kind` (a `tune` change) measured as `tune` does: a warmed window between two warmed baseline windows"
    from fastprofile.fixes.tune import Change, measure, speedup
    before = measure(learn, [], n, n_valid)
    t = measure(learn, [Change(kind, True, kind)], n, n_valid)
    after = measure(learn, [], n, n_valid)
    if t.status != 'measured': raise RuntimeError(f"{kind}: {t.status} ({t.why})")
    base = {p:((before.samples[p][0] + after.samples[p][0])/2, n_) for p,(_,n_) in before.samples.items() if p in after.samples}
    return speedup(base, t.samples)

def _advise(learn, c, device, measure_kind=None) -> dict:
    "profile -> diagnosis -> `check_advice` on `learn`; a fix it does not make itself measured as `tune` does"
    from fastprofile.fixes.advice import check_advice
    out = _record(check_advice(learn, n_batches=c['batches'], n_valid=2))
    kind = (out['change'] or {}).get('kind') if isinstance(out['change'], dict) else None
    if math.isnan(out['measured'] or math.nan) and (measure_kind or 'prefetch' in (out['fix'] or '')):
        k = measure_kind or 'prefetch'
        if k == 'prefetch' and not _on_cuda(device): out['measured_skipped'] = 'learn.prefetch() needs CUDA'
        else: out['measured'],out['measured_kind'] = _tune_measured(learn, k, c['batches']),k
    out['change_kind'] = kind
    return out

def _pool_learner(c, device, model, pool, t_load=0., after_batch=None, pin=False, fp16=False, workers=0):
    from .data import pool_dls, image_tfms, learner
    tfms = image_tfms() + ([after_batch] if after_batch is not None else [])
    dls = pool_dls(pool, c['batches'] + 10, t_load, workers, pin=pin, after_batch=tfms, device=device, n_valid=2)
    return _quiet(learner(dls, model.to(device)), fp16 and _on_cuda(device))

def _quiet(learn, fp16=False):
    "`learn` without its progress bar (and in half precision if `fp16`)"
    learn.remove_cbs([cb for cb in learn.cbs if type(cb).__name__ == 'ProgressCallback'])
    if fp16: learn.to_fp16()
    return learn

def _resnet_learner(c, device):
    from .data import image_pool
    resnet18 = _torchvision_resnet18()
    return _pool_learner(c, device, resnet18(weights=None, num_classes=10), image_pool(2, c['bs'], c['size']), fp16=c.get('fp16'))

def sc_launch(c, device):
    return _advise(_resnet_learner(c, device), c, device)

def sc_copy(c, device):
    from .data import image_pool, conv_net
    if c['pin'] and not _on_cuda(device): raise Skip('pinned host memory needs CUDA')
    bs = max(2, int(c['mb']*2**20/(3*c['size']**2)))
    pool = image_pool(2, bs, c['size'], pin=c['pin'])
    out = _advise(_pool_learner(c, device, conv_net(c['channels'], 1), pool, pin=c['pin']), c, device, measure_kind='prefetch')
    return dict(out, bs=bs, batch_mb=bs*3*c['size']**2/2**20)

def sc_input(c, device):
    from .data import image_pool, conv_net
    return _advise(_pool_learner(c, device, conv_net(c['channels'], 1), image_pool(2, c['bs'], c['size']), t_load=c['item_ms']/1e3*c['bs']), c, device)

def sc_after_batch(c, device):
    global SLOW_TFM_S
    from .data import image_pool, conv_net
    SLOW_TFM_S = c['tfm_ms']/1e3
    return _advise(_pool_learner(c, device, conv_net(c['channels'], 1), image_pool(2, c['bs'], c['size']), after_batch=slow_after_batch), c, device)

def sc_tune_twice(c, device):
    import fastprofile.fixes.tune  # noqa: F401 (Learner.tune)
    learn = _resnet_learner(c, device)
    runs = []
    for _ in range(2):
        r = learn.tune(budget=c['budget'], n_batches=c['batches'], progress=False)
        b = r.best
        runs.append(dict(top=b.text if b else None, top_measured=b.measured if b else None,
                         top_predicted=b.changes[0].predicted if b else None, drift=r.drift, baselines=len(r.baselines),
                         table=r.table.drop(columns=['Why']).to_dict('records'), lines=r.lines()))
    b0 = runs[0]
    return dict(runs=runs, same_top=runs[0]['top'] == runs[1]['top'], verdict=None, fix=b0['top'],
                predicted=b0['top_predicted'], measured=b0['top_measured'],
                drift=max((abs(r['drift']) for r in runs if r['drift'] is not None and not math.isnan(r['drift'])), default=None))

def sc_jpegs(c, device):
    import tempfile
    from pathlib import Path
    resnet18 = _torchvision_resnet18()
    try: from fastai.vision.all import DataBlock, ImageBlock, CategoryBlock, get_image_files, parent_label, RandomSplitter, Resize, aug_transforms, vision_learner
    except Exception as e: raise Skip(f"fastai.vision does not import here ({type(e).__name__})")
    import numpy as np
    from PIL import Image
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        for i in range(c['n']):
            d = Path(tmp)/('a' if i % 2 else 'b'); d.mkdir(exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (c['side'], c['side'], 3), dtype=np.uint8)).save(d/f'{i}.jpg', quality=90)
        db = DataBlock(blocks=(ImageBlock, CategoryBlock), get_items=get_image_files, get_y=parent_label, splitter=RandomSplitter(seed=0),
                       item_tfms=Resize(c['resize']), batch_tfms=aug_transforms())
        kw = {} if c.get('workers') is None else dict(num_workers=c['workers'])
        dls = db.dataloaders(tmp, bs=c['bs'], device=device, **kw)
        learn = _quiet(vision_learner(dls, resnet18, pretrained=False))
        out = _advise(learn, dict(c, batches=min(c['batches'], len(dls.train) - 1)), device)
        out['workers'] = dls.train.num_workers
    return out

def sc_gpu_bound(c, device):
    from fastprofile.probes.efficiency.report import efficiency_summary
    from .data import tensor_pool, mlp, pool_dls, learner
    pin = _on_cuda(device)
    dls = pool_dls(tensor_pool(2, (c['bs'], c['n_in']), pin=pin), c['batches'] + 10, 0., 0, pin=pin, device=device, n_valid=2)
    learn = _quiet(learner(dls, mlp(c['n_in'], c['width'], c['depth']).to(device)), c.get('fp16') and pin)
    out = _advise(learn, c, device)
    learn.profile(breakdown=True, efficiency=True, show_report=False, logger_callback=None, warmup=3)
    quiet_fit(learn)
    e = efficiency_summary(learn.simple_profile)
    return dict(out, mfu=e.get('mfu'), train_flops_per_second=e.get('train_flops_per_second'), peak_flops=e.get('peak_flops'))

SCENARIOS = {'launch-bound resnet18':sc_launch, 'copy-bound pageable':sc_copy, 'copy-bound pinned':sc_copy, 'input-bound':sc_input,
             'slow after_batch':sc_after_batch, 'tune twice resnet18':sc_tune_twice, 'fastai jpegs':sc_jpegs, 'gpu-bound mlp':sc_gpu_bound}

def run_scenarios(cfg:dict, res:Results, deadline:Deadline, reserve:float=0.):
    "Each scenario in turn, its outcome saved as it comes; skipped (and said) where the time left is under the longest so far, or where it cannot run here"
    res['scenarios'] = out = {}
    longest,device = 0.,cfg['device']
    names = [n for n in SCENARIOS if cfg['select_scenarios'] is None or n in cfg['select_scenarios']]
    for name in names:
        c = cfg['scenarios'][name]
        exp = EXPECT_SCENARIO.get(name)
        r = out[name] = dict(expect=list(exp) if exp else None, settings=c)
        if deadline.left() - reserve < longest + 5:
            r['skipped'] = f"not enough of the part's time left ({deadline.left():.0f} s)"; res.save(); continue
        log(f"scenario {name}: start ({deadline.left():.0f} s left)", 'diagnosis')
        t0 = time.perf_counter()
        try: r.update(SCENARIOS[name](c, device))
        except Skip as e: r['skipped'] = str(e)
        except Exception as e:
            import traceback
            r.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
        r['seconds'] = time.perf_counter() - t0
        if 'skipped' not in r: longest = max(longest, r['seconds'])
        if 'error' not in r and 'skipped' not in r:
            r['off_by'] = _off_by(r.get('predicted'), r.get('measured'))
            r['within'] = None if math.isnan(r['off_by']) else abs(r['off_by']) <= WITHIN
            if exp: r['right'] = dict(verdict=r.get('verdict') == exp[0], fix=exp[1] in (r.get('fix') or ''))
        log(f"scenario {name}: {r.get('verdict', r.get('skipped') or r.get('error'))} in {r['seconds']:.1f} s", 'diagnosis')
        free(device); res.save()
