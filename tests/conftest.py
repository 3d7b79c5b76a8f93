import os, pytest, torch

# fastprofile's own failures raise in the tests instead of warning (`fastprofile.engine.core.strict_mode`)
os.environ.setdefault('FASTPROFILE_STRICT', '1')

def pytest_collection_modifyitems(config, items):
    "Drop `test_*` functions star-imported from libraries (fastcore.test); skip `cuda` tests without a GPU"
    keep = [it for it in items if getattr(getattr(it, 'function', None), '__module__', it.module.__name__) == it.module.__name__]
    items[:] = keep
    if torch.cuda.is_available(): return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if 'cuda' in item.keywords: item.add_marker(skip)
