"""One part of the GPU suite in this process: `python -m bench.gpu.part NAME --json FILE --budget SECONDS [--config JSON]`.

The part saves its results to FILE as it goes (atomically), so a part stopped at its time limit leaves what it had.
Exit status 0 when the part finished, 1 when it failed (the error and traceback are in FILE)."""
from __future__ import annotations
import argparse, importlib, json, signal, sys, traceback
from .common import Deadline, Results, log

PARTS = {'overhead':'bench.gpu.overhead', 'tests':'bench.gpu.cudatests', 'timing':'bench.gpu.timing', 'prefetch':'bench.gpu.prefetch',
         'diagnosis':'bench.gpu.diagnosis', 'nvtx':'bench.gpu.nvtx', 'telemetry':'bench.gpu.telemetry'}

class Stopped(Exception):
    "The suite stopped this part (SIGTERM at its time limit)"

def _stop(signum, frame): raise Stopped(f"stopped by signal {signum} (the part's time limit)")

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='python -m bench.gpu.part', description=__doc__.splitlines()[0])
    ap.add_argument('name', choices=list(PARTS))
    ap.add_argument('--json', required=True, help="where to save the results (JSON, atomically)")
    ap.add_argument('--budget', type=float, required=True, help="seconds the part plans to finish in")
    ap.add_argument('--config', default='{}', help="JSON overriding the part's DEFAULTS (e.g. smaller workloads)")
    a = ap.parse_args(argv)
    res = Results(a.json, a.name)
    res['budget'] = a.budget
    deadline = Deadline(a.budget)
    signal.signal(signal.SIGTERM, _stop)
    rc = 0
    try:
        res.save()
        mod = importlib.import_module(PARTS[a.name])
        mod.run(json.loads(a.config), res, deadline)
        res['status'] = 'done'
    except BaseException as e:  # noqa: B902 (a stop or Ctrl-C is recorded too)
        res['status'] = 'stopped' if isinstance(e, (Stopped, KeyboardInterrupt, TimeoutError)) else 'failed'
        res['error'] = f"{type(e).__name__}: {e}"
        res['traceback'] = traceback.format_exc()[-4000:]
        log(f"{a.name}: {res['status']}: {res['error']}", a.name)
        rc = 1
    finally:
        res['seconds'] = deadline.elapsed()
        res.save()
    return rc

if __name__ == '__main__': sys.exit(main())
