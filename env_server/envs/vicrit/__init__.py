"""ViCrit caption-critic environment (issue 17): find the one wrong span in a caption."""

from .env import VicritConfig, VicritEnv

__all__ = ["VicritConfig", "VicritEnv"]
