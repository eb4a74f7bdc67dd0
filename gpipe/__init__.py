"""GPipe for Lingvo: pipeline-parallel training of sequential networks."""

from gpipe import lingvo_import  # pylint: disable=unused-import  # must be first
