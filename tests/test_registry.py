"fastprofile's own probes on the registry: the session makes each from the call's options (`make`), each saves and reads its own facts (`to_json`/`from_json`), and a registered probe with `make` runs in every profiled call without being passed"
import dataclasses, json, math, re
from collections import deque
import numpy as np
from pathlib import Path
import pytest
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.engine.core import PROBES, EXTRA_KEYS, Call, ProfileOptions, Facts
from fastprofile.learner import made_probes, session_for
from fastprofile.probes.layers import LayersProbe
from fastprofile.probes.memory_snapshot import MemorySnapshotProbe
from fastprofile.sinks.saving import facts_state, facts_from

BUILTIN = {'loading':'LoadingProbe', 'compile':'CompileProbe', 'callback_costs':'CallbackCostsProbe', 'breakdown':'BreakdownProbe',
           'efficiency':'EfficiencyProbe', 'layers':'LayersProbe', 'telemetry':'TelemetryProbe', 'memory_snapshot':'MemorySnapshotProbe',
           'machine':'MachineProbe'}

def _made(learn, snapshot=None, **kw):
    "The names of fastprofile's probes the registry makes for a call with options `kw`, in their order"
    return [type(p).__name__ for p in made_probes(Call(learn, ProfileOptions(**kw), None, snapshot)) if p.key in BUILTIN]

def test_every_probe_of_fastprofile_is_on_the_registry():
    assert {k:PROBES[k].__name__ for k in BUILTIN} == BUILTIN

def test_register_refuses_what_no_probe_may_be():
    "A key that is no name, a `Facts` field or fastprofile's own; options that are no `ProfileOptions` field: `register` refuses them"
    bad = lambda **kw: type('Bad', (Probe,), {'__module__': 'mypkg.bad', **kw})
    with pytest.raises(TypeError, match='takes a `Probe` subclass'): register(object)
    with pytest.raises(ValueError, match='must be a name'): register(bad(key='not a name'))
    with pytest.raises(ValueError, match='is a field of `Facts`'): register(bad(key='device'))  # a probe's facts are its own
    with pytest.raises(ValueError, match='kept in `facts.extra` by fastprofile'): register(bad(key=EXTRA_KEYS[0]))
    with pytest.raises(ValueError, match="'no_such_option', not `ProfileOptions` fields"):
        register(bad(key='bad_options', options=('warmup', 'no_such_option')))
    assert not {'not a name', 'device', 'bad_options'} & set(PROBES)

def test_the_options_decide_which_probes_the_registry_makes():
    learn = synth_learner()
    assert _made(learn) == ['LoadingProbe', 'MachineProbe', 'CompileProbe', 'CallbackCostsProbe', 'LayersProbe', 'TelemetryProbe']  # a CPU learner's defaults
    assert _made(learn, breakdown=True, efficiency=True, layers=False, telemetry=False) == ['LoadingProbe', 'MachineProbe', 'CompileProbe', 'BreakdownProbe', 'EfficiencyProbe']
    assert _made(learn, peak_flops=1e12)[4] == 'EfficiencyProbe'  # 'auto' efficiency: on with a peak
    assert _made(learn, snapshot='run.csv')[-1] == 'MemorySnapshotProbe'

def test_the_session_orders_the_pair_the_registry_yours_and_the_sinks():
    learn = synth_learner()
    s = session_for(learn, logger_callback=None)
    assert [type(p).__name__ for p in s.probes] == ['SimpleProfilerCallback', 'LoadingProbe', 'MachineProbe', 'CompileProbe', 'CallbackCostsProbe', 'LayersProbe', 'TelemetryProbe', 'BatchSizesProbe',
                                                   'LearnerFacts', 'PrefetchStaging', 'SimpleProfilerPostCallback']
    assert type(s.profile.on_batch).__name__ == 'CallbackCostsProbe'  # the one `per_batch` probe
    mine = LayersProbe(learn, first=1, every=1)  # passed under a registered key: it takes the registry's place
    s = session_for(learn, logger_callback=None, probes=[mine])
    assert [p for p in s.probes if isinstance(p, LayersProbe)] == [mine]

def test_a_second_per_batch_probe_is_refused_at_the_call():
    class Counter(Probe):
        key,per_batch = 'per_batch_counter',True
        def __call__(self): pass
    learn = synth_learner()
    try:
        with pytest.raises(ValueError, match='more than one probe asks to be called after every batch'): learn.profile(probes=[Counter()])
        assert not [cb for cb in learn.cbs if type(cb).__module__.startswith('fastprofile')]
    finally: PROBES.pop('per_batch_counter', None)

def _roundtrip(cls, v): return cls.from_json(json.loads(json.dumps(cls.to_json(v), allow_nan=False)))

def _fields(o) -> dict:
    "The public fields of facts `o`: a dataclass's fields (read through their descriptors: folded on read), else its public attributes"
    if dataclasses.is_dataclass(o): return {f.name:getattr(o, f.name) for f in dataclasses.fields(o)}
    return {k:v for k,v in vars(o).items() if not k.startswith('_')}

def differences(a, b, where='') -> list:
    "Where the facts `b` read back differ from the facts `a` measured, field by field (NaN equals NaN; a dict subclass is a dict)"
    num = lambda x: isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
    if num(a) and num(b): return [] if a == b or (math.isnan(a) and math.isnan(b)) else [f"{where}: {a!r} read back as {b!r}"]
    if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
        return [f"{where}: {type(a).__name__} read back as {type(b).__name__}"]
    if isinstance(a, np.ndarray):
        return [] if a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == 'f') else [f"{where}: the arrays differ"]
    if isinstance(a, dict):
        out = [f"{where}[{k!r}]: {'not read back' if k in a else 'read back, never measured'}" for k in set(a) ^ set(b)]
        return out + [d for k in a if k in b for d in differences(a[k], b[k], f"{where}[{k!r}]")]
    if isinstance(a, (list, tuple, deque)):
        if len(a) != len(b): return [f"{where}: {len(a)} items read back as {len(b)}"]
        return [d for i,(x,y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if hasattr(a, '__dict__'): return differences(_fields(a), _fields(b), where)
    return [] if a == b else [f"{where}: {a!r} read back as {b!r}"]

@pytest.mark.parametrize('opts', [dict(), dict(breakdown=True, efficiency=True)])
def test_each_probe_saves_and_reads_its_own_facts(opts):
    "Each probe's facts, saved (`to_json`) and read back (`from_json`), are the facts measured: every public field, by value"
    learn = synth_learner(n_trn=16, n_val=8)
    learn.profile(show_report=False, logger_callback=None, **opts).fit(1)
    f = learn.simple_profile.facts
    want = {'loading', 'layers', 'telemetry'} | ({'breakdown', 'efficiency'} if opts else {'callback_costs'})
    assert want <= set(f.extra), set(f.extra)  # and any other probe the registry made, checked the same way below
    if not opts: assert dict(f.callback_costs.drawn) == {'train': 1, 'valid': 1}  # a sampled batch's draw split, each phase
    for k,v in f.extra.items():
        back = _roundtrip(PROBES[k], v)
        assert type(back) is type(v) and not differences(v, back, k), differences(v, back, k)
    state = facts_state(f)
    assert set(f.extra) <= set(state) and not state['extra']  # each registered probe's facts under its key, as 0.1.0 wrote them
    g = facts_from(json.loads(json.dumps(state, allow_nan=False)))
    assert set(g.extra) == set(f.extra) and not differences(f.extra, g.extra, 'facts'), differences(f.extra, g.extra, 'facts')
    assert _roundtrip(MemorySnapshotProbe, '/runs/simple_profile_snapshot.pickle') == '/runs/simple_profile_snapshot.pickle'

def test_a_registered_probe_with_make_runs_in_every_call(tmp_path):
    @register
    class FitsSeen(Probe):
        "Counts the fits of a call; made for every call with a warm-up below 5"
        key = 'fits_seen'
        @classmethod
        def make(cls, call): return cls() if call.options.warmup < 5 else None
        def before_call(self, s): self.n = 0
        def before_fit(self, s): self.n += 1
        def measured(self): return self.n
    try:
        learn = synth_learner(n_trn=16, n_val=8)
        learn.profile(show_report=False, logger_callback=None).fit(1)  # not passed: the registry makes it
        assert learn.simple_profile.facts.fits_seen == 1
        learn.profile(show_report=False, logger_callback=None, warmup=6).fine_tune(1)  # two fits, and `make` says no
        assert 'fits_seen' not in learn.simple_profile.facts.extra and learn.simple_profile.facts.fits_seen is None
        learn.profile(show_report=False, logger_callback=None).fine_tune(1)
        p = learn.simple_profile.save(tmp_path/'run.json')
        assert load_profile(p).facts.fits_seen == 2
    finally: PROBES.pop('fits_seen', None)

def test_saving_names_no_probe():
    "Saving and loading go through the registry: `sinks/saving.py` holds no probe's serializer (a new probe needs no line there)"
    src = (Path(__file__).parent.parent/'fastprofile'/'sinks'/'saving.py').read_text()
    named = [n for n in ('LayerTimes', 'Telemetry', 'Breakdown', 'SampledCosts', 'CompileStats', 'Efficiency', 'LoadTime',
                         'callback_costs', 'memory_snapshot', "'layers'", "'telemetry'") if n in src]
    assert named == []

def test_a_notebook_defining_a_registered_class_leaves_the_modules():
    "A module's notebook defines the class its module registered (`__main__.LayersProbe`): the module's stays, and nothing is refused; another class under a taken key is"
    Copy = type('LayersProbe', (LayersProbe,), {'__module__': '__main__'})
    assert register(Copy) is Copy and PROBES['layers'] is LayersProbe
    Early = type('EarlyProbe', (Probe,), {'__module__': '__main__', 'key': 'early_key'})  # the notebook's class first, then its module imported
    Module = type('EarlyProbe', (Probe,), {'__module__': 'mypkg.early', 'key': 'early_key'})
    try:
        register(Early); assert register(Module) is Module and PROBES['early_key'] is Module
        assert register(Early) is Early and PROBES['early_key'] is Module  # and it stays, whichever comes again
    finally: PROBES.pop('early_key', None)
    Other = type('NotLayers', (Probe,), {'__module__': '__main__', 'key': 'layers'})
    with pytest.raises(ValueError, match="taken by fastprofile.probes.layers.LayersProbe"): register(Other)

STILL_NAMED = {}  # what a module may still import from a measurement: nothing

def probe_imports(path:Path, root:Path) -> set:
    """The names a module of `root` imports from `fastprofile.probes` (its folder or any module in it), but for the
    registry of all (`probes.builtin`, imported to register them: it names none)"""
    import ast
    pkg = ['fastprofile', *path.relative_to(root).parent.parts]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            mod = '.'.join((pkg[:len(pkg)-n.level+1] if n.level else []) + ([n.module] if n.module else []))
            if mod.split('.')[:2] == ['fastprofile', 'probes'] and mod != 'fastprofile.probes.builtin':
                out |= {a.name for a in n.names}
        elif isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.split('.')[:2] == ['fastprofile', 'probes']}
    return out

def test_the_report_and_the_sinks_name_no_measurement():
    """The sinks, the report's list of sections and its ranks' section import nothing from the probes: a measurement's
    section, scalars and lines across ranks come through `Probe`"""
    root = Path(__file__).parent.parent/'fastprofile'
    files = [*sorted((root/'sinks').glob('*.py')), root/'analysis'/'sections.py', root/'analysis'/'distributed.py']
    got = {str(f.relative_to(root)): probe_imports(f, root) for f in files}
    assert {k:v - STILL_NAMED.get(k, set()) for k,v in got.items() if v - STILL_NAMED.get(k, set())} == {}
    assert probe_imports(root/'learner.py', root)  # the check sees an import of the probes where there is one

# the breakdown is the callback costs measured on every batch (`breakdown=True`): it times with the sampler's stand-ins
SHARED = {'breakdown': {'callback_costs'}}

def fastprofile_imports(path:Path, root:Path) -> set:
    "The fastprofile modules a module of `root` imports (`engine.core`, `probes.efficiency.flops`, ...)"
    import ast
    pkg = [*path.relative_to(root).parent.parts]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.level:
            base = pkg[:len(pkg)-n.level+1]
            out.add('.'.join(base + ([n.module] if n.module else [])))
        elif isinstance(n, ast.ImportFrom) and (n.module or '').startswith('fastprofile.'):
            out.add(n.module[len('fastprofile.'):])
    return out

def test_a_measurement_imports_only_the_core_and_itself():
    """Each measurement (a module or a folder of `probes/`) imports from fastprofile only the core (engine, lifecycle,
    data, the old names in `moved`) and its own folder: following one measurement end to end opens one folder"""
    root = Path(__file__).parent.parent/'fastprofile'
    core = ('engine', 'lifecycle', 'data', 'moved')
    bad = {}
    for f in sorted((root/'probes').rglob('*.py')):
        rel = f.relative_to(root/'probes')
        if rel.name in ('__init__.py', 'builtin.py') and len(rel.parts) == 1: continue  # the floor's face, the registry
        own = rel.parts[0].removesuffix('.py')
        mine = {own, *SHARED.get(own, ())}
        got = {m for m in fastprofile_imports(f, root)
               if not (m.split('.')[0] in core or (m.split('.')[0] == 'probes' and m.split('.')[1:2][0] in mine)
                       or (len(rel.parts) > 1 and m.split('.')[:2] == ['probes', own]))}
        if got: bad[str(rel)] = got
    assert bad == {}, bad
    # the check reads a module's imports, relative and absolute (a mutation adding `from .efficiency.facts import ...` to
    # layers.py, or `from ...analysis.diagnosis import diagnose` to efficiency/report.py, fails it)
    assert fastprofile_imports(root/'probes'/'layers.py', root) >= {'engine.core', 'engine.tables'}
    assert fastprofile_imports(root/'probes'/'efficiency'/'report.py', root) >= {'probes.efficiency.flops'}

def module_imports(root:Path) -> dict:
    """Each module of package `root` -> the modules of `root` it imports (`fastprofile.probes.telemetry.report`, ...):
    `import`s and `from` imports, relative and absolute, at any depth (a function's lazy import counts); `from pkg
    import mod` names the submodule `mod`, an import of a package names its `__init__`"""
    import ast
    def name(f): return '.'.join(f.relative_to(root.parent).with_suffix('').parts).removesuffix('.__init__')
    mods = {name(f): f for f in root.rglob('*.py')}
    out = {}
    for m,f in mods.items():
        pkg = m.split('.') if f.name == '__init__.py' else m.split('.')[:-1]
        got = set()
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import): got |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom):
                base = '.'.join(pkg[:len(pkg)-n.level+1] + [n.module or ''] if n.level else [n.module]).rstrip('.')
                subs = {f"{base}.{a.name}" for a in n.names} & mods.keys()
                got |= subs or {base}
        out[m] = {g for g in got if g in mods and g != m}
    return out

def import_circles(graph:dict) -> list:
    "The circles of `graph` (module -> the modules it imports): each set of two or more modules that import each other"
    def reach(m):
        seen,todo = set(),[m]
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n not in seen: seen.add(n); todo.append(n)
        return seen
    r = {m: reach(m) for m in graph}
    return sorted({tuple(sorted({m} | {n for n in r[m] if m in r[n]})) for m in graph if m in r[m]})

def test_no_module_is_in_an_import_circle(tmp_path):
    """No module of fastprofile imports one that imports it back, directly or through others, at the top or inside a
    function: the house reads from the engine up, and a measurement's facts, report and probe in that order"""
    root = Path(__file__).parent.parent/'fastprofile'
    graph = module_imports(root)
    assert import_circles(graph) == []
    # the scan sees the imports a circle is made of (the telemetry probe reaching its report, which imports what the
    # probe measured); a package written here with a circle through a function's relative import is found
    tel = 'fastprofile.probes.telemetry.'
    assert graph[tel + 'probe'] >= {tel + 'facts', tel + 'report'}
    assert graph[tel + 'report'] >= {tel + 'facts', 'fastprofile.engine.core'}
    pkg = tmp_path/'pkg'; (pkg/'sub').mkdir(parents=True)
    (pkg/'__init__.py').write_text('')
    (pkg/'sub'/'__init__.py').write_text('from .a import *\n')
    (pkg/'sub'/'a.py').write_text('import math\nfrom pkg.sub.b import f\n')
    (pkg/'sub'/'b.py').write_text('def f():\n    from . import c\n')
    (pkg/'sub'/'c.py').write_text('def g():\n    from .. import sub\n    from ..sub import a\n')
    g = module_imports(pkg)
    test_eq(g['pkg.sub.c'], {'pkg.sub', 'pkg.sub.a'})
    test_eq(import_circles(g), [('pkg.sub', 'pkg.sub.a', 'pkg.sub.b', 'pkg.sub.c')])
    (pkg/'sub'/'c.py').write_text('')
    test_eq(import_circles(module_imports(pkg)), [])
