"""AmoebaNet image classifiers as pipelineable layers, and image inputs."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import  # before Lingvo
