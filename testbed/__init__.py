"""Test beds: the netns fleet, the CPU serving image, the corruptible engine, the token registry."""

from sglfleet.paths import require_checkout

REPO_ROOT = require_checkout("the test bed")
"""The checkout the test beds belong to (they are not installed with the product)."""
