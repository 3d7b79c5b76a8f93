"The report as Jupyter shows it: a real kernel runs a profiled fit and returns the HTML table"
import re, shutil, subprocess, tempfile
from pathlib import Path
import nbformat, pytest
from nbclient import NotebookClient

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

def test_report_is_html_in_jupyter():
    nb = run_notebook(CODE)
    html = [h for h in _outputs(nb, 'text/html') if 'fastprofile-report' in h]
    assert len(html) == 1
    h = html[0]
    assert '<caption' in h and 'Simple Profiler Results' in h
    rows = re.findall(r'<tr', h)
    assert len(rows) >= 20                              # header + fit, train and valid sections
    for word in ('forward','backward','opt_step','zero_grad','predict','warmup','other','Samples/Second'): assert word in h
    assert re.search(r'\d+(\.\d+)? (µs|ms|s)<', h)      # times carry units
    assert 'Profiler overhead' in h

def test_plain_and_markdown_in_jupyter():
    nb = run_notebook(CODE.replace("logger_callback=None)", "logger_callback=None, plain=True)"),
                      "learn.profile(logger_callback=None, markdown=True).fit(1)")
    text = ''.join(o.get('text', '') for c in nb.cells for o in c.get('outputs', []) if o.get('output_type') == 'stream')
    assert 'Simple Profiler Results:' in text and '| train | draw |' in text
    assert not [h for h in _outputs(nb, 'text/html') if 'fastprofile-report' in h]

@pytest.mark.skipif(shutil.which('chromium') is None, reason='needs chromium (apt-get install chromium)')
def test_report_html_renders_in_chromium(tmp_path):
    "Headless Chromium renders the report's HTML into a PNG with the table in it"
    from fastprofile.all import ProfileRecord, FakeClock, drive_record, make_report
    clock = FakeClock(); rec = drive_record(ProfileRecord(clock=clock), clock, n_epochs=2, n_train=20, n_valid=5, bs=32)
    rec.overhead_per_batch = 8e-6
    page = tmp_path/'report.html'
    page.write_text('<html><body style="font-family:sans-serif">' + make_report(rec)._repr_html_() + '</body></html>')
    png = tmp_path/'report.png'
    subprocess.run(['chromium', '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                    '--disable-background-networking', '--disable-component-update', '--disable-sync',
                    f'--user-data-dir={tempfile.mkdtemp()}', f'--screenshot={png}', '--window-size=1300,900', page.as_uri()],
                   check=True, capture_output=True, timeout=60)
    from PIL import Image
    import numpy as np
    a = np.asarray(Image.open(png).convert('L'))
    dark_rows = (a < 128).any(axis=1).sum()
    assert dark_rows > 200        # many lines of text, not a blank page
