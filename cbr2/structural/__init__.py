"""The structural retriever (the paper's Section 4.2): a question encoder fine-tuned so that the
cosine of two questions' embeddings predicts how alike their KoPL programs' function sketches are.

``labels`` (program similarity and the pair sampler), ``data`` (the Lightning data module),
``module`` (loss, model, validation metrics), ``checkpoints`` (exported retrievers) and
``train`` (the ``python train.py`` job).
"""
