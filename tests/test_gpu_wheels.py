"""The wheel set that bench/gpu/wheels.sh downloads is complete: with it, `fastprofile.all` imports (and trains) on a
machine that has only what the bare, offline CUDA machine has.

That machine (bench/README.md; the device kinds' list of "Python packages already there") has Python 3.12, torch
2.11+cu130 and ~200 packages, but no fastai and no network. The issue asks for an import "with only that folder and
the torch of a clean venv on the path". Taken literally that cannot pass: fastai needs numpy, pandas, matplotlib,
scikit-learn and more, which the GPU machine HAS and which the wheel folder therefore must NOT carry (the device tool
carries at most 64 MiB). So this test follows what the GPU machine really has: the clean venv gets torch plus
VENV_PINS, the packages of that machine that the import needs (found by trying: each one was added because the import
failed without it). The test asserts that every package in the venv is on the machine's list (GPU_HAS), so nothing
that the machine lacks can hide a missing wheel, and that no wheel carries a package the machine already has.

The check runs on this machine's Python 3.11, not 3.12: fine for the wheels, which are all pure Python
(py3-none-any, asserted below). The venv's versions are this project's venv's, not the GPU machine's (numpy 2.5 there).
A negative control (the same install without one wheel must fail to import) shows that the check is isolated from the
environment that runs pytest, which has fastai.

Real pip, real venv, real download from PyPI; needs the network to PyPI and ~1 GB of temporary disk (torch), removed
at the end. `pip install torch==2.13.0` takes this machine's local CPU wheel; never let pip resolve an unpinned torch
(it would pull GBs of CUDA packages): every install here is --no-deps and pinned.
"""
from __future__ import annotations
import json, os, re, shutil, subprocess, sys, tempfile
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]
WHEELS_SH = REPO/'bench'/'gpu'/'wheels.sh'
MAX_MIB = 40
TORCH_PIN = 'torch==2.13.0'

# The GPU machine's packages (device kinds' list, read on 2026-11-17). Carry a wheel for none of these.
GPU_HAS = set("""
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
    charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
    onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
    pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning
    pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
    typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

# What of GPU_HAS the import and a one-epoch profiled fit need, pinned to this project's venv. If the check fails with
# "No module named X": X's package is in GPU_HAS -> add it here; it is not -> add its wheel to PINS in wheels.sh.
VENV_PINS = [
    'typing-extensions==4.16.0', 'numpy==2.4.6', 'pandas==3.1.1', 'python-dateutil==4.0.0',
    'matplotlib==3.11.2', 'cycler==0.12.1', 'fonttools==4.68.0', 'kiwisolver==1.5.1', 'pyparsing==3.3.3',
    'packaging==26.3', 'pillow==13.0.0', 'rich==15.0.0', 'scipy==1.17.1', 'scikit-learn==1.9.1', 'joblib==1.6.0',
    'threadpoolctl==3.8.0', 'narwhals==2.29.0', 'requests==2.34.2', 'urllib3==2.8.0', 'idna==3.20',
    'certifi==2026.10.18', 'charset-normalizer==3.5.2', 'pyyaml==6.0.3', 'cloudpickle==3.1.2', 'psutil==7.2.2',
]

CHECK = r"""
import sys
repo, site = sys.argv[1], sys.argv[2]
import fastprofile.all
import fastprofile, fastai, fastcore, fasttransform, fastprogress, plum, beartype, torch
assert fastprofile.__file__.startswith(repo), fastprofile.__file__
for m in (fastai, fastcore, fasttransform, fastprogress, plum, beartype):
    assert m.__file__.startswith(site), f"{m.__name__} came from {m.__file__}, not from the wheel folder"
assert fastprogress.__version__ == '1.0.3', fastprogress.__version__
from fastai.test_utils import synth_learner
learn = synth_learner(n_trn=8, n_val=2)
learn.profile().fit(1)
assert learn.simple_profile_report is not None
print('CHECK OK', sys.version.split()[0], torch.__version__, fastai.__version__)
"""

def norm(name:str) -> str: return re.sub(r'[-_.]+', '-', name).lower()
GPU_HAS = {norm(n) for n in GPU_HAS}

def run(cmd, timeout=600, **env) -> subprocess.CompletedProcess:
    "Run `cmd` in this environment less what would point it at pytest's Python; fail with its output"
    env = {**{k:v for k,v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV')}, **env}
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r

def import_check(py:Path, site:Path, work:Path) -> subprocess.CompletedProcess:
    "Run CHECK with the clean venv's Python and only the repo root and `site` on PYTHONPATH"
    env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'HOME': str(work), 'LANG': 'C.UTF-8',
           'PYTHONPATH': os.pathsep.join([str(REPO), str(site)]), 'PYTHONNOUSERSITE': '1',
           'MPLBACKEND': 'Agg', 'MPLCONFIGDIR': str(work/'mpl')}
    return subprocess.run([str(py), '-c', CHECK, str(REPO), str(site)], capture_output=True, text=True, env=env,
                          cwd=work, timeout=600)

def install_target(py:Path, wheels, site:Path):
    run([py, '-m', 'pip', 'install', '-q', '--disable-pip-version-check', '--no-index', '--no-deps', '--no-compile',
         '--target', site, *wheels])

def hint(stderr:str) -> str:
    m = re.search(r"No module named '([^'.]+)", stderr)
    if not m: return ''
    mod = m.group(1); pkg = {'PIL': 'pillow', 'yaml': 'pyyaml', 'sklearn': 'scikit-learn', 'dateutil': 'python-dateutil',
                             'plum': 'plum-dispatch'}.get(mod, mod)
    return (f"\n{pkg!r} is on the GPU machine: add it, pinned, to VENV_PINS" if norm(pkg) in GPU_HAS else
            f"\n{pkg!r} is not on the GPU machine: add its wheel, pinned, to PINS in bench/gpu/wheels.sh")

@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gpu_wheel_set_is_complete():
    assert not {norm(p.split('==')[0]) for p in VENV_PINS} - GPU_HAS, "VENV_PINS may only hold the GPU machine's packages"
    work = Path(tempfile.mkdtemp(prefix='fastprofile-gpu-wheels-'))
    try:
        whl, venv, site = work/'whl', work/'venv', work/'site'
        r = run(['bash', WHEELS_SH, whl], PYTHON=sys.executable)  # needs PyPI
        assert 'MiB in' in r.stdout, r.stdout  # it reports the folder's size
        wheels = sorted(whl.glob('*.whl'))
        assert wheels, r.stdout
        names = [norm(w.name.split('-')[0]) for w in wheels]
        assert len(names) == len(set(names)), f"more than one version of a package: {names}"
        assert all(w.name.endswith('-none-any.whl') for w in wheels), "a wheel is not pure Python: check it on 3.12"
        assert not set(names) & GPU_HAS, f"carried but already on the GPU machine: {set(names) & GPU_HAS}"
        assert not [n for n in names if re.match(r'(torch|triton|nvidia|cuda)', n)], names
        assert sum(w.stat().st_size for w in wheels) < MAX_MIB * 2**20

        run([sys.executable, '-m', 'venv', venv])
        py = venv/'bin'/'python'
        run([py, '-m', 'pip', 'install', '-q', '--disable-pip-version-check', '--no-deps', '--only-binary=:all:',
             TORCH_PIN, *VENV_PINS], timeout=900)
        listed = json.loads(run([py, '-m', 'pip', 'list', '--format=json', '--disable-pip-version-check']).stdout)
        extra = {norm(d['name']) for d in listed} - GPU_HAS
        assert not extra, f"the clean venv holds packages the GPU machine lacks: {extra}"

        install_target(py, wheels, site)
        r = import_check(py, site, work)
        assert r.returncode == 0 and 'CHECK OK' in r.stdout, \
            f"fastprofile.all does not import from the wheel set:\n{r.stderr[-4000:]}{hint(r.stderr)}"

        # Negative control: the same install less one wheel must fail, so the check cannot see pytest's own
        # environment (which has fastai and fastprogress 1.1).
        install_target(py, [w for w in wheels if not w.name.startswith('fastprogress-')], work/'site-less')
        r = import_check(py, work/'site-less', work)
        assert r.returncode != 0 and "No module named 'fastprogress'" in r.stderr, \
            f"the check passed without the fastprogress wheel: it is not isolated\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
