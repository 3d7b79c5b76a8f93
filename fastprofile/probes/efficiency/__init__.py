"Efficiency, one measurement in one folder: FLOP counting and peaks (`flops`), what a call measured (`facts`), the probe (`probe`), its section, summary, advice and logged scalars (`report`)."
