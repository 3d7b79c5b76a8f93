"The report as Jupyter shows it: a real kernel runs a profiled fit and returns HTML (or markdown, or text)"
import re
import nbformat, pytest
from nbclient import NotebookClient
from test_report import needs_chromium, measure

CODE = """
from fastprofile.all import *
from fastai.test_utils import synth_learner
learn = synth_learner(n_trn=12, n_val=3)
learn.profile(logger_callback=None).fit(1)
"""

def run_notebook(*cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name='python3').execute()
    return nb

def _outputs(nb, mime):
    return [o['data'][mime] for c in nb.cells for o in c.get('outputs', []) if mime in o.get('data', {})]

@pytest.fixture(scope='module')
def html_report():
    html = [h for h in _outputs(run_notebook(CODE), 'text/html') if 'fastprofile-report' in h]
    assert len(html) == 1
    return html[0]

def test_report_is_html_in_jupyter(html_report):
    h = html_report
    assert '<caption>Simple Profiler Results</caption>' in h and '<style>' in h
    assert len(re.findall(r'<tr', h)) >= 23                # header, 3 phase headings, the fit, train and valid rows
    for word in ('forward','backward','opt_step','zero_grad','predict','warmup','other','Samples/s','%&nbsp;of&nbsp;Fit'):
        assert word in h, word
    assert 'Mean Duration' not in h and 'Percent of Total' not in h   # the labels, not the DataFrame's names
    assert re.search(r'\d<span class="fp-u">&nbsp;(µs|ms|s)</span>', h)   # times carry units, set apart
    assert 'Timing: wall clock' in h
    # the diagnosis is a block of its own: verdict first, code as <code>, no literal backticks anywhere
    assert re.search(r'<div class="fp-title">Diagnosis</div>(<p class="fp-warn">Busy machine: .*?</p>)?<p class="fp-headline">Bound by ', h)  # a busy machine above it
    assert '<code>' in h and '`' not in h

@needs_chromium
def test_jupyter_html_does_not_wrap_at_960px(html_report, tmp_path):
    "The HTML the kernel sent, laid out by Chromium in a JupyterLab page 960 px wide: no cell on two lines"
    for theme in ('light', 'dark'):
        m = measure(html_report, theme, 960, tmp_path)
        assert m['cells'] > 200 and m['wrapped'] == [] and m['low'] == [], m

def test_plain_and_markdown_in_jupyter():
    nb = run_notebook(CODE.replace("logger_callback=None)", "logger_callback=None, plain=True)"),
                      "learn.profile(logger_callback=None, markdown=True).fit(1)")
    text = ''.join(o.get('text', '') for o in nb.cells[0].get('outputs', []) if o.get('output_type') == 'stream')
    assert 'Simple Profiler Results\n' in text and '    backward' in text and max(map(len, text.splitlines())) <= 120
    md = [m for m in _outputs(nb, 'text/markdown') if 'Simple Profiler Results' in m]   # displayed as markdown, not printed
    assert len(md) == 1 and '| train | draw |' in md[0] and '| Phase | Action | Step | Mean | Std Dev |' in md[0]
    assert '| train | draw |' not in ''.join(o.get('text', '') for o in nb.cells[1].get('outputs', []))
    assert not [h for h in _outputs(nb, 'text/html') if 'fastprofile-report' in h]
