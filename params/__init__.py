"""Registered model configurations (Lingvo's model registry)."""

from params import image  # pylint: disable=unused-import
