"""The paper's model families (AmoebaNet, multilingual Transformer) and inputs."""

from gpipe import lingvo_import  # pylint: disable=unused-import  # before Lingvo
