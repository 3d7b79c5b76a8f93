"Telemetry, one measurement in one folder: what a call measured (`facts`), the sampler and its probe (`probe`), its section, summary and logged scalars (`report`)."
# 0.2.0 kept it all in `fastprofile.probes.telemetry`: pickles and code that name it there keep working
from .facts import *
from .probe import *
