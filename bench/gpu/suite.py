"""`python -m bench gpu --out DIR`: every GPU part, each in its own process with a time limit, then one markdown file.

Writes, in DIR: `gpu_benchmarks.md` (the tables, under "## Measured on a GPU"; rewritten atomically after each part),
`gpu_benchmarks.json` (everything measured), `parts/NAME.json` (each part's results, saved as it goes),
`parts/tests.junit.xml`, and `logs/NAME.log` (each part's full output). Progress goes to stderr.
Exit status: 0 when every part finished and every CUDA test (and notebook `#| cuda` cell run) passed; 1 otherwise;
2 without CUDA (one line, nothing run). Missed goals are findings in the markdown, not failures."""
from __future__ import annotations
import argparse, json, os, signal, subprocess, sys, threading, time
from pathlib import Path
from .common import ROOT, atomic_write, clean, log

PARTS = ('overhead','tests','timing','prefetch','diagnosis','nvtx','telemetry')
# Seconds each part may take on an H100 (its process, imports included) before it is stopped; it plans to finish
# `GRACE` seconds earlier. The sum stays under `TOTAL`, and `TOTAL` under one device call (10 minutes, wheels installed first).
LIMITS = dict(overhead=110, tests=130, timing=90, prefetch=70, diagnosis=100, nvtx=30, telemetry=40)
GRACE,STOP,TOTAL = 12,5,580  # the part plans to end GRACE s early; SIGTERM at limit-STOP, SIGKILL at limit
MD,JSON = 'gpu_benchmarks.md','gpu_benchmarks.json'

def no_cuda_line() -> str|None:
    "None when a CUDA GPU is usable here, else the one line to print"
    try: import torch
    except Exception as e: return f"python -m bench gpu: needs PyTorch with a CUDA GPU (torch does not import: {type(e).__name__}); nothing was run"
    if torch.cuda.is_available(): return None
    return "python -m bench gpu: needs a CUDA GPU (torch.cuda.is_available() is False here); nothing was run"

def run_part(name:str, out:Path, limit:float, config:dict|None=None, python=None) -> dict:
    "Run part `name` in its own process (stopped at `limit` seconds); its outcome, with the results it saved"
    python = list(python or [sys.executable, '-m', 'bench.gpu.part'])
    js,lg = out/'parts'/f'{name}.json',out/'logs'/f'{name}.log'
    if js.exists(): js.unlink()
    cmd = python + [name, '--json', str(js), '--budget', str(max(limit - GRACE, 1.)), '--config', json.dumps(config or {})]
    t0,tail,timed_out = time.monotonic(),[],False
    with open(lg, 'w') as f:
        env = dict(os.environ, FASTPROFILE_STRICT='1')  # fastprofile's own failures raise (and are recorded), never just warn
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                             start_new_session=True)  # its own process group: stopping it stops what it started
        def pump():
            for line in p.stdout:
                f.write(line); f.flush()
                tail.append(line.rstrip('\n')); del tail[:-60]
                sys.stderr.write(f"  {name} | {line}"); sys.stderr.flush()
        th = threading.Thread(target=pump, daemon=True); th.start()
        try: rc = p.wait(timeout=max(limit - STOP, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(p, signal.SIGTERM)  # the part saves what it has
            try: rc = p.wait(timeout=STOP)
            except subprocess.TimeoutExpired: _signal_group(p, signal.SIGKILL); rc = p.wait()
        except BaseException:  # Ctrl-C on the suite: stop the part too
            _signal_group(p, signal.SIGKILL); p.wait(); raise
        th.join(timeout=5)
    res = None
    try: res = json.loads(js.read_text())
    except (OSError, ValueError): pass
    ok = rc == 0 and res is not None and res.get('status') == 'done'
    stopped = timed_out or (res is not None and res.get('status') == 'stopped')  # stopped by us, or by its own time limit
    status = 'ok' if ok else 'timed out' if stopped else 'failed'
    return dict(name=name, status=status, rc=rc, seconds=time.monotonic() - t0, limit=limit,
                log=str(lg.relative_to(out)), tail=tail[-30:], results=res)

def _signal_group(p, sig):
    try: os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError): pass

def write(out:Path, info:dict, outcomes:dict, command:str, total_s:float):
    "The markdown and the JSON, each written atomically"
    from .report import render
    atomic_write(out/MD, render(info, outcomes, command, total_s))
    atomic_write(out/JSON, json.dumps(clean(dict(info=info, command=command, seconds=total_s, parts=outcomes)), indent=1))

def run_suite(out, parts=PARTS, limits=None, configs=None, python=None, info=None, total:float=TOTAL,
              command:str='python -m bench gpu') -> int:
    "Run `parts` in turn within `total` seconds, rewriting the markdown after each; the exit status"
    from .common import device_info
    out = Path(out)
    for d in (out, out/'parts', out/'logs'): d.mkdir(parents=True, exist_ok=True)
    limits,configs = {**LIMITS, **(limits or {})},configs or {}
    info = info if info is not None else device_info()
    t0,outcomes = time.monotonic(),{}
    for name in parts: outcomes[name] = dict(name=name, status='not run yet', seconds=0, limit=limits[name], log=f'logs/{name}.log')
    write(out, info, outcomes, command, 0.)
    try:
        for name in parts:
            left = total - (time.monotonic() - t0)
            limit = min(limits[name], left)
            if limit < 2*GRACE:
                outcomes[name] = dict(name=name, status='skipped', seconds=0, limit=limits[name], log='',
                                      reason=f"only {max(left, 0):.0f} s left of the suite's {total:.0f} s")
                log(f"{name}: skipped ({outcomes[name]['reason']})")
                continue
            log(f"{name}: start (limit {limit:.0f} s; {time.monotonic() - t0:.0f} s into the suite)")
            outcomes[name] = dict(outcomes[name], status='running (the suite was stopped here)')
            outcomes[name] = o = run_part(name, out, limit, configs.get(name), python)
            log(f"{name}: {o['status']} in {o['seconds']:.0f} s")
            write(out, info, outcomes, command, time.monotonic() - t0)
    finally:  # also when the suite itself is stopped (Ctrl-C, SIGTERM): the file says how far it got
        total_s = time.monotonic() - t0
        write(out, info, outcomes, command, total_s)
    log(f"done in {total_s:.0f} s: {out/MD}")
    tests = (outcomes.get('tests') or {}).get('results') or {}
    s = tests.get('summary') or {}
    nbs = ((tests.get('notebooks') or {}).get('results') or {}).values()
    passed = 'tests' not in outcomes or (s.get('tests', 0) > 0 and s.get('failed', 1) == 0 and s.get('errors', 1) == 0
                                         and all(v['outcome'] == 'passed' for v in nbs))
    return 0 if all(o['status'] == 'ok' for o in outcomes.values()) and passed else 1

def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a in ('-h', '--help') for a in argv):
        line = no_cuda_line()
        if line: print(line, file=sys.stderr); return 2
    ap = argparse.ArgumentParser(prog='python -m bench gpu', description=__doc__.splitlines()[0])
    ap.add_argument('--out', type=Path, required=True, help=f"folder for {MD} (and the raw results and logs)")
    ap.add_argument('--parts', default=','.join(PARTS), help=f"comma-separated, from {', '.join(PARTS)} (default: all)")
    ap.add_argument('--limit', action='append', default=[], metavar='PART=SECONDS',
                    help=f"a part's time limit instead of its default ({', '.join(f'{k}={v}' for k,v in LIMITS.items())}); repeatable")
    ap.add_argument('--total', type=float, default=TOTAL, help=f"seconds for the whole suite (default {TOTAL}); each part's "
                    "limit is cut to what is left")
    a = ap.parse_args(argv)
    parts = [p.strip() for p in a.parts.split(',') if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad: ap.error(f"unknown part(s) {', '.join(map(repr, bad))}: valid parts are {', '.join(PARTS)}")
    signal.signal(signal.SIGTERM, _terminated)  # stopped from outside: the running part is stopped too, the file written
    if a.total <= 0: ap.error(f"--total must be a positive number of seconds, not {a.total:g}")
    limits = {}
    for item in a.limit:
        k,_,v = item.partition('=')
        try: limits[k.strip()] = float(v)
        except ValueError: k = None
        if k not in PARTS or limits[k] <= 0:
            ap.error(f"--limit takes PART=SECONDS with PART one of {', '.join(PARTS)} and SECONDS > 0, not {item!r}")
    return run_suite(a.out, parts, limits=limits, total=a.total, command='python -m bench gpu ' + ' '.join(argv))

def _terminated(signum, frame): raise SystemExit(128 + signum)
