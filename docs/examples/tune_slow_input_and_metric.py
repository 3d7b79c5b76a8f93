"The README's tune example: the learner of slow_input_and_metric.py (items that take 1 ms to build, loaded in the main process; a metric that costs 20 ms per validation batch), tuned and kept, then compared with itself before. Run: python docs/examples/tune_slow_input_and_metric.py"
from fastai.basics import *
from fastprofile.all import *
from slow_input_and_metric import make_learner  # the same learner (this folder is on the path when run as a script)

learn = make_learner()
with learn.no_bar(): learn.profile(logger_callback=None, show_report=False).fit_one_cycle(2, 1e-3)
learn.simple_profile.save('before.json')
res = learn.tune(apply=True, progress=False)                 # measure each change, keep the best, measured together
print(res.report.plain())
with learn.no_bar(): learn.profile(logger_callback=None, show_report=False).fit_one_cycle(2, 1e-3)
print(compare('before.json', learn, names=('before', 'tuned'), rows='main').plain())
