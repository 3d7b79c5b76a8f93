"One module per measurement, each a `Probe` of the call's session: loaders, callback costs, torch.compile, layers, telemetry, efficiency, memory snapshot, the breakdown."
