"""SGLang serving images for Blackwell fleets (targets pcie / nvlink): config, Docker SDK build + push.

`python -m sglfleet.images build --target pcie|nvlink [--profile ci|production] [--push registry/repo]`.
"""

from sglfleet.images.config import TARGETS, ImageConfig, load_image_config

__all__ = ["TARGETS", "ImageConfig", "load_image_config"]
