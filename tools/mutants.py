#!/usr/bin/env python
"""Mutation check: break each promise on purpose in a copy of the tree and require the tests that name it to fail.

    python tools/mutants.py [--list] [--show] [--no-control] [--keep] [NAME...]     # default: every mutation

The tree is copied once to a temporary folder: the files git knows (`git ls-files`: tracked, and untracked ones not
ignored), as they are in the working tree, without `.venv`. A control run first runs every named test on the clean
copy: each must pass, or a "caught" mutation would prove nothing. Then, one at a time, each mutation is applied to the
copy's GENERATED modules (`fastprofile/*.py`: a small, exact text replacement, found exactly once, or nothing runs: a
mutation cannot rot silently when the code moves), its tests run against the copy with this venv's python
(`PYTHONPATH` = the copy; checked: `fastprofile` imports from it), and the file is put back. A mutation is caught when
pytest exits 1 and every test it ran failed (read from its JUnit XML): a test that still passes, an import or
collection error, a time-out is no catch. It prints a table (mutation, promise, tests, caught?, seconds; `--show`: what
failed, each time) and exits 1 if the control fails or a mutation survives, 2 for a usage error or a text not found.

About 3 minutes on 2 busy CPU cores: run it before a release (its table goes to BENCHMARKS.md), and after changing a
test named here or the code a mutation replaces (bench/README.md)."""
from __future__ import annotations
import argparse, os, shutil, subprocess, sys, tempfile, time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

@dataclass
class Mutation:
    "A broken promise: `edits` (file, text, replacement) applied to the copy; each of `tests` (pytest node ids) should fail"
    name:str # Short name, for the command line and the table
    promise:str # The promise it breaks, in words
    edits:list # (path under the root, exact text, its replacement): each text must occur exactly once
    tests:list # pytest node ids (or files) that must fail with the promise broken

class Rotten(Exception):
    "A mutation whose text is not found exactly once, or that would edit a file that is not a generated module"

def _k(path, node): return f"{path}::{node}"

MUTATIONS = [
    Mutation('events_never_recorded', "CUDA events are recorded on one batch in GPU_EVERY (`_sample` never samples)",
             [('fastprofile/engine/gpu_timing.py', "on = i >= self.warmup and (i - self.warmup) % self.gpu_every == 0", "on = False")],
             [_k('tests/test_call_counts.py', 'test_gpu_default_profile_calls_per_batch')]),
    Mutation('live_clock_in_state', "a record's state is plain values (a live clock made in `__init__`, so kept by `state()`)",
             [('fastprofile/engine/record.py', "self.keep_batches,self.warmup,self.fold_every,self.clock = keep_batches,warmup,fold_every,clock",
               "self.keep_batches,self.warmup,self.fold_every,self.clock = keep_batches,warmup,fold_every,clock\n        self.live_clock = clock")],
             [_k('tests/test_record_state.py', t) for t in ('test_state_and_transient_are_declared_once_and_apart',
              'test_every_attribute_of_a_wall_record_is_state_or_transient', 'test_every_attribute_of_a_gpu_record_is_state_or_transient',
              'test_every_attribute_of_a_merged_record_is_state_or_transient')]),
    Mutation('drawn_not_saved', "a probe's facts read back are the facts saved (`drawn` dropped from the costs' JSON both ways)",
             [('fastprofile/probes/callback_costs.py', " drawn=dict(c.drawn),", ""), ('fastprofile/probes/callback_costs.py', "; c.drawn.update(d['drawn'])", "")],
             [_k('tests/test_registry.py', 'test_each_probe_saves_and_reads_its_own_facts[opts0]')]),  # the cost sampler: the default options
    Mutation('compare_after_twice', "`compare(a, b)` shows a's numbers before and b's after (it reads b for both)",
             [('fastprofile/fixes/compare.py', "return Comparison(as_profile(a, 'a'), as_profile(b, 'b')",
               "return Comparison(as_profile(b, 'b'), as_profile(b, 'b')")],
             [_k('tests/test_v010_files.py', 'test_a_saved_profile_loads_and_compares')]),
    Mutation('advice_not_restored', "`check_advice` leaves the learner as it was (it runs its windows without `preserved`)",
             [('fastprofile/fixes/advice.py', "    with preserved(learn):\n        learn.remove_cbs(", "    if True:\n        learn.remove_cbs(")],
             [_k('tests/test_advice.py', 'test_check_advice_after_a_profiled_fit')]),
    Mutation('predictions_30pct_high', "the diagnosis' predicted speedups are its model's (every predicted step 1.3x faster)",
             [('fastprofile/engine/evidence.py', "        t1 = self.after(after)\n", "        t1 = self.after(after)/1.3\n")],
             [_k('tests/test_diagnosis_host.py', 'test_launch_bound_is_host_bound_workers_first'),
              _k('tests/test_diagnosis_host.py', 'test_pageable_copy_predicted_with_the_pinned_copy'),
              _k('tests/test_diagnosis_host.py', 'test_pinned_copy_offered_from_its_share')]),
    Mutation('gpu_steps_misread', "each step's GPU time is read from its own events (`opt_step`'s read from forward's)",
             [('fastprofile/engine/gpu_timing.py', "for s in STEPS[b.phase]: d[s.name] = el(s.start, s.end)",
               "for s in STEPS[b.phase]: d[s.name] = el(Slot.FORWARD_START, Slot.FORWARD_END) if s.name == 'opt_step' else el(s.start, s.end)")],
             [_k('tests/test_gpu_timing.py', 'test_events_mode_end_to_end_in_a_real_fit')]),
    Mutation('pool_never_waits', "a full event pool waits for the GPU's oldest row (it resolves only what completed)",
             [('fastprofile/engine/gpu_timing.py', "self._resolve(block_oldest=True)", "self._resolve()")],
             [_k('tests/test_gpu_timing.py', 'test_a_full_pool_waits_for_the_gpu')]),
    Mutation('register_unchecked', "`register` refuses a probe whose options are not `ProfileOptions` fields (the check skipped)",
             [('fastprofile/engine/core.py', '    if bad:\n        raise ValueError(f"{cls.__name__}.options names',
               '    if False:\n        raise ValueError(f"{cls.__name__}.options names')],
             [_k('tests/test_registry.py', 'test_register_refuses_what_no_probe_may_be')]),
    Mutation('input_rule_dropped', "the GPU suite's input-bound scenario is diagnosed input-bound (the input rule dropped)",
             [('fastprofile/analysis/diagnosis.py', "    Rule('input', input_rule, 'input', ('phases', 'facts.loading'), order=30),\n", "")],
             [_k('tests/test_bench_gpu.py', 'test_diagnosis_part_scenarios_on_stand_ins')]),
    # the README's promises
    Mutation('batch_measure_not_restored', "measuring batch sizes leaves the learner as it was (the model's state not put back)",
             [('fastprofile/probes/batch_sizes.py', "        finally: kept.restore()", "        finally: pass")],
             [_k('tests/test_batch_sizes.py', 'test_measuring_leaves_the_learner_as_it_was'),
              _k('tests/test_batch_sizes.py', 'test_the_fit_is_not_changed_by_the_probe')]),
    Mutation('batch_size_not_applied', "`check_advice` applies the batch size it checks (the change unknown to it)",
             [('fastprofile/fixes/advice.py', "    elif k == 'batch_size':", "    elif k == 'batch_size_':")],
             [_k('tests/test_batch_sizes.py', 'test_check_advice_applies_the_batch_size_per_sample')]),
    Mutation('fastai_tfm_moved', "a batch transform fastai adds itself (`ReadTabBatch`) is never advised to move",
             [('fastprofile/analysis/diagnosis.py', "    own = slow in FASTAI_TFMS ", "    own = False ")],
             [_k('tests/test_batch_sizes.py', 'test_tabular_per_batch_work_is_priced_measured')]),
    Mutation('before_draw_not_sent', "README: `before_draw` is sent to the callbacks that define it (never fired)",
             [('fastprofile/lifecycle/loop.py', "if cb.run_train if training else cb.run_valid: cb('before_draw')",
               "if cb.run_train if training else cb.run_valid: pass")],
             [_k('tests/test_core.py', 'test_cancel_matrix[before_draw-CancelTrainException]')]),
    Mutation('phase_other_dropped', "README: every second of the call is attributed (a phase's time between batches dropped)",
             [('fastprofile/engine/record.py', "self._stat(Row(p,'other'), total - self._phase_span)", "self._stat(Row(p,'other'), 0.)")],
             [_k('tests/test_core.py', 'test_fine_tune_is_one_call_with_stages_and_one_report')]),
    Mutation('patch_not_undone', "README: the learner is as it was after any exit (the undo stack skips attribute patches)",
             [('fastprofile/engine/patches.py', "            else: _put_back(p)\n", "            else: pass\n")],
             [_k('tests/test_lifecycle.py', 'test_each_training_method_is_one_call_and_leaves_the_learner_as_before[fit-breakdown]'),
              _k('tests/test_lifecycle.py', 'test_every_exit_with_breakdown_and_efficiency[after_pred-KeyboardInterrupt-breakdown]'),
              _k('tests/test_lifecycle.py', 'test_every_exit_with_breakdown_and_efficiency[after_pred-RuntimeError-breakdown]')]),
    Mutation('interrupt_loses_result', "README: nothing is lost on Ctrl-C (the partial result not stored on KeyboardInterrupt)",
             [('fastprofile/lifecycle/session.py', "if res is not None: self._ending(self._keep, res)",
               "if res is not None and not isinstance(exc, KeyboardInterrupt): self._ending(self._keep, res)")],
             [_k('tests/test_core.py', 'test_keyboard_interrupt_keeps_partial_report_and_closes_workers')]),
    Mutation('training_changed', "README: the profile never changes training (a torch RNG draw at every mark)",
             [('fastprofile/lifecycle/callback.py', "rec.marks[h] = _perf()", "rec.marks[h] = _perf(); torch.rand(1)")],
             [_k('tests/test_lifecycle.py', 'test_each_training_method_is_one_call_and_leaves_the_learner_as_before[fit-default]')]),
    Mutation('verdict_in_full', "the verdict is short: the first fix as code with its speedup (it prints the fix in full instead)",
             [('fastprofile/analysis/diagnosis.py', 'out.append(f"Fix: {f.short()}" if f.resource', 'out.append(f"Fix: {f.fix} {f.speedup_text()}" if f.resource')],
             [_k('tests/test_verdict.py', f'test_the_verdict_reads_at_a_glance[{n}]') for n in ('input', 'metric', 'callback')]),
    Mutation('ceiling_leads', "a ceiling does not lead a predicted fix unless clearly larger (a ceiling weighed as a prediction)",
             [('fastprofile/engine/rules.py', "return g/(CEILING_LEAD if kind == 'bound' else 1.)/", "return g/1./")],
             [_k('tests/test_diagnosis.py', 'test_a_ceiling_does_not_lead_a_measured_fix')]),
    Mutation('own_rule_not_registered', "a rule of your own, registered, is applied (`register_rule` does not add it)",
             [('fastprofile/engine/rules.py', "    RULES[r.name] = r\n", "")],
             [_k('tests/test_verdict.py', 'test_a_rule_of_your_own_appears_in_the_report')]),
    Mutation('covers_ignored', "what a rule covers is left out, once (`suppress` keeps every finding)",
             [('fastprofile/engine/rules.py', "    return [f for f in found if not any(f.resource in cov(g) and g.rule != f.rule for g in found if g is not f)]",
               "    return found")],
             [_k('tests/test_verdict.py', 'test_a_rule_declares_what_it_covers')]),
    Mutation('probe_rules_unregistered', "a measurement's rules come in with its probe (`register` does not register `Probe.rules`)",
             [('fastprofile/engine/core.py', "    for r in cls.rules: register_rule(r)  # its diagnosis rules\n", "")],
             [_k('tests/test_verdict.py', 'test_a_probes_rules_come_in_through_register')]),
    Mutation('rule_order_ignored', "the rules apply in their declared order, wherever they are registered (`RULES` kept as registered)",
             [('fastprofile/engine/rules.py', "    RULES.clear(); RULES.update(kept)\n", "")],
             [_k('tests/test_verdict.py', 'test_the_rules_apply_in_their_order')]),
    Mutation('amend_ignored', "a measurement adds its words to the core's findings (the layers' `Rule.amend` never called)",
             [('fastprofile/analysis/diagnosis.py', "        if r.amend is not None: r.amend(ev, found)\n", "        pass\n")],
             [_k('tests/test_layers.py', 'test_top_layer_and_share_against_torch_profiler'),
              _k('tests/test_efficiency.py', 'test_the_diagnosis_uses_the_measurements')]),
    Mutation('note_ignored', "what the GPU's readings say of the verdict is in its evidence (`Rule.note` never read)",
             [('fastprofile/analysis/diagnosis.py', "' '.join(n for r in rs if r.note is not None and (n := r.note(ev, best))) or None",
               "None")],
             [_k('tests/test_telemetry.py', 'test_the_gpu_corroborates_the_verdict')]),
    Mutation('probe_preface_unsaid', "what a measurement says before the verdict is said first (`Probe.preface` never read: the busy machine)",
             [('fastprofile/analysis/diagnosis.py', "pre(False), pre(True), {r.name", "None, None, {r.name")],
             [_k('tests/test_machine.py', 'test_a_busy_machine_is_a_warning_above_the_verdict_in_every_renderer'),
              _k('tests/test_own_probe.py', 'test_its_words_reach_the_diagnosis')]),
    Mutation('probe_evidence_unsaid', "a measurement's lines are in the diagnosis' evidence (`Probe.evidence` never read: the layers)",
             [('fastprofile/analysis/diagnosis.py', "    out = [s for got in _ask(said, 'evidence', ev) for s in got or ()]\n", "    out = []\n")],
             [_k('tests/test_own_probe.py', 'test_its_words_reach_the_diagnosis')]),
    Mutation('layers_unsaid', "the costliest layers are in the diagnosis' evidence and numbers (`LayersProbe.evidence`, `numbers` say nothing)",
             [('fastprofile/probes/layers.py', "        return t.lines(3) if len(t.layers) > 1 or t.failure else []", "        return []"),
              ('fastprofile/probes/layers.py', "if (len(t.layers) > 1 or t.failure) and t.layers else {}", "if False else {}")],
             [_k('tests/test_layers.py', 'test_top_layer_and_share_against_torch_profiler')]),
    Mutation('probe_rests_on_unsaid', "*Rests on* says how each measurement was made, or why not (`Probe.rests_on` never read)",
             [('fastprofile/analysis/diagnosis.py', "return out + ''.join(' ' + s for s in _ask(said, 'rests_on', ev) if s)",
               "return out")],
             [_k('tests/test_batch_sizes.py', 'test_what_cannot_be_measured_says_why'),
              _k('tests/test_own_probe.py', 'test_its_words_reach_the_diagnosis')]),
    Mutation('probe_numbers_dropped', "a measurement's numbers are in `Diagnosis.numbers` (`Probe.numbers` never read)",
             [('fastprofile/analysis/diagnosis.py', "    for got in _ask(said, 'numbers', ev): numbers.update(got or {})\n", "")],
             [_k('tests/test_own_probe.py', 'test_its_words_reach_the_diagnosis'),
              _k('tests/test_batch_sizes.py', 'test_tabular_per_batch_work_is_priced_measured')]),
    Mutation('probe_hook_unguarded', "a probe's diagnosis hook that fails is skipped with a warning (`_ask` calls it bare)",
             [('fastprofile/analysis/diagnosis.py',
               "guarded(f\"the diagnosis' `{hook}` of the probe {c.key!r}\", getattr(c, hook), data, *args)",
               "getattr(c, hook)(data, *args)")],
             [_k('tests/test_own_probe.py', 'test_a_hook_that_fails_leaves_the_diagnosis_standing')]),
    Mutation('batch_cost_unsaid', "every cost the profiler adds is in its cost line (the batch sizes timed after the fit left out)",
             [('fastprofile/engine/notes.py', "        if got: parts.append(", "        if False: parts.append(")],
             [_k('tests/test_batch_sizes.py', 'test_the_cost_line_names_the_batch_measurement')]),
    Mutation('old_names_unmapped', "a probe written with 0.2.0's event names still hears its events (the mapping not made)",
             [('fastprofile/engine/core.py', "            for n in got: setattr(cls, n, f)", "            pass")],
             [_k('tests/test_vocabulary.py', 'test_a_0_2_0_probe_hears_its_events_in_order_with_a_warning'),
              _k('tests/test_vocabulary.py', 'test_a_subclass_of_a_0_2_0_sink_is_mapped_too')]),
    Mutation('fit_events_to_fastai', "a `ProbeCallback`'s fit events come from its session, never from fastai (all to fastai's `__call__`)",
             [('fastprofile/lifecycle/session.py', "        if event_name not in FIT_EVENTS: return Callback.__call__(self, event_name)",
               "        return Callback.__call__(self, event_name)")],
             [_k('tests/test_vocabulary.py', 'test_a_probe_callback_added_by_hand_hears_each_fit')]),
    Mutation('fastai_style_event_unwrapped', "a `ProbeCallback`'s `def before_fit(self)` (fastai's way) is called without the session",
             [('fastprofile/lifecycle/session.py', "        for e in plain: setattr(cls, e, _without_session(cls.__dict__[e]))", "")],
             [_k('tests/test_vocabulary.py', 'test_a_probe_callback_with_fastai_style_fit_events_does_not_crash')]),
    Mutation('old_vocabulary_back', "the package speaks one vocabulary (the call's end told by its 0.2.0 name)",
             [('fastprofile/lifecycle/session.py', "self._ending(self._tell_back, 'after_call')", "self._ending(self._tell_back, 'end')")],
             [_k('tests/test_vocabulary.py', 'test_the_package_no_longer_speaks_the_old_vocabulary')]),
    Mutation('probe_events_timed', "a `ProbeCallback`'s fit and phase events (the session's calls) are no callback's cost",
             [('fastprofile/probes/callback_costs.py', "        own = FIT_EVENTS if isinstance(cb, Probe) else ()", "        own = ()")],
             [_k('tests/test_vocabulary.py', 'test_a_probe_callbacks_fit_events_are_no_callback_cost')]),
]

# ---------------------------------------------------------------- the copy

def _python() -> str:
    "This project's venv python if there is one, else the running one"
    v = ROOT/'.venv'/'bin'/'python'
    return str(v) if v.exists() else sys.executable

def tree_files() -> list:
    "Paths (relative) of the files git knows in the working tree: tracked and untracked-not-ignored, those deleted left out"
    out = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode().split('\0')
    return sorted({p for p in out if p and not p.startswith('.venv/') and (ROOT/p).is_file()})

def copy_tree(dest:Path) -> Path:
    "The working tree's files into `dest`"
    for p in tree_files():
        d = dest/p
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT/p, d)
    return dest

def env_for(copy:Path) -> dict:
    "The environment of a run in `copy`: it imports the copy's `fastprofile`, in strict mode, writing no bytecode"
    e = dict(os.environ, PYTHONPATH=str(copy), FASTPROFILE_STRICT='1', MPLBACKEND='Agg', PYTHONDONTWRITEBYTECODE='1', COLUMNS='250')
    e.pop('PYTEST_ADDOPTS', None)
    return e

def check_imports_copy(copy:Path, python:str):
    "Raise unless `fastprofile` imports from the copy (the venv's editable install must not win)"
    r = subprocess.run([python, '-c', 'import fastprofile; print(fastprofile.__file__)'], cwd=copy, env=env_for(copy),
                       capture_output=True, text=True)
    got = r.stdout.strip()
    if r.returncode or not Path(got).resolve().is_relative_to(copy.resolve()):
        raise Rotten(f"fastprofile imports from {got or r.stderr[-500:]!r}, not from the copy {copy}")

def apply(copy:Path, m:Mutation) -> dict:
    "Apply `m`'s edits to the copy; the original texts, to put back. `Rotten` (nothing left changed) if one cannot be made"
    saved = {}
    try:
        for path,old,new in m.edits:
            if not (path.startswith('fastprofile/') and path.endswith('.py')):
                raise Rotten(f"{m.name}: {path} is not a generated module (`fastprofile/*.py`): mutate the package, never a test")
            f = copy/path
            cur = f.read_text()
            saved.setdefault(path, cur)
            n = cur.count(old)
            if n != 1: raise Rotten(f"{m.name}: the text to replace is found {n} times in {path} (exactly once is needed): "
                                    f"the code moved; update the mutation in tools/mutants.py\n  text: {old!r}")
            f.write_text(cur.replace(old, new))
    except Rotten: restore(copy, saved); raise
    return saved

def restore(copy:Path, saved:dict):
    "Put back the texts `apply` saved"
    for path,src in saved.items(): (copy/path).write_text(src)

def run_tests(copy:Path, python:str, tests:list, timeout:float) -> tuple:
    "pytest on `tests` in the copy: (exit status or 'timeout', {test id: 'passed'|'failed'|'error'|'skipped'}, seconds, the output's tail)"
    xml = copy/'.mutants-junit.xml'
    cmd = [python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-o', 'addopts=', '-o', 'junit_family=xunit1', '--no-header',
           '--disable-warnings', '--tb=short', '--show-capture=no', f'--junitxml={xml}', *tests]
    t0 = time.monotonic()
    try: r = subprocess.run(cmd, cwd=copy, env=env_for(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired: return 'timeout', {}, time.monotonic() - t0, ''
    secs,outcomes = time.monotonic() - t0,{}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter('testcase'):
            kinds = {c.tag for c in case}
            outcomes[f"{case.get('file')}::{case.get('name')}"] = ('failed' if 'failure' in kinds else 'error' if 'error' in kinds
                                                                  else 'skipped' if 'skipped' in kinds else 'passed')
        xml.unlink()
    return r.returncode, outcomes, secs, (r.stdout + r.stderr)[-6000:]

def caught(rc, outcomes:dict) -> str:
    "'yes' when pytest exited 1 and every test it ran failed; else what went otherwise"
    if rc != 1: return f"NO (pytest exit {rc})"
    other = [k for k,v in outcomes.items() if v != 'failed']
    if not outcomes or other:
        return f"NO ({len(other)} of {len(outcomes)} tests did not fail: {', '.join(f'{k} {outcomes[k]}' for k in other)})"
    return 'yes'

# ---------------------------------------------------------------- the table

def table(rows:list) -> str:
    "Markdown: mutation | promise | tests | caught? | seconds"
    out = ['| mutation | promise | tests | caught? | seconds |', '|---|---|---|---|---:|']
    for m,got,secs in rows:
        tests = '<br>'.join(f"`{t.replace('tests/', '')}`" for t in m.tests)
        out.append(f"| `{m.name}` | {m.promise} | {tests} | {got} | {secs:.0f} |")
    return '\n'.join(out)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('names', nargs='*', help='mutations to run (default: all)')
    ap.add_argument('--list', action='store_true', help='list the mutations and their tests, run nothing')
    ap.add_argument('--no-control', action='store_true', help='skip the clean run of the named tests')
    ap.add_argument('--keep', action='store_true', help='keep the copy (its path is printed)')
    ap.add_argument('--show', action='store_true', help="print the end of each caught mutation's pytest output (what failed)")
    ap.add_argument('--timeout', type=float, default=300., help='seconds for one pytest run (default 300)')
    a = ap.parse_args(argv)
    known = {m.name:m for m in MUTATIONS}
    bad = [n for n in a.names if n not in known]
    if bad:
        print(f"mutants: unknown mutation(s) {', '.join(bad)}: valid are {', '.join(known)}", file=sys.stderr); return 2
    chosen = [known[n] for n in a.names] if a.names else MUTATIONS
    if a.list:
        for m in chosen: print(f"{m.name}: {m.promise}\n    " + '\n    '.join(m.tests))
        return 0
    python,t_all = _python(),time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix='fastprofile-mutants-'))
    try:
        copy = copy_tree(tmp/'tree')
        try:
            check_imports_copy(copy, python)
            for m in chosen: restore(copy, apply(copy, m))  # every text is found before anything runs
        except Rotten as e:
            print(f"mutants: {e}", file=sys.stderr); return 2
        print(f"mutants: {len(chosen)} mutation(s) on a copy of {len(tree_files())} files in {copy}, with {python}", flush=True)
        ok = True
        if not a.no_control:
            tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
            rc,outcomes,secs,tail = run_tests(copy, python, tests, a.timeout*2)
            print(f"control (clean copy, {len(tests)} test ids, {len(outcomes)} tests): pytest exit {rc} in {secs:.0f} s", flush=True)
            if rc != 0 or any(v != 'passed' for v in outcomes.values()):
                print(tail); print("mutants: the tests fail on the clean copy: fix them first (a catch would prove nothing)"); ok = False
        rows = []
        for m in chosen:
            saved = apply(copy, m)
            try: rc,outcomes,secs,tail = run_tests(copy, python, m.tests, a.timeout)
            finally: restore(copy, saved)
            got = caught(rc, outcomes)
            rows.append((m, got, secs))
            print(f"{m.name}: {got} in {secs:.0f} s", flush=True)
            if got != 'yes': print(tail); ok = False
            elif a.show: print('    ' + '\n    '.join(l for l in tail.splitlines() if l.startswith(('E ', 'FAILED')))[-1500:])
        print(); print(table(rows))
        print(f"\n{sum(r[1] == 'yes' for r in rows)} of {len(rows)} mutations caught; {time.monotonic() - t_all:.0f} s in all")
        return 0 if ok else 1
    finally:
        if a.keep: print(f"mutants: the copy is kept in {tmp}")
        else: shutil.rmtree(tmp, ignore_errors=True)

if __name__ == '__main__': sys.exit(main())
