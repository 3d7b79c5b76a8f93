"The `fastprofile` command: refusals before training, outputs reported only when written, exit statuses"
import contextlib, io, subprocess, sys
from pathlib import Path
import pytest, torch
from fastprofile import __version__
from fastprofile.cli import main, parser, check_args, demo

SMALL = ['--epochs', '1', '--n-train', '64', '--size', '16', '--bs', '32', '--plain']

FASTPROFILE = Path(sys.executable).parent/'fastprofile'  # the console script `pip install` made

def _run(*argv):
    return subprocess.run([str(FASTPROFILE), *argv], capture_output=True, text=True, timeout=300)

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_one_line_and_exit_2():
    r = _run('demo', '--device', 'cuda', *SMALL)
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and 'has 0 CUDA device(s)' in r.stderr

def test_bad_output_paths_are_refused_before_training(tmp_path):
    (tmp_path/'file').write_text('')
    for argv,msg in ((['--csv', str(tmp_path/'missing'/'r.csv')], 'does not exist'),
                     (['--plot', str(tmp_path/'file'/'p.png')], 'is a file, not a folder'),
                     (['--trace', str(tmp_path/'t.txt')], 'must end in .json'),
                     (['--plot', str(tmp_path/'p.gif')], 'must end in .png'),
                     (['--csv', '/sys/r.csv'], 'is not writable')):
        r = _run('demo', *SMALL, *argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert r.stdout == ''                               # nothing was trained (the demo prints as it starts)
        assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr and 'Traceback' not in r.stderr, r.stderr

def test_version():
    r = _run('--version')
    assert r.returncode == 0 and r.stdout.strip() == f'fastprofile {__version__}'

def test_outputs_saved_and_a_failed_one_is_not_reported_as_saved(tmp_path):
    "Every output is written and reported; one that cannot be written (its path became a folder during training) is not, and the status is 1"
    r = _run('demo', *SMALL, '--csv', str(tmp_path/'r.csv'), '--plot', str(tmp_path/'p.png'), '--trace', str(tmp_path/'t.json'))
    assert r.returncode == 0, r.stderr
    assert all(f'saved: {tmp_path/n}' in r.stdout for n in ('r.csv', 'p.png', 't.json'))
    assert all((tmp_path/n).stat().st_size > 0 for n in ('r.csv', 'p.png', 't.json'))
    args = check_args(parser().parse_args(['demo', *SMALL, '--csv', str(tmp_path/'again.csv')]))
    (tmp_path/'again.csv').mkdir()  # the disk changed under the run: the CSV can no longer be written
    out,err = io.StringIO(),io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): learn,ok = demo(args)
    assert not ok and 'results saved' not in out.getvalue() and 'could not save the results' in err.getvalue()
