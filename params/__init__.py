"""Registered model configurations (Lingvo's model registry)."""

from params import image  # pylint: disable=unused-import
from params import mt  # pylint: disable=unused-import
from params import toy  # pylint: disable=unused-import
