"The README's claims hold for the default a user gets: its figures are BENCHMARKS' own, its widths are what a pipe and `plain()` give"
import os, re, subprocess, sys, textwrap
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURE = re.compile(r'[+~]?\d[\d,]*(?:\.\d+)?\s?(?:µs|ms|s)\b')

def _readme() -> str: return (ROOT/'README.md').read_text()

def answers() -> str:
    "BENCHMARKS.md's first screen: the section 'The answers first'"
    b = (ROOT/'BENCHMARKS.md').read_text()
    i = b.index('## The answers first')
    return b[i:b.index('\n## ', i + 1) if '\n## ' in b[i + 1:] else len(b)]

def _paragraph(text:str, start:str) -> str:
    "The paragraph of `text` that starts with `start`"
    i = text.index(start)
    return text[i:text.index('\n\n', i)]

def cost_claims(readme:str) -> list: return FIGURE.findall(_paragraph(readme, 'What it costs'))

def test_the_cost_figures_are_benchmarks():
    "Every time the README gives for what profiling costs is a figure of BENCHMARKS' first screen, as measured"
    got,ans = cost_claims(_readme()),answers()
    assert len(got) >= 3, got  # a batch, a fit without the report, a fit with it
    missing = [f for f in got if f.lstrip('+~') not in ans]
    assert not missing, f"README figures not in BENCHMARKS' answers: {missing}"

def test_a_figure_not_in_benchmarks_fails():
    "The check catches a figure the benchmarks never measured (the old claim: 2 ms a fit, whatever the report)"
    old = "What it costs, measured from outside a fit: about 0.15 ms of CPU time a training batch and 2 ms a fit.\n\nNext."
    assert [f for f in cost_claims(old) if f.lstrip('+~') not in answers()]

def test_the_demo_time_is_measured():
    "The demo's time on a 2-core CPU, as the README says it, is BENCHMARKS'"
    m = re.search(r'fastprofile demo +# [^\n]*?(\d+(?:-\d+)?) s on a 2-core CPU', _readme())
    assert m, "the README's demo line says how long the demo takes on a 2-core CPU"
    assert re.search(rf"demo[^\n]*\b{re.escape(m[1])} s\b", answers()), m[1]

def test_the_batch_measurement_budget_is_the_readme_share():
    from fastprofile.probes.batch_sizes import BUDGET
    share = re.search(r'within (\d+)% of the fit', _paragraph(_readme(), 'What it costs'))
    assert share and int(share[1]) == round(100*BUDGET[1]) and BUDGET[0] == 0, (share, BUDGET)

SCRIPT = textwrap.dedent("""
    import warnings; warnings.simplefilter('ignore')
    from fastai.test_utils import synth_learner
    from fastai.callback.progress import ProgressCallback
    import fastprofile.all
    learn = synth_learner(n_trn=8); learn.remove_cb(ProgressCallback)
    learn.profile(logger_callback=None, batch_sizes=False).fit(1)    # the report shown: into this pipe
    print('@@plain'); print(learn.simple_profile.report.plain())
""")

def test_the_widths_the_readme_gives():
    "Into a pipe the report is 80 columns wide (COLUMNS unset), `plain()` 120; COLUMNS sets the pipe's width"
    readme = _readme()
    assert 'into a pipe or a log it is plain text 80 columns wide' in readme and 'with `plain=True` 120 columns' in readme
    env = {k:v for k,v in os.environ.items() if k not in ('COLUMNS', 'FORCE_COLOR', 'TERM', 'COLORTERM')}
    for cols,width in ((None, 80), ('100', 100)):
        e = dict(env, **({'COLUMNS': cols} if cols else {}))
        r = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True, env=e, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        piped,plain = r.stdout.split('@@plain\n')
        w = max(map(len, piped.splitlines()))
        assert width - 15 <= w <= width, (cols, w)  # the table and its prose fill the width, never more
        if cols is None: assert max(map(len, plain.splitlines())) <= 120 < 2*w
