"""The Jupyter report as a person sees it: headless Chromium renders it inside JupyterLab's output styles, light and dark;
and the terminal's table, rendered by the report itself, exactly as rich's `Table` renders it.

`python tests/test_report.py docs/img/report.png [width]` renders the README's screenshot from a real fit (`fastprofile.demo`)."""
import html, io, json, re, shutil, subprocess, sys, tempfile
from pathlib import Path
import numpy as np, pytest
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.engine.tables import col_label
from rich.console import Console
from rich.text import Text

CHROMIUM = next((c for c in ('chromium', 'chromium-browser', 'google-chrome') if shutil.which(c)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason='needs chromium (apt-get install chromium)')

# JupyterLab's theme variables that the report (or the output area around it) reads: light and dark themes
THEMES = {
    'light': {'--jp-layout-color0':'white', '--jp-layout-color2':'#eeeeee', '--jp-content-font-color1':'rgba(0,0,0,.87)',
              '--jp-ui-font-color1':'rgba(0,0,0,.87)', '--jp-border-color1':'#bdbdbd', '--jp-border-color2':'#e0e0e0',
              '--jp-brand-color1':'#1976d2', '--jp-rendermime-table-row-background':'#f5f5f5',
              '--jp-rendermime-table-row-hover-background':'#e1f5fe'},
    'dark': {'--jp-layout-color0':'#111111', '--jp-layout-color2':'#424242', '--jp-content-font-color1':'rgba(255,255,255,1)',
             '--jp-ui-font-color1':'rgba(255,255,255,.87)', '--jp-border-color1':'#616161', '--jp-border-color2':'#424242',
             '--jp-brand-color1':'#2196f3', '--jp-rendermime-table-row-background':'#212121',
             '--jp-rendermime-table-row-hover-background':'rgba(3,169,244,.2)'},
}
FONTS = {'--jp-ui-font-family':"system-ui, -apple-system, 'Segoe UI', helvetica, arial, sans-serif", '--jp-ui-font-size1':'13px',
         '--jp-content-font-family':"system-ui, -apple-system, 'Segoe UI', helvetica, arial, sans-serif",
         '--jp-content-font-size1':'14px', '--jp-code-font-family':"menlo, consolas, 'DejaVu Sans Mono', monospace"}

# What JupyterLab's rendermime styles do to HTML outputs (packages/rendermime/style/base.css): the report must win over
# these (cells there may wrap, are right-aligned, padded by 0.5em, striped, and tables use a fixed layout, centred)
JUPYTERLAB_CSS = """
.jp-RenderedHTMLCommon{color:var(--jp-content-font-color1);font-family:var(--jp-content-font-family);
  font-size:var(--jp-content-font-size1);line-height:1.6;padding-right:20px}
.jp-RenderedHTMLCommon table{border-collapse:collapse;border-spacing:0;border:none;color:var(--jp-ui-font-color1);
  font-size:var(--jp-ui-font-size1);table-layout:fixed;margin-left:auto;margin-right:auto;margin-bottom:1em}
.jp-RenderedHTMLCommon thead{border-bottom:1px solid var(--jp-border-color1);vertical-align:bottom}
.jp-RenderedHTMLCommon td,.jp-RenderedHTMLCommon th,.jp-RenderedHTMLCommon tr{vertical-align:middle;padding:.5em .5em;
  line-height:normal;white-space:normal;max-width:none;border:none}
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td,:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon th,
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon tr{text-align:right}
.jp-RenderedHTMLCommon th{font-weight:bold}
.jp-RenderedHTMLCommon tbody tr:nth-child(odd){background:var(--jp-layout-color0)}
.jp-RenderedHTMLCommon tbody tr:nth-child(even){background:var(--jp-rendermime-table-row-background)}
.jp-RenderedHTMLCommon p{text-align:left;margin:0;margin-bottom:1em}
.jp-RenderedHTMLCommon ul:not(.list-inline){padding-left:2em}
.jp-RenderedHTMLCommon ul{margin-bottom:1em}
.jp-RenderedHTMLCommon pre,.jp-RenderedHTMLCommon code{border:0;background-color:var(--jp-layout-color0);
  color:var(--jp-content-font-color1);font-family:var(--jp-code-font-family);font-size:inherit;padding:0;white-space:pre-wrap}
.jp-RenderedHTMLCommon :not(pre)>code{background-color:var(--jp-layout-color2);padding:1px 5px}
"""

# Measures what a reader sees: which cells take more than one line, whether the table overflows, text contrast
MEASURE_JS = r"""
<script>
function rgba(s){const m=s.match(/[\d.]+/g).map(Number);return [m[0],m[1],m[2],m.length>3?m[3]:1];}
function over(c,b){return [0,1,2].map(i=>c[i]*c[3]+b[i]*(1-c[3]));}
function lum(c){const f=v=>{v/=255;return v<=.03928?v/12.92:Math.pow((v+.055)/1.055,2.4);};return .2126*f(c[0])+.7152*f(c[1])+.0722*f(c[2]);}
function contrast(a,b){const x=lum(a),y=lum(b);return (Math.max(x,y)+.05)/(Math.min(x,y)+.05);}
function background(el){  // the colour behind `el`: the first opaque background up the tree, translucent ones over it
  const layers=[];for(let e=el;e;e=e.parentElement){const c=rgba(getComputedStyle(e).backgroundColor);if(c[3]>0)layers.push(c);if(c[3]>=1)break;}
  let b=[255,255,255];for(const c of layers.reverse())b=over(c,b);return b;}
function opacity(el){let o=1;for(let e=el;e;e=e.parentElement)o*=Number(getComputedStyle(e).opacity);return o;}
window.addEventListener('load',()=>{
  const rep=document.querySelector('.fastprofile-report');
  const lines=el=>{  // lines of text in `el`: its text nodes' boxes, those that overlap vertically counted as one line
    const w=document.createTreeWalker(el,NodeFilter.SHOW_TEXT),boxes=[];
    while(w.nextNode()){const r=document.createRange();r.selectNodeContents(w.currentNode);boxes.push(...r.getClientRects());}
    const seen=[];for(const b of boxes){if(!seen.some(s=>b.top<s.bottom-1&&b.bottom>s.top+1))seen.push(b);}return seen.length;};
  const cells=[...rep.querySelectorAll('td,th')];
  const wrapped=cells.filter(c=>lines(c)>1).map(c=>c.textContent);
  const low=[];
  for(const el of rep.querySelectorAll('*')){
    if(el.closest('.fp-na,style,script'))continue;  // the '-' of a value that does not exist is meant to recede
    const own=[...el.childNodes].some(n=>n.nodeType===3&&n.textContent.trim());if(!own)continue;
    const c=rgba(getComputedStyle(el).color);c[3]*=opacity(el);const b=background(el);
    const r=contrast(over(c,b),b);if(r<4.5)low.push([el.textContent.trim().slice(0,40),+r.toFixed(2)]);}
  const scroll=rep.querySelector('.fp-scroll')||rep.parentElement;
  const out=document.createElement('pre');out.id='fp-measure';
  out.textContent=JSON.stringify({cells:cells.length,wrapped,low,height:document.documentElement.scrollHeight,
    tableWidth:rep.querySelector('table').getBoundingClientRect().width,scrollWidth:scroll.scrollWidth,clientWidth:scroll.clientWidth,
    visible:[...rep.querySelectorAll('thead th')].filter(th=>th.getBoundingClientRect().right<=scroll.getBoundingClientRect().right+.5).map(th=>th.textContent),
    rowHeights:[...new Set([...rep.querySelectorAll('tbody tr:not(.fp-phase)')].map(r=>Math.round(r.getBoundingClientRect().height)))]});
  document.body.appendChild(out);});
</script>"""

def jupyter_page(fragment:str, theme:str='light', measure:bool=True) -> str:
    "`fragment` as JupyterLab shows an output: themed page, 64 px prompt, the rendermime styles"
    vars_ = ';'.join(f'{k}:{v}' for k,v in {**FONTS, **THEMES[theme]}.items())
    return (f'<!doctype html><html><head><meta charset="utf-8"><style>:root{{{vars_}}}'
            'body{margin:0;background:var(--jp-layout-color0)}'
            '.jp-Cell{display:flex;padding:10px 10px 10px 5px}'
            '.jp-OutputPrompt{flex:0 0 64px;color:#bf5b3d;font-family:var(--jp-code-font-family);font-size:13px;text-align:right;padding:5px 8px 0 0;box-sizing:border-box}'
            '.jp-OutputArea-output{flex:1 1 auto;min-width:0;overflow-x:auto;padding-top:5px}'
            f'{JUPYTERLAB_CSS}</style></head><body><div class="jp-Cell"><div class="jp-OutputPrompt">[1]:</div>'
            f'<div class="jp-OutputArea-output jp-RenderedHTMLCommon jp-RenderedHTML">{fragment}</div></div>'
            + (MEASURE_JS if measure else '') + '</body></html>')

def _chromium(page:Path, *args, width:int=960, height:int=900) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', '--no-first-run',
                           '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic',
                           f'--user-data-dir={tempfile.mkdtemp()}', f'--window-size={width},{height}', *args, page.as_uri()],
                          check=True, capture_output=True, timeout=120, text=True)

def measure(fragment:str, theme:str='light', width:int=960, tmp=None) -> dict:
    "What Chromium's layout of `fragment` in a JupyterLab page `width` px wide says (see `MEASURE_JS`)"
    page = Path(tmp or tempfile.mkdtemp())/f'report-{theme}.html'
    page.write_text(jupyter_page(fragment, theme), encoding='utf-8')
    out = _chromium(page, '--dump-dom', width=width).stdout
    return json.loads(html.unescape(re.search(r'<pre id="fp-measure">(.*?)</pre>', out, re.S)[1]))

def screenshot(fragment:str, png, theme:str='light', width:int=960):
    "Render `fragment` in a JupyterLab page `width` px wide into `png`, as tall as the page"
    png = Path(png); tmp = Path(tempfile.mkdtemp())
    h = measure(fragment, theme, width, tmp)['height']
    page = tmp/'shot.html'; page.write_text(jupyter_page(fragment, theme, measure=False), encoding='utf-8')
    _chromium(page, f'--screenshot={png.resolve()}', '--run-all-compositor-stages-before-draw', width=width, height=h)
    return png

def real_report():
    "The report of a real profiled fit (diagnosis and efficiency sections), and the same with the extra columns of a GPU run"
    learn = synth_learner(n_trn=16, n_val=4)  # synth_dbunch batches of 16: 16 train and 4 valid batches
    learn.profile(show_report=False, logger_callback=None, efficiency=True, peak_flops=1e12).fit(1)
    rep = learn.simple_profile_report
    assert rep.section('Diagnosis') is not None and rep.section('Efficiency') is not None
    res = rep.results.copy()
    res['GPU Mean Duration'] = res['Mean Duration']*.7; res['GPU Total Time'] = res['Total Time']*.7
    res['FLOP/s'] = np.where(res.Step.isin(['forward','backward']), 3.21e12, np.nan)  # as `fastprofile.probes.efficiency.probe` counts it
    return rep, ProfileReport(res, rep.notes, rep.sections)

@pytest.fixture(scope='module')
def reports(): return real_report()

@needs_chromium
@pytest.mark.parametrize('theme', ['light','dark'])
def test_no_cell_wraps_at_960px(reports, theme, tmp_path):
    "In a 960 px JupyterLab page no table cell takes two lines, in either theme, with or without GPU columns"
    for rep in reports:
        m = measure(rep._repr_html_(), theme, 960, tmp_path)
        assert m['cells'] >= 8*len(rep.results), m['cells']
        assert m['wrapped'] == [], m['wrapped']
        assert max(m['rowHeights']) < 1.3*min(m['rowHeights']), m['rowHeights']   # every row one line high
        # the core columns are in view; what does not fit (percentiles...) scrolls sideways in the report's own box
        assert m['visible'][:7] == ['', 'Mean', 'Std\xa0Dev', 'Calls', 'Samples/s', 'Total', '%\xa0of\xa0Fit'], m['visible']

@needs_chromium
def test_narrow_notebook_scrolls_instead_of_wrapping(reports, tmp_path):
    m = measure(reports[1]._repr_html_(), 'light', 500, tmp_path)
    assert m['wrapped'] == [] and m['scrollWidth'] > m['clientWidth'], m

@needs_chromium
@pytest.mark.parametrize('theme', ['light','dark'])
def test_text_is_readable_in_both_themes(reports, theme, tmp_path):
    "Every piece of text keeps a contrast of at least 4.5:1 (WCAG AA) against what is behind it"
    m = measure(reports[0]._repr_html_(), theme, 960, tmp_path)
    assert m['low'] == [], m['low']

@needs_chromium
def test_screenshot_has_the_table_bars_and_verdict(reports, tmp_path):
    from PIL import Image
    png = screenshot(reports[0]._repr_html_(), tmp_path/'report.png')
    a = np.asarray(Image.open(png).convert('RGB')).astype(int)
    assert a.shape[1] == 960 and a.shape[0] > 500
    dark = (a.sum(axis=2) < 300).any(axis=1).sum()
    assert dark > 250                                       # many lines of text, not a blank page
    blue = (abs(a - np.array([0x19, 0x76, 0xd2])).sum(axis=2) < 40).sum()
    assert blue > 100                                       # the share bars (and the verdict's rule) are drawn

def test_one_vocabulary(reports):
    "Every rendered form uses the same labels; the results keep fastxtend's names"
    rep = reports[0]
    labels = ['Mean','Std Dev','Calls','Samples/s','Total','% of Fit']
    html = rep._repr_html_()
    hdr = lambda txt: next(l for l in txt.splitlines() if 'Mean' in l and 'Calls' in l)
    for text in (hdr(rep.plain()), hdr(rep.plain(80)), hdr(rep.markdown()), ' | '.join(rep.formatted().columns)):
        for l in labels: assert l in text, (l, text)
        for old in ('Mean Duration','Percent of Total','Samples/Second','Number of Calls'): assert old not in text
    for l in labels: assert f'<th>{l.replace(" ", "&nbsp;")}</th>' in html
    assert 'Mean Duration' in rep.results and 'Percent of Total' in rep.results

def test_piped_output_keeps_the_core_columns(reports, tmp_path):
    "A real `print` of the report through rich into a pipe (80 columns, no colour), in a subprocess"
    import pickle
    f = tmp_path/'rep.pkl'; f.write_bytes(pickle.dumps(reports[1]))
    code = f"import pickle; from rich.console import Console; Console().print(pickle.load(open({str(f)!r}, 'rb')))"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                         env={k:v for k,v in __import__('os').environ.items() if k not in ('COLUMNS','LINES')}).stdout
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80 and '…' not in out and '\x1b[' not in out
    hdr = next(l for l in lines if 'Mean' in l)
    for l in ['Mean','Std Dev','Calls','Samples/s','Total','% of Fit']: assert l in hdr
    # what is left out (how much fits depends on how wide this run's numbers are) is said, and is never a core column
    shown = [col_label(c) for c in reports[1].columns[3:] if re.search(rf'(^|  ){re.escape(col_label(c))}($|  )', hdr)]
    left = [col_label(c) for c in reports[1].columns[3:] if col_label(c) not in shown]
    assert left and set(left) <= {'P50','P90','P99','Min','Max','GPU Mean','GPU Total','FLOP/s'}, (shown, left)
    assert f"Left out to fit 80 columns: {', '.join(left)} (" in ' '.join(out.split())   # (a note may wrap)
    assert any(l.startswith('    backward') for l in lines) and 'Diagnosis:' in out

class _AsciiIO(io.StringIO):
    encoding = 'ascii'  # a console that cannot write box-drawing characters: rich swaps the table's rules for ASCII ones

CONSOLES = {'truecolor': dict(force_terminal=True, color_system='truecolor'), 'standard': dict(force_terminal=True, color_system='standard'),
            'pipe': dict(color_system=None), 'ascii': dict(force_terminal=True, color_system='256', file=_AsciiIO()),
            'windows': dict(force_terminal=True, color_system='windows', legacy_windows=True)}

def _segments(renderable, width:int, **kw) -> list:
    con = Console(**{'file': io.StringIO(), **kw}, width=width)
    return list(con.render(renderable, con.options))

def _odd(rep):
    "`rep` with names rich reads as markup and an emoji code: its table is left to rich's `Table`"
    res = rep.results.copy()
    res['Step'] = res['Step'].where(res['Step'] == '', '[bold]x[/bold] :smile:')
    return ProfileReport(res, rep.notes, rep.sections)

@pytest.mark.parametrize('plain', [False, True])
@pytest.mark.parametrize('console', list(CONSOLES))
def test_the_table_renders_as_richs_table(reports, plain, console):
    "The report's table gives exactly the segments of rich's `Table` (its renderer before), at every width, in every console"
    for rep in (*reports, _odd(reports[0])):
        for w in (20, 45, 60, 80, 100, 120, 160, 250):
            t = rep._text(w, plain)[1]
            assert _segments(t, w, **CONSOLES[console]) == _segments(t.table(), w, **CONSOLES[console]), (console, w)
    # the report's own renderer ran where the table fits and its cells are plain text; rich's `Table` where they are not
    assert reports[0]._text(250, plain)[1].fast and reports[0]._text(250, plain)[1].width <= 250
    assert not _odd(reports[0])._text(250, plain)[1].fast

def test_piped_report_is_its_plain_text(reports):
    "Into a pipe the report is `plain(width)` as rich prints it as one `Text` (its renderer before), wide characters and tabs too"
    res = reports[0].results.copy()
    res['Step'] = res['Step'].where(res['Step'] == '', '前向き計算')  # two cells a character: rich may wrap these lines
    odd = ProfileReport(res, reports[0].notes, [Section('Tabs', ['a\tb', 'a plain line'])])
    for rep in (*reports, odd):
        for w in (40, 80, 120, 200):
            p = rep.plain(w)
            if max(map(len, p.splitlines())) > w: continue  # not even the core columns fit: the table folds instead
            got,want = Console(file=io.StringIO(), width=w),Console(file=io.StringIO(), width=w)
            got.print(rep); want.print(Text(p))
            assert got.file.getvalue() == want.file.getvalue(), w

if __name__ == '__main__':  # the README's screenshot: a page wide enough to show every column (at 960 px the last ones scroll)
    from fastprofile.demo import make_demo_learner
    out = Path(sys.argv[1] if len(sys.argv) > 1 else 'docs/img/report.png')
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 1100
    learn = make_demo_learner()
    learn.profile(show_report=False, logger_callback=None).fit(1)
    print(screenshot(learn.simple_profile_report._repr_html_(), out, width=width))
