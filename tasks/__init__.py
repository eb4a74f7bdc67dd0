"""The paper's model families (AmoebaNet, multilingual Transformer) and inputs."""

from gpipe.compat import lingvo_import  # pylint: disable=unused-import  # before Lingvo
