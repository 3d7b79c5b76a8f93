"""Part `prefetch`: `CudaPrefetchCallback` throughput against the pipeline bound, input-, copy- and compute-bound, pinned and not.

Batches are uint8 images from a fixed pool, handed out by a fastai `DataLoader` whose `workers` each take `t_load`
seconds per batch; `after_batch` is `IntToFloatTensor` + `Normalize` on the GPU. Each stage is first measured alone:
- `T_load`: the loader alone on the host (no copy, no transforms), seconds per batch after the first;
- `T_copy`: one host batch to the GPU (pinned: CUDA events, the GPU held while the copies are queued; pageable: wall
  clock, GPU synchronized, since the host waits for a pageable copy); `T_tfm`: `after_batch` on the GPU (events);
- `T_main`: the fastai loop on batches already on the GPU, with the real model: everything the main process does per
  batch once a batch is there (host work, callbacks, the Recorder's sync, the GPU compute). `T_comp`, the training
  step's GPU time alone (events), is shown too.
The pipeline bound is B = 1 / max(T_load, T_copy + T_tfm, T_main). The training rate without (R0) and with (R1) the
callback, in batches/s after `skip` warm-up batches, runs interleaved over `trials` (medians). The copy-bound regime's
image size is chosen at run time so that the copy takes `copy_factor` times the host's own step on this machine; the
compute-bound regime's model spins the GPU (`torch.cuda._sleep`) for `spin_ms` in forward and again in backward."""
from __future__ import annotations
import math, time
from .common import Deadline, Results, log, median, merged, quiet_fit, free, step_timer, cuda_time, host_time, spin_per_ms

DEFAULTS = dict(
    select=None, # names of the regimes to run (None: all)
    device='cuda', trials=3, skip=5, batches=40, pins=[True, False],
    regimes={
        'input-bound':   dict(expect='load', workers=2, t_load=0.030, bs=64, size=64, channels=32, depth=2, spin_ms=0.),
        'copy-bound':    dict(expect='copy', workers=0, t_load=0., bs=256, size=None, channels=0, depth=0, spin_ms=0.,
                              copy_factor=3., min_copy_ms=3., max_mb=768.),
        'compute-bound': dict(expect='main', workers=2, t_load=0.004, bs=64, size=64, channels=32, depth=2, spin_ms=6.),
    })
GOAL_BOUND,GOAL_SLOWER = 0.9,0.02  # R1 >= 0.9 B; R1 no more than 2% below R0 where compute- or load-bound

class StagedBatches:
    "A loader of `n` copies of one batch already on the device"
    def __init__(self, b, n:int): self.b,self.n = b,n
    def __len__(self): return self.n
    def __iter__(self): return (self.b for _ in range(self.n))

def make_model(s:dict, device):
    from .data import conv_net
    spin = int(s['spin_ms']*spin_per_ms()) if s.get('spin_ms') else 0
    return conv_net(s['channels'], s['depth'], spin).to(device)

def main_time(b, s:dict, skip:int, n:int, device) -> float:
    "Seconds per batch of the fastai loop on the batch `b`, already on the device, with the regime's model"
    from fastai.data.core import DataLoaders
    from .data import learner
    timer = step_timer(skip, device)
    l = learner(DataLoaders(StagedBatches(b, n+skip), StagedBatches(b, 1)), make_model(s, device), cbs=timer)
    quiet_fit(l)
    del l
    return timer.per_batch

def compute_time(model, xb, yb, n:int=10) -> float:
    "GPU seconds of one training step (forward, loss, backward, SGD step, zero_grad) on a batch on the GPU"
    from fastai.losses import CrossEntropyLossFlat
    from fastai.optimizer import SGD
    loss_func,opt = CrossEntropyLossFlat(),SGD(model.parameters(), lr=1e-3, mom=0.9)
    def step():
        loss = loss_func(model(xb), yb); loss.backward(); opt.step(); opt.zero_grad()
    return cuda_time(step, n=n)

def copy_time(hb, pinned:bool, device) -> float:
    "Seconds to copy the host batch `hb` to the device: by events if pinned, else by the synchronized wall clock"
    if pinned: return cuda_time(lambda: [t.to(device, non_blocking=True) for t in hb], n=10)
    return host_time(lambda: [t.to(device) for t in hb], n=5, device=device)

def resolve(name:str, rg:dict, cfg:dict, device) -> dict:
    "The regime's settings for this machine: the copy-bound image size is calibrated against the host's step"
    import torch
    s = dict(rg)
    if s.get('size') is None:
        pinned = bool(cfg['pins'][0])
        g = torch.Generator().manual_seed(0)
        small = (torch.rand(s['bs'], 3, 8, 8, generator=g).to(device), torch.randint(0, 10, (s['bs'],), generator=g).to(device))
        t_host = main_time(small, s, cfg['skip'], 20, device)  # fastai's loop around the regime's model: the host's step
        probe = torch.randint(0, 256, (2**26,), dtype=torch.uint8)  # 64 MB
        if pinned: probe = probe.pin_memory()
        t = copy_time((probe,), pinned, device)
        bw = probe.numel()/t if t > 0 else math.inf
        want = max(s['copy_factor']*t_host, s['min_copy_ms']/1e3)*bw
        cap = s['max_mb']*2**20
        s['size'] = max(8, int(math.sqrt(min(want, cap)/(3*s['bs']))))
        s.update(calibration=dict(host_step=t_host, copy_bw_gb_s=bw/1e9, pinned=pinned, wanted_mb=min(want, cap)/2**20))
        del probe
    s['batch_mb'] = 3*s['bs']*s['size']**2/2**20
    return s

def components(dls, s:dict, pinned:bool, cfg:dict, device) -> dict:
    "Each stage of the pipeline alone: T_load, T_copy, T_tfm, T_main and T_comp (seconds per batch)"
    dl = dls.train
    host = dl.new(device=None, after_batch=None)
    it = iter(host); b = next(it); t0 = time.perf_counter(); k = 0
    for b in it: k += 1
    t_load = (time.perf_counter() - t0)/max(k, 1)
    del it
    t_copy = copy_time(tuple(b), pinned, device)
    gb = tuple(t.to(device) for t in b)
    t_tfm = cuda_time(lambda: dl.after_batch(gb), n=10)
    xb,yb = dl.after_batch(gb)
    t_main = main_time((xb, yb), s, cfg['skip'], min(cfg['batches'], 30), device)
    t_comp = compute_time(make_model(s, device), xb, yb)
    terms = dict(load=t_load, copy=t_copy + t_tfm, main=t_main)
    bound_by = max(terms, key=terms.get)
    return dict(T_load=t_load, T_load_nominal=s['t_load']/max(s['workers'], 1), T_copy=t_copy, T_tfm=t_tfm,
                T_main=t_main, T_comp=t_comp, bound_by=bound_by, B=1/terms[bound_by])

def fit_rate(dls, s:dict, prefetch:bool, pinned:bool, cfg:dict, device, ops=None) -> tuple:
    "Training batches per second of one fit (after the warm-up), and whether the prefetch was active"
    from fastprofile.data.prefetch import CudaPrefetchCallback
    from .data import learner
    timer = step_timer(cfg['skip'], device)
    cbs = [timer] + ([CudaPrefetchCallback(pin=pinned, ops=ops)] if prefetch else [])
    l = learner(dls, make_model(s, device), cbs=cbs)
    quiet_fit(l)
    active = l.cuda_prefetch.active if prefetch else None
    del l
    return 1/timer.per_batch,active

def goals(name:str, s:dict, v:dict) -> dict:
    "The issue's goals on one pinned variant: R1 >= 0.9 B; and, where load- or compute-bound, R1 >= 0.98 R0"
    g = dict(active=v['prefetch_active'], of_bound=v['R1/B'] >= GOAL_BOUND)
    if v['bound_by'] in ('load','main'): g['not_slower'] = v['R1/R0'] >= 1 - GOAL_SLOWER
    return g

def run_regime(name:str, rg:dict, cfg:dict, deadline:Deadline, res_reg:dict, save, ops=None, share:float=math.inf):
    "Settings, then per pinning: the stages alone, then R0 and R1 interleaved; saved after each step"
    device = cfg['device']
    t_start = time.perf_counter()
    s = res_reg['settings'] = resolve(name, rg, cfg, device); save()
    res_reg['variants'] = {}
    for i,pinned in enumerate(cfg['pins']):
        key = 'pinned' if pinned else 'pageable'
        mine = (share - (time.perf_counter() - t_start))/(len(cfg['pins']) - i)  # this variant's share
        v = res_reg['variants'][key] = {}
        try: run_variant(name, s, pinned, cfg, deadline, v, save, ops, mine)
        except Exception as e:  # the other memory still runs
            import traceback
            v.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{name} {key}: FAILED {type(e).__name__}: {e}", 'prefetch')
        save()
        free(device)

def run_variant(name:str, s:dict, pinned:bool, cfg:dict, deadline:Deadline, v:dict, save, ops=None, mine:float=math.inf):
    "One regime with pinned or pageable host batches: the stages alone, then R0 and R1 interleaved (`v` updated after each trial)"
    from .data import image_pool, image_tfms, pool_dls
    device = cfg['device']
    t0 = time.perf_counter()
    # with workers, the loader pins (its pin thread, in this process): a tensor pinned here and sent back by a worker
    # makes CUDA calls in the worker when it is pickled there, and the worker aborts (seen on an H200)
    pool = image_pool(2 if s['workers'] == 0 else 4, s['bs'], s['size'], pin=pinned and s['workers'] == 0)
    dls = pool_dls(pool, cfg['batches'] + cfg['skip'], s['t_load'], s['workers'], pin=pinned,
                   after_batch=image_tfms(), device=device)
    v.update(components(dls, s, pinned, cfg, device)); save()
    rates,active,per_pair = {'R0':[], 'R1':[]},[],None
    for t in range(cfg['trials']):
        if per_pair is not None and (deadline.left() < per_pair + 5 or time.perf_counter() - t0 + per_pair > mine): break
        t1 = time.perf_counter()
        for which in (('R0','R1') if t % 2 == 0 else ('R1','R0')):
            r,a = fit_rate(dls, s, which == 'R1', pinned, cfg, device, ops)
            rates[which].append(r)
            if a is not None: active.append(a)
        per_pair = time.perf_counter() - t1
        r0,r1 = median(rates['R0']),median(rates['R1'])
        v.update(R0=r0, R1=r1, R0_trials=rates['R0'], R1_trials=rates['R1'], prefetch_active=all(active) and bool(active),
                 **{'R1/R0':r1/r0, 'R1/B':r1/v['B']}, seconds=time.perf_counter() - t0)
        if pinned: v['goals'] = goals(name, s, v)
        save()  # a part stopped later keeps the trials done
    log(f"{name} {'pinned' if pinned else 'pageable'}: R0 {v.get('R0', math.nan):.1f}/s, R1 {v.get('R1', math.nan):.1f}/s, "
        f"bound {v['B']:.1f}/s ({v['bound_by']}-bound), {len(rates['R1'])} trials", 'prefetch')

def run(cfg:dict, res:Results, deadline:Deadline):
    "The `prefetch` part: every regime, results saved as they come"
    import torch
    cfg = merged(DEFAULTS, cfg)
    res['config'] = {k:v for k,v in cfg.items() if k != 'regimes'}
    ops = None
    if torch.device(cfg['device']).type != 'cuda':  # the CPU tests: staging logged, not on a side stream
        from fastprofile.data.prefetch import LoggingOps
        ops = LoggingOps(copy=True)
    res['regimes'] = {}
    names = [n for n in cfg['regimes'] if cfg['select'] is None or n in cfg['select']]
    for i,name in enumerate(names):
        rg = cfg['regimes'][name]
        share = deadline.left()/(len(names) - i)  # a fair share of what is left; what it does not use goes to the next
        log(f"{name}: start ({deadline.left():.0f} s left, {share:.0f} s for this one)", 'prefetch')
        reg = res['regimes'][name] = {}
        try: run_regime(name, rg, cfg, deadline, reg, res.save, ops, share)
        except Exception as e:
            import traceback
            reg.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{name}: FAILED {type(e).__name__}: {e}", 'prefetch')
        res.save()
