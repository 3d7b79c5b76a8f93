"The measurement engine: the record and its statistics, clocks and CUDA events, the undo stack, input checks, tables, the `Profile` and its `Probe` protocol. No fastai."
