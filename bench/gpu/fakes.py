"""CPU stand-ins for `torch.cuda`, so the GPU suite's parts run end to end in the CPU tests. Never a measurement.

`install()` replaces, in this process: `torch.cuda.Event` (host-clock events), `synchronize`, `_sleep` (sleeps
`cycles/1e9` seconds: 1e6 cycles per ms), `current_stream`, `init`, `empty_cache`, the device queries, the NVTX
calls, and the allocator's history (`torch.cuda.memory._record_memory_history`, `_dump_snapshot`); each stand-in
checks its arguments against torch's real signature. It puts a stand-in NVML (`fastprofile.testing.FakeNvml`, a busy
GPU) in `sys.modules['pynvml']` and lets fastprofile's telemetry read it, and `memory_snapshot=True`, on a CPU model. It lets fastprofile take `timing='events'`
and `'sync'` on a CPU model, and lets `annotate(nvtx=True)` believe CUDA is there. `torch.cuda.is_available()` stays
False, so nothing else in torch or fastai takes a CUDA path. Results saved from such a process carry `stand_ins: true`,
and the report says in its title that they are not measurements.

`python -m bench.gpu.fakes NAME ...` runs `python -m bench.gpu.part NAME ...` with the stand-ins installed."""
from __future__ import annotations
import inspect, sys, time, types

INSTALLED = False

def _check(real, *args, **kwargs):
    "Raise TypeError unless the call would bind to `real`'s signature"
    inspect.signature(real).bind(*args, **kwargs)

def install():
    "Replace `torch.cuda`'s timing, synchronization and NVTX calls by host stand-ins (see the module's docstring)"
    global INSTALLED
    if INSTALLED: return
    import torch, torch.cuda.nvtx
    cuda,real = torch.cuda,{n:getattr(torch.cuda, n) for n in ('Event','synchronize','_sleep','current_stream','init',
                                                              'empty_cache','get_device_name','get_device_properties')}
    RealEvent = real['Event']

    class WallEvent:
        "`torch.cuda.Event` on the host clock: recorded when `record` is called, always complete; CUDA's errors otherwise"
        def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
            _check(RealEvent.__new__, RealEvent, enable_timing, blocking, interprocess, external)
            self.enable_timing,self.t = enable_timing,None
        def record(self, stream=None): _check(RealEvent.record, self, stream); self.t = time.perf_counter()
        def query(self): return True
        def synchronize(self): pass
        def wait(self, stream=None): pass
        def elapsed_time(self, end_event):
            _check(RealEvent.elapsed_time, self, end_event)
            if not (self.enable_timing and end_event.enable_timing): raise RuntimeError("Events must be created with enable_timing=True")
            if self.t is None or end_event.t is None: raise RuntimeError("Both events must be recorded before calculating elapsed time")
            return (end_event.t - self.t)*1e3

    stream = types.SimpleNamespace(name='stand-in stream')
    def synchronize(device=None): _check(real['synchronize'], device)
    def _sleep(cycles): _check(real['_sleep'], cycles); time.sleep(cycles/1e9)
    def current_stream(device=None): _check(real['current_stream'], device); return stream
    def init(): _check(real['init'])
    def empty_cache(): _check(real['empty_cache'])
    def get_device_name(device=None): _check(real['get_device_name'], device); return 'CPU stand-in (bench.gpu.fakes)'
    def get_device_properties(device=None):
        _check(real['get_device_properties'], device)
        return types.SimpleNamespace(name='CPU stand-in', total_memory=0, major=0, minor=0)
    for n,f in dict(Event=WallEvent, synchronize=synchronize, _sleep=_sleep, current_stream=current_stream, init=init,
                    empty_cache=empty_cache, get_device_name=get_device_name, get_device_properties=get_device_properties).items():
        setattr(cuda, n, f)

    depth = [0]
    real_push,real_pop = torch.cuda.nvtx.range_push,torch.cuda.nvtx.range_pop
    def range_push(msg): _check(real_push, msg); depth[0] += 1; return depth[0] - 1
    def range_pop(): _check(real_pop); depth[0] -= 1; return depth[0]
    torch.cuda.nvtx.range_push,torch.cuda.nvtx.range_pop = range_push,range_pop

    # fastprofile: 'events' and 'sync' accepted for a CPU model (the events are the stand-ins above)
    import fastprofile.engine.core, fastprofile.learner, fastprofile.analysis.trace
    from fastai.learner import Learner
    orig = fastprofile.engine.core.resolve_timing
    def resolve_timing(timing, device): return timing if timing in ('events','sync') else orig(timing, device)
    fastprofile.engine.core.resolve_timing = fastprofile.learner.resolve_timing = resolve_timing
    annotate = Learner.annotate
    def annotate_with_cuda(self, **kwargs):
        "`Learner.annotate`, with `torch.cuda.is_available()` True while the callback is made (so `nvtx=True` holds)"
        avail = torch.cuda.is_available
        torch.cuda.is_available = lambda: True
        try: return annotate(self, **kwargs)
        finally: torch.cuda.is_available = avail
    Learner.annotate = annotate_with_cuda
    # telemetry: NVML (`pynvml`) and the allocator's history stood in (checked against NVML's documented and torch's real
    # signatures, `fastprofile.testing`); the sampler reads the stand-in GPU and `memory_snapshot=True` is taken for a CPU model
    import fastprofile.probes.telemetry.probe, torch.cuda.memory
    from fastprofile.testing import FakeNvml, FakeCudaMemory
    sys.modules['pynvml'] = FakeNvml()
    mem = FakeCudaMemory()
    torch.cuda.memory._record_memory_history,torch.cuda.memory._dump_snapshot = mem._record_memory_history,mem._dump_snapshot
    fastprofile.probes.telemetry.probe.reads_gpu = fastprofile.learner.reads_gpu = lambda device: True
    fastprofile.learner.check_memory_snapshot = lambda memory_snapshot, device: bool(memory_snapshot)
    INSTALLED = True

def main(argv=None) -> int:
    import bench.gpu.fakes as fk  # the importable module (under `python -m` this file is `__main__`): it holds INSTALLED
    fk.install()
    from .part import main as part_main
    return part_main(argv)

if __name__ == '__main__': sys.exit(main())
