"""Compatibility with the outside: Lingvo on TensorFlow 2.15, Lingvo's GPipe.

* ``lingvo_import``: makes Lingvo 0.14 import on TensorFlow 2.15 (imported
  first by every module of the library);
* ``quiet_import``: imports TensorFlow without the CUDA-plugin noise of a
  machine without GPUs;
* ``lingvo_gpipe``: ``FromLingvo``, Lingvo's own GPipe layers and stacks on
  this library's executor, with their variable names;
* ``tf_internal``: every private TensorFlow call the library makes, each
  tested on the installed TensorFlow.
"""
