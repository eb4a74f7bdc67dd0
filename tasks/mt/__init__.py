"""The paper's multilingual Transformer: layers, inputs, vocabulary, task."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import  # before Lingvo
