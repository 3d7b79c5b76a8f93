"A stand-in for `torch.cuda`'s streams and events that logs every call, each checked against torch's real signature"
import inspect
from contextlib import contextmanager
import torch


def _check(real, *args, **kwargs):
    "Raise TypeError unless the call would bind to `real`'s signature"
    inspect.signature(real).bind(*args, **kwargs)


class FakeCudaApi:
    "`Stream`, `Event`, `current_stream` and `stream` with torch.cuda's signatures; calls go to `log` as tuples of names"
    def __init__(self):
        self.log,self.n_streams,self.n_events = [],0,0
        api = self

        class Stream:
            def __init__(s, device=None, priority=0, **kwargs):
                _check(torch.cuda.Stream.__new__, torch.cuda.Stream, device, priority, **kwargs)
                s.name,s.device = ('main' if api.n_streams == 0 else f'side{api.n_streams}'),device
                api.n_streams += 1
            def wait_event(s, event):
                _check(torch.cuda.Stream.wait_event, s, event); api.log.append(('wait_event', s.name, event.name))
            def wait_stream(s, stream):
                _check(torch.cuda.Stream.wait_stream, s, stream); api.log.append(('wait_stream', s.name, stream.name))

        class Event:
            def __init__(e, enable_timing=False, blocking=False, interprocess=False):
                _check(torch.cuda.Event.__new__, torch.cuda.Event, enable_timing, blocking, interprocess)
                e.name = f'ev{api.n_events}'; api.n_events += 1
            def record(e, stream=None):
                _check(torch.cuda.Event.record, e, stream)
                api.log.append(('record', e.name, (stream or api.cur).name))

        self.Stream,self.Event = Stream,Event
        self.main = self.cur = Stream()

    def current_stream(self, device=None):
        _check(torch.cuda.current_stream, device)
        return self.cur

    @contextmanager
    def stream(self, s):
        _check(torch.cuda.stream, s)
        prev,self.cur = self.cur,s
        self.log.append(('enter', s.name))
        try: yield
        finally:
            self.cur = prev
            self.log.append(('exit', s.name))
