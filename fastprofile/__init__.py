__version__ = "0.2.0"

from .moved import install as _install
_install()  # 0.1.0's flat module paths import as the modules that hold their code now: pickles from 0.1.0 load
