"Telemetry, one measurement in one folder: the sampler and its probe (`probe`), its section, summary and logged scalars (`report`)."
from .probe import *  # 0.2.0 kept it all in `fastprofile.probes.telemetry`: pickles and code that name it there keep working
