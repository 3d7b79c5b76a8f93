"Where a profile goes: Weights & Biases, TensorBoard, JSON files (`ProfileResult.save`, `load_profile`)."
