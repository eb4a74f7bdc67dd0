"""Compatibility with the outside: Lingvo 0.14 on TensorFlow 2.15.

The bottom layer (beside ``gpipe.schedules``): it imports nothing of the
library outside ``compat/`` (``gpipe/__init__.py`` has the layer map).

* ``lingvo_import``: makes Lingvo 0.14 import on TensorFlow 2.15 (imported
  first by every module that uses TensorFlow or Lingvo);
* ``quiet_import``: imports TensorFlow without the CUDA-plugin noise of a
  machine without GPUs;
* ``lingvo_alias``: the same alias for Lingvo, installed lazily by
  ``import gpipe`` (which imports no TensorFlow);
* ``tf_internal``: every private TensorFlow call the library makes, each
  tested on the installed TensorFlow;
* ``lingvo_norms``: Lingvo's learner's squared norms built with Square, not
  Pow, while a graph is built (``SquareNorms``).

``lingvo_gpipe`` is a deprecated path of ``gpipe.lingvo_adapter`` (Lingvo's
GPipe layers on this executor), kept for one release.
"""
