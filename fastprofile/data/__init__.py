"fastai's data path: a loader's `after_batch` timed transform by transform, pinned copies, staging the next batch on the GPU (`CudaPrefetchCallback`)."
