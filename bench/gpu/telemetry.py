"""Part `telemetry`: `learn.profile(telemetry=...)`'s NVML sampler and `memory_snapshot=True` on a real GPU.

0. NVML's averaging window: the GPU spins, stops, and NVML's utilization is read every 10 ms until it reads 0: how
   long a busy stretch stays in the reading (`nvmlDeviceGetUtilizationRates` averages over a sample period of 1/6 s
   to 1 s, by product).
1. Phases: a loader whose draw sleeps (the GPU idles) and a batch that spins the GPU (`torch.cuda._sleep`), each
   longer than NVML's averaging window (at least 1.5 times the window measured in 0), synchronized at the batch's end: the samples tagged `draw` should read a
   mostly idle GPU, those tagged `batch` a busy one. Also read: samples taken against the interval asked for, the
   sampler's cost per sample (on its thread), power per row, and the energy from the power samples (trapezoids)
   against NVML's own energy counter over the same span.
2. Overhead: a host-bound tiny MLP fit with the sampler off, at its default interval and at 5 ms, interleaved over
   trials (median seconds per training batch): what the thread costs the training loop.
3. Out of memory: a fit that allocates more than the GPU holds at batch 2 with `memory_snapshot=True`: the snapshot
   is written next to the CSV, loads with `pickle`, is named in the error's note; the profile is kept; a fit without
   the error writes nothing."""
from __future__ import annotations
import math, os, pickle, tempfile, time
from .common import Deadline, Results, log, merged, quiet_fit, free, median, spin_per_ms, sync

DEFAULTS = dict(device='cuda', every=.05, phases=dict(batches=10, valid=2, draw_ms=300., spin_ms=300., bs=64),
                overhead=dict(trials=3, batches=200, bs=64, everies=[.05, .005]), snapshot=True, window=True)

def util_window(device, spin_s:float=1.5, watch_s:float=2.5, every:float=.01) -> dict:
    "Seconds NVML's GPU utilization stays above 0 after a `spin_s` spin ends: about its averaging window"
    import torch, pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.device(device).index or 0)
    torch.cuda._sleep(int(spin_s*1e3*spin_per_ms(device))); sync(device)
    t0,seen = time.perf_counter(),[]
    while (t := time.perf_counter() - t0) < watch_s:
        seen.append((round(t, 3), pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
        if seen[-1][1] == 0: break
        time.sleep(every)
    idle = next((t for t,u in seen if u == 0), None)
    return dict(idle_after=idle, readings=seen[:: max(len(seen)//40, 1)], spin_s=spin_s)

def phases(cfg:dict, device, res:Results):
    "Sampled rows against a known schedule: draws that sleep, batches that spin the GPU"
    import torch
    from fastai.basics import Callback
    from torch import nn
    from bench.gpu_timing import SpinLayer
    from fastprofile.probes.telemetry.report import telemetry_summary
    from .data import tensor_pool, pool_dls, learner
    c = dict(cfg['phases'])
    on_gpu = torch.device(device).type == 'cuda'
    if on_gpu and cfg['window']:
        w = res['nvml_window'] = util_window(device); res.save()
        log(f"NVML utilization reads 0 {w['idle_after']} s after a spin ends", 'telemetry')
        need = 1.5e3*(w['idle_after'] or 1.)  # ms: each draw and batch outlasts the window
        if need > c['draw_ms']:
            c.update(draw_ms=need, spin_ms=need, batches=max(3, int(c['batches']*c['draw_ms']/need)), valid=1)
    dls = pool_dls(tensor_pool(2, (c['bs'], 8), pin=on_gpu), c['batches'], t_load=c['draw_ms']/1e3, device=device, n_valid=c['valid'])
    cycles = int(c['spin_ms']/2*spin_per_ms(device))  # half in the forward, half in the backward
    class Sync(Callback):
        "The GPU's work ends inside its batch (the host waits there, in `batch`): the next draw finds it idle"
        order = 2000
        def after_step(self): sync(device)
        def after_loss(self):
            if not self.training: sync(device)
    learn = learner(dls, nn.Sequential(nn.Linear(8, 10), SpinLayer(cycles, cycles)).to(device), cbs=Sync())
    learn.profile(telemetry=True, telemetry_every=cfg['every'], show_report=False, logger_callback=None)
    t0 = time.perf_counter(); quiet_fit(learn); wall = time.perf_counter() - t0
    r = learn.simple_profile
    tel,s = r.facts.telemetry,telemetry_summary(r)
    span = tel.last - tel.first
    out = dict(summary=s, samples=tel.samples, span=span, wall=wall, every=tel.every, expected_samples=span/tel.every + 1,
               cost_per_sample=tel.cost/tel.samples if tel.samples else None, gpu_off=tel.gpu_off, gpu_name=tel.gpu_name,
               energy=tel.energy, energy_counter=tel.energy_counter,
               energy_rel=(tel.energy/tel.energy_counter - 1) if tel.energy_counter and not math.isnan(tel.energy_counter) else None,
               rows={k:v for k,v in s.get('gpu_utilization', {}).items()}, power=s.get('power_w', {}),
               draw_ms=c['draw_ms'], spin_ms=c['spin_ms'], report=r.report.section('Telemetry').lines if r.report.section('Telemetry') else [])
    u = out['rows']
    out['checks'] = dict(gpu_read=tel.gpu_name is not None,
                         batch_busier_than_draw=(u.get('train_batch', -1) > u.get('train_draw', 101) + 30) if u else None,
                         samples_as_asked=abs(tel.samples/out['expected_samples'] - 1) < .2 if tel.samples else False,
                         energy_matches_counter=(abs(out['energy_rel']) < .15) if out['energy_rel'] is not None else None,
                         thread_joined=not any(t.name == 'fastprofile-telemetry' for t in __import__('threading').enumerate()))
    res['phases'] = out; res.save()
    log(f"phases: {out['checks']}; GPU util per row {u}", 'telemetry')
    del learn; free(device)

def overhead(cfg:dict, device, res:Results, deadline:Deadline):
    "Seconds per training batch of a host-bound fit with the sampler off and on, interleaved over trials"
    import torch
    from fastai.basics import Learner, MSELossFlat
    from fastai.test_utils import synth_dbunch
    from torch import nn
    from .common import step_timer
    c = cfg['overhead']
    variants = [('off', False, None)] + [(f"every {e*1e3:g} ms", True, e) for e in c['everies']]
    per = {n:[] for n,_,_ in variants}
    for t in range(c['trials']):
        for name,on,every in variants:
            if deadline.left() < 20: break
            dls = synth_dbunch(bs=c['bs'], n_train=c['batches'], n_valid=1, cuda=torch.device(device).type == 'cuda')
            timer = step_timer(5, device)
            learn = Learner(dls, nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 1)).to(device), loss_func=MSELossFlat(), cbs=timer)
            kw = dict(telemetry=True, telemetry_every=every) if on else dict(telemetry=False)
            learn.profile(show_report=False, logger_callback=None, **kw)
            quiet_fit(learn)
            per[name].append(timer.per_batch)
            del learn; free(device)
        res['overhead'] = dict(per_batch=per); res.save()
    base = median(per['off'])
    res['overhead'] = dict(per_batch=per, median={n:median(v) for n,v in per.items()},
                           relative={n:(median(v)/base - 1) if base and v else None for n,v in per.items() if n != 'off'})
    res.save()
    log(f"overhead: {res['overhead']['relative']}", 'telemetry')

def out_of_memory(cfg:dict, device, res:Results):
    "A fit that runs out of memory at batch 2 with `memory_snapshot=True`; then one that does not"
    import torch
    from fastai.basics import Callback
    from fastai.test_utils import synth_learner
    on_gpu = torch.device(device).type == 'cuda'
    class Overflow(Callback):
        "At training batch 2, allocate twice the GPU's memory (on a CPU stand-in: raise CUDA's error)"
        def after_pred(self):
            if not (self.training and self.iter == 2): return
            if not on_gpu: raise torch.OutOfMemoryError('CUDA out of memory (a CPU stand-in)')
            self.learn.too_big = torch.empty(2*torch.cuda.get_device_properties(device).total_memory, dtype=torch.uint8, device=device)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        learn = synth_learner(n_trn=8, n_val=2, path=d, cuda=on_gpu, cbs=Overflow())
        learn.profile(memory_snapshot=True, show_report=False, logger_callback=None)
        t0,err = time.perf_counter(),None
        try: quiet_fit(learn)
        except torch.OutOfMemoryError as e: err = e
        out['seconds_to_error'] = time.perf_counter() - t0
        path = os.path.join(d, 'simple_profile_oom.pickle')
        out['raised'] = err is not None
        out['note'] = (getattr(err, '__notes__', None) or [''])[-1]
        out['written'] = os.path.exists(path)
        if out['written']:
            out['bytes'] = os.path.getsize(path)
            t1 = time.perf_counter(); snap = pickle.load(open(path, 'rb')); out['load_seconds'] = time.perf_counter() - t1
            out['keys'] = sorted(snap)[:10]
            out['trace_events'] = sum(len(t) for t in snap.get('device_traces', []))
        r = learn.simple_profile
        out['profile_kept'] = r is not None and (r.interrupted or '').startswith('OutOfMemoryError')
        out['facts_path'] = r.facts.memory_snapshot if r is not None else None
        learn.remove_cb(Overflow); os.path.exists(path) and os.unlink(path)
        learn.profile(memory_snapshot=True, show_report=False, logger_callback=None)
        quiet_fit(learn)
        out['written_without_error'] = os.path.exists(path)
        del learn
    out['checks'] = dict(raised=out['raised'], written=out['written'], named_in_note=bool(out['written'] and path in out['note']),
                         loads=bool(out.get('keys')) and 'device_traces' in out.get('keys', []), profile_kept=out['profile_kept'],
                         nothing_without_error=not out['written_without_error'])
    res['snapshot'] = out; res.save()
    log(f"snapshot: {out['checks']}", 'telemetry')
    free(device)

def run(cfg:dict, res:Results, deadline:Deadline):
    "The `telemetry` part"
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    cfg = merged(DEFAULTS, cfg)
    device = cfg['device']
    res['config'] = cfg
    try: import pynvml  # noqa: F401
    except ImportError: res['nvml'] = 'nvidia-ml-py is not installed: the GPU readings are off'
    phases(cfg, device, res)
    if deadline.left() > 25: overhead(cfg, device, res, deadline)
    else: res['overhead'] = dict(skipped=f"{deadline.left():.0f} s left")
    if cfg['snapshot']: out_of_memory(cfg, device, res)
