"""Part `tests`: `pytest -m cuda tests/`, each test's outcome read back from its JUnit XML (or, cut short, from `-v` lines);
then, if nbdev is installed and time is left, the notebooks that have `#| cuda` cells, one `nbdev-test --flags cuda` each.

Collection errors do not stop the run (`--continue-on-collection-errors`): a test module that cannot be imported on
the GPU machine is reported, and the CUDA tests of the other modules still run."""
from __future__ import annotations
import json, re, signal, subprocess, sys, tempfile, threading, time
import xml.etree.ElementTree as ET
from pathlib import Path
from .common import Deadline, Results, ROOT, log, merged

# `-o timeout=90`: pytest-timeout stops a hung test (a DataLoader waiting on a dead worker) and the next ones still run
DEFAULTS = dict(marker='cuda', paths=['tests/'], extra=['-o', 'timeout=90'], notebooks=True, nbs='nbs', notebook_limit=60)
VLINE = re.compile(r'^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b')

def parse_junit(path) -> tuple:
    "(summary, cases) from a pytest JUnit XML file"
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))
    cases = []
    for s in suites:
        for c in s.iter('testcase'):
            outcome,msg = 'passed',''
            for tag in ('failure','error','skipped'):
                el = c.find(tag)
                if el is not None:
                    outcome = {'failure':'failed', 'error':'error', 'skipped':'skipped'}[tag]
                    msg = (el.get('message') or '') + ('\n' + el.text if el.text and tag != 'skipped' else '')
                    break
            name = f"{c.get('classname', '')}::{c.get('name', '')}".strip(':')
            cases.append(dict(name=name, outcome=outcome, seconds=float(c.get('time') or 0), message=msg[-1500:]))
    return summarize(cases),cases

def parse_verbose(lines:list) -> tuple:
    "(summary, cases) from `pytest -v` lines, for a run cut short before its XML was written"
    cases = [dict(name=m.group(1), outcome=m.group(2).lower().replace('xfail','skipped').replace('xpass','passed'),
                  seconds=None, message='') for m in map(VLINE.match, lines) if m]
    return summarize(cases),cases

def summarize(cases:list) -> dict:
    n = lambda o: sum(c['outcome'] == o for c in cases)
    return dict(tests=len(cases), passed=n('passed'), failed=n('failed'), errors=n('error'), skipped=n('skipped'))

def run(cfg:dict, res:Results, deadline:Deadline):
    "The `tests` part"
    cfg = merged(DEFAULTS, cfg)
    xml = Path(res.path).with_suffix('.junit.xml') if res.path else Path(tempfile.mkdtemp())/'junit.xml'
    if xml.exists(): xml.unlink()
    cmd = [sys.executable, '-m', 'pytest', '-m', cfg['marker'], *cfg['paths'], '-v', '-rfEs', '-p', 'no:cacheprovider',
           '--continue-on-collection-errors', f'--junitxml={xml}', *cfg['extra']]
    res['command'] = ' '.join(cmd[2:])
    res['junit'] = str(xml)
    res.save()
    log(f"running: {res['command']}", 'tests')
    lines,t0 = [],time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    def pump():
        for line in p.stdout:
            lines.append(line.rstrip('\n'))
            sys.stderr.write(line); sys.stderr.flush()
    th = threading.Thread(target=pump, daemon=True); th.start()
    try: rc = p.wait(timeout=max(deadline.left() - 5, 1))
    except BaseException as e:  # our time limit, or the suite stopping this part: stop pytest, keep what it printed
        p.send_signal(signal.SIGINT)  # pytest ends its session (and writes the XML) on Ctrl-C
        try: p.wait(timeout=5)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
        res['timed_out'] = True
        _record(res, xml, lines, None, t0, th)
        if isinstance(e, subprocess.TimeoutExpired):
            raise TimeoutError(f"pytest ran past this part's time ({deadline.seconds:.0f} s) and was stopped; the tests it finished are recorded")
        raise
    _record(res, xml, lines, rc, t0, th)
    if cfg['notebooks']: run_notebooks(cfg, res, deadline)

def cuda_notebooks(folder) -> list:
    "The notebooks in `folder` with a `#| cuda` cell"
    return sorted(p for p in Path(folder).glob('*.ipynb') if '#| cuda' in p.read_text())

def run_notebooks(cfg:dict, res:Results, deadline:Deadline):
    "`nbdev-test --flags cuda` on each notebook with `#| cuda` cells (FASTPROFILE_STRICT=1), while time is left"
    import importlib.util, os
    nbs = cuda_notebooks(ROOT/cfg['nbs'])
    out = res['notebooks'] = dict(names=[p.name for p in nbs], results={})
    if importlib.util.find_spec('nbdev') is None:
        out['not_run'] = 'nbdev is not installed here'; res.save(); return
    env = dict(os.environ, FASTPROFILE_STRICT='1')
    for nb in nbs:
        left = deadline.left() - 5
        if left < 15: out['results'][nb.name] = dict(outcome='not run', message='no time left'); continue
        # called with keyword arguments (its `call_parse` then reads an empty command line): exit 1 on a failure
        kw = dict(path=str(nb.parent), flags='cuda', file_re=f'^{re.escape(nb.name)}$', n_workers=0)
        cmd = [sys.executable, '-c', 'import sys, json; kw = json.loads(sys.argv.pop(1)); from nbdev.test import nbdev_test; '
               'nbdev_test(**kw)', json.dumps(kw)]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=min(left, cfg['notebook_limit']))
            text = (r.stdout + r.stderr).strip()
            outcome = 'passed' if r.returncode == 0 else 'failed'
        except subprocess.TimeoutExpired as e:
            text,outcome = str(e.stdout or '')[-2000:],'timed out'
        sys.stderr.write(text[-3000:] + '\n')
        out['results'][nb.name] = dict(outcome=outcome, seconds=time.perf_counter() - t0, message=text[-1500:] if outcome != 'passed' else '')
        log(f"notebook {nb.name}: {outcome}", 'tests')
        res.save()

def _record(res, xml, lines, rc, t0, th):
    th.join(timeout=5)
    res['rc'] = rc
    res['seconds_pytest'] = time.perf_counter() - t0
    try: (summary,cases),res['source'] = parse_junit(xml),'junit'
    except Exception: (summary,cases),res['source'] = parse_verbose(lines),'verbose output'
    res['summary'],res['cases'] = summary,cases
    res['tail'] = lines[-40:]
    res.save()
    log(f"{summary} (pytest exit {rc})", 'tests')
