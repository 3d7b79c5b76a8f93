"A tiny language model on fastai's `LMDataLoader`: batches of token ids, for the Tokens/s tests"
import torch
from torch import nn
from fastai.basics import DataLoaders, Learner, CrossEntropyLossFlat, set_seed
from fastai.text.data import LMDataLoader

BS,SL = 8,12  # every batch full: `BS` rows of `SL` tokens

class TinyLM(nn.Module):
    def __init__(self, vocab=60, d=16): super().__init__(); self.emb,self.rnn,self.head = nn.Embedding(vocab, d),nn.GRU(d, d, batch_first=True),nn.Linear(d, vocab)
    def forward(self, x): return self.head(self.rnn(self.emb(x))[0])

def lm_learner(n_trn=6, n_val=2, cbs=None):
    "A language model on fastai's `LMDataLoader`: every batch full (`BS` rows of `SL` tokens)"
    set_seed(0)
    stream = lambda n: [torch.randint(2, 60, (BS*SL*n + 1,))]
    dls = DataLoaders(LMDataLoader(stream(n_trn), bs=BS, seq_len=SL), LMDataLoader(stream(n_val), bs=BS, seq_len=SL))
    return Learner(dls, TinyLM(), loss_func=CrossEntropyLossFlat(), cbs=cbs)
