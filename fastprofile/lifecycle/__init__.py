"One profiled call's life: the `before_draw` event (`loop`), the `Session` that owns the call (`session`), the timing pair (`callback`)."
